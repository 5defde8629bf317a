#include "common/log_ring.h"

#include <algorithm>

namespace glm {

LogRing::LogRing(LogRingLimits limits) : limits_(limits) {}

int64_t LogRing::Append(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  if (text.size() > limits_.max_bytes) text = text.substr(0, limits_.max_bytes);
  int64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = ++last_seq_;
    lines_.push_back({seq, std::string(text)});
    bytes_ += text.size();
    while (!lines_.empty() && (lines_.size() > limits_.max_lines || bytes_ > limits_.max_bytes)) {
      bytes_ -= lines_.front().text.size();
      lines_.pop_front();
      ++dropped_;
    }
  }
  cv_.notify_all();
  return seq;
}

LogRing::Slice LogRing::Tail(size_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t want = static_cast<int64_t>(std::min<size_t>(n, static_cast<size_t>(last_seq_)));
  return AfterLocked(last_seq_ - want, std::numeric_limits<size_t>::max());
}

LogRing::Slice LogRing::WaitAfter(int64_t after, std::chrono::milliseconds timeout,
                                  size_t max_lines) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return last_seq_ > after; });
  return AfterLocked(after, max_lines);
}

LogRing::Slice LogRing::AfterLocked(int64_t after, size_t max_lines) const {
  Slice out;
  after = std::max<int64_t>(after, 0);
  out.resume_after = after;
  if (after >= last_seq_) return out;
  // Held lines: first_seq .. last_seq_ (first_seq = last_seq_ + 1 when empty).
  int64_t first_seq = lines_.empty() ? last_seq_ + 1 : lines_.front().seq;
  int64_t begin = std::max(after + 1, first_seq);
  out.dropped_before = begin - (after + 1);
  size_t index = static_cast<size_t>(begin - first_seq);
  for (; index < lines_.size() && out.lines.size() < max_lines; ++index) {
    out.lines.push_back(lines_[index]);
  }
  out.resume_after = out.lines.empty() ? begin - 1 : out.lines.back().seq;
  return out;
}

int64_t LogRing::last_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_seq_;
}

int64_t LogRing::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

size_t LogRing::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lines_.size();
}

size_t LogRing::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

LogRing& ProcessLogRing() {
  static LogRing* const ring = new LogRing();
  return *ring;
}

void StreamLogRing(const LogRing& ring, const LogStreamRequest& request,
                   const std::function<bool(const LogRing::Line&, int64_t dropped_before)>& write,
                   const std::function<bool()>& stop) {
  // Bounded batches so a reader far behind never copies the whole ring at once.
  constexpr size_t kBatch = 1000;
  int64_t tail = request.tail_lines > 0 ? request.tail_lines : kDefaultLogTailLines;
  tail = std::min<int64_t>(tail, static_cast<int64_t>(ring.limits().max_lines));
  auto send = [&](const LogRing::Slice& slice) {
    for (size_t i = 0; i < slice.lines.size(); ++i) {
      if (!write(slice.lines[i], i == 0 ? slice.dropped_before : 0)) return false;
    }
    return true;
  };
  LogRing::Slice slice = ring.Tail(static_cast<size_t>(tail));
  if (!send(slice)) return;
  int64_t after = slice.resume_after;
  while (request.follow && !stop()) {
    slice = ring.WaitAfter(after, request.poll, kBatch);
    if (!send(slice)) return;
    after = slice.resume_after;
  }
}

}  // namespace glm
