#include "common/human_bytes.h"

#include "gtest/gtest.h"

namespace glm {
namespace {

TEST(HumanBytesTest, PicksTheUnitWithThreeSignificantDigits) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(-5), "-5 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(37LL * 1024 * 1024 + 300 * 1024), "37.3 MiB");
  EXPECT_EQ(HumanBytes(3LL << 30), "3.00 GiB");
  EXPECT_EQ(HumanBytes(742LL << 30), "742 GiB");
  EXPECT_EQ(HumanBytes(5LL << 50), "5.00 PiB");
}

}  // namespace
}  // namespace glm
