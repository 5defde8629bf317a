// Time source injected into everything that waits or measures, so tests fire timers by hand
// instead of sleeping.
#pragma once

#include <chrono>
#include <mutex>

namespace glm {

// Monotonic clock. Implementations are thread-safe.
class Clock {
 public:
  using Duration = std::chrono::nanoseconds;
  using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;

  // The process-wide real clock (std::chrono::steady_clock). Never null, never destroyed.
  static Clock* Real();
};

// A clock that only moves when told to. Thread-safe.
class FakeClock : public Clock {
 public:
  TimePoint Now() const override;
  void Advance(Duration d);

 private:
  mutable std::mutex mu_;
  TimePoint now_{Duration(1'000'000'000)};
};

}  // namespace glm
