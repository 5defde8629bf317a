// The last lines a process logged, kept in memory so an operator can read a daemon's log through
// its RPC service (Agent.Logs, Controller.Logs) without a shell on the node. Bounded by lines and
// bytes; when full the oldest lines are dropped. Every line gets a sequence number (1, 2, ... in
// append order, never reused), so a follower asks for "lines after S" and learns how many it
// missed when the ring rotated past it.
//
// InitLogging (common/logging.h) feeds ProcessLogRing() every line the process logger writes to
// stderr, formatted the same way. Thread-safe: any number of appenders and readers.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace glm {

struct LogRingLimits {
  size_t max_lines = 10000;
  size_t max_bytes = 4 << 20;  // sum of the held lines' text sizes
};

class LogRing {
 public:
  struct Line {
    int64_t seq = 0;
    std::string text;
  };
  // Lines in seq order, no gaps between them.
  struct Slice {
    std::vector<Line> lines;
    // Lines the caller asked for that the ring no longer holds (they come just before
    // lines.front(), or before the next line to arrive when `lines` is empty).
    int64_t dropped_before = 0;
    // The last seq this slice covers (returned or counted as dropped): pass it to WaitAfter to
    // continue without a gap or a repeat.
    int64_t resume_after = 0;
  };

  explicit LogRing(LogRingLimits limits = {});

  // Appends one line (a trailing newline is stripped; a line longer than max_bytes is cut to
  // it), drops the oldest lines while over a limit, wakes every WaitAfter. Returns its seq.
  int64_t Append(std::string_view text);

  // The last `n` lines (all held lines when fewer). dropped_before: how many of those `n` the ring
  // no longer holds.
  Slice Tail(size_t n) const;

  // Lines with seq > `after` (at most `max_lines`, the oldest first). When there is none yet,
  // waits up to `timeout` for one; returns an empty slice when none came. Callers loop with a
  // short timeout so they can notice their own cancellation in between.
  Slice WaitAfter(int64_t after, std::chrono::milliseconds timeout,
                  size_t max_lines = std::numeric_limits<size_t>::max()) const;

  // Seq of the newest line; 0 before the first.
  int64_t last_seq() const;
  // Lines dropped (rotated out) since the ring was made.
  int64_t dropped() const;
  size_t size() const;
  size_t bytes() const;
  const LogRingLimits& limits() const { return limits_; }

 private:
  // Lines with seq > after, up to max_lines; caller holds mu_.
  Slice AfterLocked(int64_t after, size_t max_lines) const;

  const LogRingLimits limits_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<Line> lines_;  // seq lines_.front().seq .. last_seq_, contiguous
  size_t bytes_ = 0;
  int64_t last_seq_ = 0;
  int64_t dropped_ = 0;
};

// The ring of this process (default limits), fed by the logger InitLogging configures. Never
// destroyed.
LogRing& ProcessLogRing();

inline constexpr int64_t kDefaultLogTailLines = 200;

// What a Logs RPC asks of a ring.
struct LogStreamRequest {
  int64_t tail_lines = 0;  // 0: kDefaultLogTailLines; more than the ring's max_lines: max_lines
  bool follow = false;
  std::chrono::milliseconds poll{200};  // longest wait between two `stop` checks
};

// Serves a Logs RPC from `ring`: the last lines, then with `follow` every new line in order until
// `write` returns false (the reader went away) or `stop` returns true (the caller cancelled, the
// daemon shuts down). `write(line, dropped_before)`: dropped_before as in Slice, for that line.
void StreamLogRing(const LogRing& ring, const LogStreamRequest& request,
                   const std::function<bool(const LogRing::Line&, int64_t dropped_before)>& write,
                   const std::function<bool()>& stop);

}  // namespace glm
