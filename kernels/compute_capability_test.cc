// The capability refusals (compute_capability.h) on capabilities written by hand: no GPU needed.
#include "kernels/compute_capability.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace glm::kernels {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(RequireComputeCapabilityTest, AcceptsEqualAndNewer) {
  EXPECT_TRUE(RequireComputeCapability("Op", {8, 0}, {8, 0}, "x").ok());
  EXPECT_TRUE(RequireComputeCapability("Op", {8, 6}, {8, 0}, "x").ok());
  EXPECT_TRUE(RequireComputeCapability("Op", {9, 0}, {8, 9}, "x").ok());
  EXPECT_TRUE(RequireComputeCapability("Op", {12, 1}, {9, 0}, "x").ok());
}

TEST(RequireComputeCapabilityTest, RefusesOlderNamingOpDeviceAndNeed) {
  const absl::Status s = RequireComputeCapability("GemvQuant", {7, 5}, {8, 0}, "bf16 mma.sync");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("GemvQuant"), HasSubstr("bf16 mma.sync"),
                                 HasSubstr("8.0 or newer"), HasSubstr("this device is 7.5")));
  EXPECT_EQ(RequireComputeCapability("Op", {8, 6}, {9, 0}, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RequireComputeCapability("Op", {8, 0}, {8, 9}, "x").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(Fp4MmaSupportTest, OnlyComputeCapability12xWithItsArchSpecificCode) {
  EXPECT_TRUE(Fp4MmaSupport("GemvQuant", {12, 0}, true).ok());
  EXPECT_TRUE(Fp4MmaSupport("GemvQuant", {12, 1}, true).ok());
  for (const ComputeCapability cc :
       {ComputeCapability{8, 0}, ComputeCapability{8, 9}, ComputeCapability{9, 0},
        ComputeCapability{10, 0}, ComputeCapability{12, 2}, ComputeCapability{13, 0}}) {
    const absl::Status s = Fp4MmaSupport("GemvQuant", cc, true);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << cc.major << "." << cc.minor;
    EXPECT_THAT(s.message(), AllOf(HasSubstr("GemvQuant"), HasSubstr("12.0 or 12.1")));
  }
}

TEST(Fp4MmaSupportTest, A800NamesTheOpItsCapabilityAndTheDefaultPath) {
  const absl::Status s = Fp4MmaSupport("GemvQuant", {8, 0}, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("GemvQuant"), HasSubstr("this device is 8.0"),
                                 HasSubstr("kWidenBf16")));
}

TEST(Fp4MmaSupportTest, BuildWithoutTheArchSpecificCodeSaysWhichArchToAdd) {
  const absl::Status s121 = Fp4MmaSupport("GemvQuant", {12, 1}, false);
  EXPECT_EQ(s121.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s121.message(), AllOf(HasSubstr("GemvQuant"), HasSubstr("sm_121a"),
                                    HasSubstr("CMAKE_CUDA_ARCHITECTURES containing 121a")));
  EXPECT_THAT(Fp4MmaSupport("GemvQuant", {12, 0}, false).message(), HasSubstr("120a"));
}

}  // namespace
}  // namespace glm::kernels
