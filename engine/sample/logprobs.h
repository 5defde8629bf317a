// Raw logprobs of one logits row, as OpenAI's `logprobs` / `top_logprobs` report them (vLLM's
// default "raw_logprobs"): log_softmax of the model's logits for that position, before
// temperature, top-k / top-p and min_tokens masking.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace glm::engine {

struct TokenLogprobs {
  float logprob = 0.0f;  // of the sampled token
  // The k most likely tokens (id, logprob): logprob descending, ties lower id first.
  std::vector<std::pair<int32_t, float>> top;
};

// log_softmax(logits)[token] and the `k` most likely entries (k clamped to [0, vocab]), with the
// arithmetic of kernels/sample_rule.h LogProbHost (the rule of Backend::Sample's out_logprobs;
// the CPU backend's bits exactly): fp32 in and out, logprob = x - m - log(sum exp(x - m)) in
// double, m the row's max. NaN and -inf logits get -inf and stay out of the sum; in a row whose
// max is +inf the +inf entries get 0 and the rest -inf. `token` outside the row gives NaN. Pure
// function, thread-safe.
TokenLogprobs ComputeLogprobs(absl::Span<const float> logits, int32_t token, int k);

}  // namespace glm::engine
