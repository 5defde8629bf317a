#include "common/clock.h"

#include "gtest/gtest.h"

namespace glm {
namespace {

TEST(Clock, FakeClockMovesOnlyWhenAdvanced) {
  FakeClock clock;
  auto t0 = clock.Now();
  EXPECT_EQ(clock.Now(), t0);
  clock.Advance(std::chrono::seconds(3));
  EXPECT_EQ(clock.Now() - t0, std::chrono::seconds(3));
}

TEST(Clock, RealClockIsMonotonic) {
  auto a = Clock::Real()->Now();
  auto b = Clock::Real()->Now();
  EXPECT_LE(a, b);
}

}  // namespace
}  // namespace glm
