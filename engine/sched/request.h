// What a caller submits to the engine and what it gets back, token by token.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/sample/sampling_params.h"

namespace glm::engine {

struct Request {
  std::vector<int32_t> prompt_ids;  // [num_prompt_tokens], >= 1 token, each in [0, vocab_size)
  SamplingParams sampling;
  // Deliver logits for every prompt position in the first TokenEvent. Such a request never takes
  // prefix-cache hits (every prompt position is computed).
  bool return_prompt_logits = false;
};

// One event of a request's stream. Every stream ends with exactly one event whose `finished` is
// true; a token-carrying event may be that last one.
struct TokenEvent {
  int32_t token_id = -1;  // -1 when the event carries no token (abort, error)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  absl::Status error;  // set when finish_reason == kError
  // First event only, when Request::return_prompt_logits: [num_prompt_tokens, vocab_size].
  std::vector<float> prompt_logits;
  // Token events of a request with SamplingParams::logprobs = k (engine/sample/logprobs.h): the
  // raw log_softmax of the row token_id was drawn from, at token_id, and the k most likely
  // (id, logprob), logprob descending, ties lower id first. Untouched otherwise.
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

}  // namespace glm::engine
