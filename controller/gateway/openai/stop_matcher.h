// User `stop` strings on streamed text (OpenAI semantics): output ends at the first occurrence
// of any stop string, which is not included. Text that could still turn into a stop string (a
// suffix that is a prefix of one) is held back until the next Feed decides it.
//
// "First" is the match that starts earliest in the whole text (at one position, the shortest,
// which completes first); a complete match is reported only once no stop string starting earlier can still
// complete, so the result is the same however the text is split into Feeds (vLLM's per-token
// check can differ for overlapping stop strings such as "abcd" and "c").
//
// Feed the visible text (after the OutputParser, or the raw completion text); call Flush at the
// end of output and check stopped() after it (a deferred match may complete there). Not
// thread-safe: one per request.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace glm::openai {

class StopMatcher {
 public:
  // Empty strings in `stops` are ignored (the request parser rejects them anyway).
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;      // releasable text, stop string excluded
    bool stopped = false;  // a stop string matched; later Feeds return nothing
  };
  Result Feed(std::string_view text);
  // End of output: returns the held-back text up to the first match, if any (stopped() then
  // turns true), else all of it.
  std::string Flush();

  bool stopped() const { return stopped_; }
  // The stop string that matched ("" before a match): vLLM's `stop_reason`.
  const std::string& matched() const { return matched_; }

 private:
  struct Match {
    size_t at = 0;
    const std::string* stop = nullptr;  // nullptr: no complete match in held_
  };
  Match FirstMatch() const;
  size_t FirstPendingStart() const;  // held_.size() when no suffix can start a stop string

  std::vector<std::string> stops_;
  size_t max_stop_len_ = 0;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace glm::openai
