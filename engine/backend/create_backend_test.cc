// CreateBackend: kinds, "auto" resolution, and a clear error for cuda where it cannot work.
#include "engine/backend/create_backend.h"

#include <gtest/gtest.h>

namespace glm::engine {
namespace {

TEST(CreateBackend, CpuAlwaysWorks) {
  auto b = CreateBackend("cpu", 2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), "cpu");
  EXPECT_TRUE((*b)->status().ok());
}

// Narrow Linear weights (bf16, fp8 block-scaled) run on the cpu backend too, with the cuda
// backend's numerics (engine/backend/cpu/cpu_narrow.h), so --dtype bf16|auto works everywhere.
TEST(CreateBackend, EveryBackendTakesNarrowWeights) {
  for (const char* kind : {"cpu", "auto"}) {
    auto b = CreateBackend(kind, 1);
    ASSERT_TRUE(b.ok()) << kind << ": " << b.status();
    for (WeightDType d : {WeightDType::kF32, WeightDType::kBF16, WeightDType::kF8E4M3Block128}) {
      EXPECT_TRUE((*b)->SupportsWeightDType(d)) << kind << " " << static_cast<int>(d);
    }
  }
}

TEST(CreateBackend, AutoPicksCudaOnlyWhereAvailable) {
  const bool cuda = CudaBackendAvailable().ok();
  EXPECT_EQ(ResolveBackendKind("auto"), cuda ? "cuda" : "cpu");
  EXPECT_EQ(ResolveBackendKind("cpu"), "cpu");
  auto b = CreateBackend("auto", 2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), cuda ? "cuda" : "cpu");
}

TEST(CreateBackend, CudaWithoutDeviceIsAClearError) {
  const absl::Status avail = CudaBackendAvailable();
  if (avail.ok()) GTEST_SKIP() << "a CUDA device is present; the error path is not reachable";
  auto b = CreateBackend("cuda", 2);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find("cpu backend"), absl::string_view::npos) << b.status();
}

TEST(CreateBackend, UnknownKindIsInvalid) {
  auto b = CreateBackend("tpu", 2);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("cpu|cuda|auto"), absl::string_view::npos);
}

}  // namespace
}  // namespace glm::engine
