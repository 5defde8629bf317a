// Per-request sampling parameters and the request-facing finish reasons.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace glm::engine {

// The most alternatives a request may ask for (SamplingParams::logprobs, OpenAI top_logprobs).
inline constexpr int kMaxLogprobs = 20;

struct SamplingParams {
  // 0 (or below 1e-5) = greedy argmax (ties: lowest token id). Otherwise logits / temperature.
  float temperature = 0.0f;
  float top_p = 1.0f;  // (0, 1]: keep the smallest set of most likely tokens with mass >= top_p
  int top_k = 0;       // 0 = off; else keep the k most likely tokens (ties: lower id first)
  // Seed of the request's random stream. The draw for generated token i is a pure function of
  // (seed, i), so output depends on neither batching, preemption nor speculative decoding.
  // Unset: the engine picks one.
  std::optional<uint64_t> seed;
  int max_tokens = 16;                  // generated tokens, >= 1
  int min_tokens = 0;                   // stop tokens (and EOS) are masked until this many
  std::vector<int32_t> stop_token_ids;  // finish on any of these (the token is emitted)
  bool ignore_eos = false;              // do not stop on the model's eos_token_ids
  // Unset: off. k in [0, kMaxLogprobs]: every token event carries the sampled token's raw
  // logprob and the k most likely alternatives (engine/sample/logprobs.h).
  std::optional<int> logprobs;
  // MTP drafts per step for this request, at most the engine's mtp_draft_tokens (the scheduler
  // refuses more); 0 drafts nothing for it. Unset: the engine's. Output is the same either way.
  std::optional<int> num_draft_tokens;
};

enum class FinishReason { kNone, kStop, kLength, kAborted, kError };
std::string_view FinishReasonName(FinishReason reason);

// Checks ranges (logprobs in [0, kMaxLogprobs]); `vocab_size` bounds stop_token_ids. The
// message names the field and the fix.
absl::Status ValidateSamplingParams(const SamplingParams& params, int64_t vocab_size);

}  // namespace glm::engine
