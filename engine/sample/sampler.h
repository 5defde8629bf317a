// Token selection from one row of logits: greedy, temperature, top-k, top-p, seeded draws.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "engine/sample/sampling_params.h"

namespace glm::engine {

// Uniform double in [0, 1) for draw number `index` of stream `seed` (SplitMix64 of both): a
// counter-based generator, so the value never depends on what other requests did.
double UniformDraw(uint64_t seed, int64_t index);

// Picks a token from `logits` [vocab_size]. `output_index` is the number of tokens the request
// has generated before this one (selects the random draw). `banned` token ids get -inf (min_tokens
// masking); when every token is banned the mask is ignored. Pure function, thread-safe.
//
// Greedy when temperature <= 1e-5 or top_k == 1 (or every logit is -inf/NaN): the largest logit,
// ties to the lowest id; NaN counts as below -inf (a NaN row gives id 0). Otherwise p = softmax(logits / temperature) restricted
// to the top_k most likely tokens, then to the smallest most-likely-first prefix whose mass reaches
// top_p (at least one token), renormalised; the token is the inverse CDF of draw (seed,
// output_index) in that order (probability descending, id ascending). The exact arithmetic
// (integer weights, 2^-24 top_p units, which tokens are too unlikely to draw) is the rule in
// kernels/sample_rule.h, shared with the CPU backend's Sample op and the CUDA kernel, so every
// backend picks the same token from the same logits.
int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& params, uint64_t seed,
                    int64_t output_index, absl::Span<const int32_t> banned = {});

// Argmax with ties to the lowest id (the greedy choice).
int32_t ArgMax(absl::Span<const float> logits);

bool IsGreedy(const SamplingParams& params);

}  // namespace glm::engine
