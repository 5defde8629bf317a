#include "engine/sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace glm::engine {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr float kGreedyTemperature = 1e-5f;

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
  for (int32_t t : p.stop_token_ids) {
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("stop token id ", t, " is outside [0, ",
                                                     vocab_size, ") (the model's vocab_size)"));
    }
  }
  return absl::OkStatus();
}

double UniformDraw(uint64_t seed, int64_t index) {
  const uint64_t x = SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(index));
  return static_cast<double>(x >> 11) * 0x1.0p-53;
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
  if (IsGreedy(params)) return ArgMax(logits);

  // Candidates ordered by probability descending, id ascending (the documented order).
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int64_t keep = vocab;
  if (params.top_k > 0 && params.top_k < vocab) {
    keep = params.top_k;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), better);
  } else {
    std::sort(order.begin(), order.end(), better);
  }
  const double inv_t = 1.0 / params.temperature;
  const double max_logit = logits[order[0]];
  std::vector<double> probs(keep);
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((static_cast<double>(logits[order[i]]) - max_logit) * inv_t);
    total += probs[i];
  }
  if (params.top_p < 1.0f) {
    double mass = 0.0;
    int64_t n = 0;
    while (n < keep) {
      mass += probs[n] / total;
      ++n;
      if (mass >= params.top_p) break;
    }
    keep = n;
    total = 0.0;
    for (int64_t i = 0; i < keep; ++i) total += probs[i];
  }
  const double u = UniformDraw(seed, output_index) * total;
  double acc = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace glm::engine
