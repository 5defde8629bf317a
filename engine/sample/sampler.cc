#include "engine/sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/sample_rule.h"

namespace glm::engine {
namespace {

constexpr float kGreedyTemperature = sample_rule::kGreedyTemperature;

}  // namespace

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAborted: return "aborted";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

absl::Status ValidateSamplingParams(const SamplingParams& p, int64_t vocab_size) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling temperature ", p.temperature, " is invalid: use a value >= 0"));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling top_p ", p.top_p, " is outside (0, 1]: use e.g. 0.95, or 1 for off"));
  }
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling top_k ", p.top_k, " is negative: use 0 for off or k >= 1"));
  }
  if (p.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling max_tokens ", p.max_tokens, " must be >= 1"));
  }
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("sampling min_tokens ", p.min_tokens,
                                                   " must be in [0, max_tokens=", p.max_tokens, "]"));
  }
  if (p.logprobs.has_value() && (*p.logprobs < 0 || *p.logprobs > kMaxLogprobs)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling logprobs ", *p.logprobs, " is outside [0, ", kMaxLogprobs,
        "]: ask for at most ", kMaxLogprobs, " alternatives (0 = the sampled token's only)"));
  }
  for (int32_t t : p.stop_token_ids) {
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("stop token id ", t, " is outside [0, ",
                                                     vocab_size, ") (the model's vocab_size)"));
    }
  }
  return absl::OkStatus();
}

double UniformDraw(uint64_t seed, int64_t index) {
  return static_cast<double>(sample_rule::DrawBits(seed, index)) * 0x1.0p-53;
}

bool IsGreedy(const SamplingParams& p) {
  return p.temperature <= kGreedyTemperature || p.top_k == 1;
}

int32_t ArgMax(absl::Span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& params, uint64_t seed,
                    int64_t output_index, absl::Span<const int32_t> banned) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  std::vector<float> masked;
  if (!banned.empty()) {
    masked.assign(logits.begin(), logits.end());
    int64_t num_banned = 0;
    for (int32_t t : banned) {
      if (t >= 0 && t < vocab && masked[t] != -std::numeric_limits<float>::infinity()) {
        masked[t] = -std::numeric_limits<float>::infinity();
        ++num_banned;
      }
    }
    if (num_banned < vocab) logits = masked;
  }
  // The rule shared with the CPU backend's Sample op and the CUDA kernel (kernels/sample.h).
  return sample_rule::SampleRowHost(logits.data(), vocab, params.temperature, params.top_k,
                                    params.top_p, seed, output_index);
}

}  // namespace glm::engine
