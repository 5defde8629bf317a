#include "controller/gateway/openai/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace glm::openai {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& stop : stops) {
    if (stop.empty()) continue;
    max_stop_len_ = std::max(max_stop_len_, stop.size());
    stops_.push_back(std::move(stop));
  }
}

StopMatcher::Match StopMatcher::FirstMatch() const {
  Match first;
  for (const std::string& stop : stops_) {
    size_t at = held_.find(stop);
    if (at == std::string::npos) continue;
    if (first.stop == nullptr || at < first.at ||
        (at == first.at && stop.size() < first.stop->size())) {
      first = {at, &stop};
    }
  }
  return first;
}

size_t StopMatcher::FirstPendingStart() const {
  size_t window = std::min(held_.size(), max_stop_len_ == 0 ? 0 : max_stop_len_ - 1);
  for (size_t q = held_.size() - window; q < held_.size(); ++q) {
    std::string_view tail = std::string_view(held_).substr(q);
    bool prefix = std::any_of(stops_.begin(), stops_.end(), [&](const std::string& stop) {
      return stop.size() > tail.size() && std::string_view(stop).substr(0, tail.size()) == tail;
    });
    if (prefix) return q;
  }
  return held_.size();
}

StopMatcher::Result StopMatcher::Feed(std::string_view text) {
  Result result;
  if (stopped_) return result;
  held_.append(text);
  Match match = FirstMatch();
  size_t pending = FirstPendingStart();
  if (match.stop != nullptr && match.at <= pending) {
    // No stop string that starts earlier can still complete: this one is the first.
    result.text = held_.substr(0, match.at);
    result.stopped = true;
    stopped_ = true;
    matched_ = *match.stop;
    held_.clear();
    return result;
  }
  // Release what no stop string can reach; keep from the earliest possible start.
  size_t release = match.stop != nullptr ? std::min(pending, match.at) : pending;
  result.text = held_.substr(0, release);
  held_.erase(0, release);
  return result;
}

std::string StopMatcher::Flush() {
  if (stopped_) return std::string();
  std::string rest;
  if (Match match = FirstMatch(); match.stop != nullptr) {
    rest = held_.substr(0, match.at);
    stopped_ = true;
    matched_ = *match.stop;
  } else {
    rest = std::move(held_);
  }
  held_.clear();
  return rest;
}

}  // namespace glm::openai
