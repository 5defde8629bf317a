#include "engine/sample/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/sample_rule.h"

namespace glm::engine {
namespace {

using sample_rule::Key;
using sample_rule::kNegInfKey;

// Id a ranks before id b: the larger key (the larger logit; NaN lowest), then the lower id.
bool Before(uint32_t key_a, int32_t a, uint32_t key_b, int32_t b) {
  return key_a != key_b ? key_a > key_b : a < b;
}

}  // namespace

TokenLogprobs ComputeLogprobs(absl::Span<const float> logits, int32_t token, int k) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  // The arithmetic of sample_rule::LogProbHost (the backends' Sample out_logprobs), with the
  // max and the sum computed once for the token and its alternatives.
  uint32_t best_key = 0;
  for (float x : logits) best_key = std::max(best_key, Key(x));
  const bool any_finite_or_inf = best_key > kNegInfKey;
  const double m = any_finite_or_inf ? sample_rule::KeyToFloat(best_key) : 0.0;
  double log_sum = 0.0;
  if (any_finite_or_inf && !std::isinf(m)) {
    double sum = 0.0;
    for (float x : logits) {
      if (Key(x) > kNegInfKey) sum += std::exp(static_cast<double>(x) - m);
    }
    log_sum = std::log(sum);
  }
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  auto logprob = [&](float x) -> float {
    if (!any_finite_or_inf || Key(x) <= kNegInfKey) return kNegInf;
    const double l = x;
    if (std::isinf(m)) return l == m ? 0.0f : kNegInf;
    return static_cast<float>(l - m - log_sum);
  };

  TokenLogprobs out;
  out.logprob = token >= 0 && token < vocab ? logprob(logits[token])
                                            : std::numeric_limits<float>::quiet_NaN();
  k = static_cast<int>(std::clamp<int64_t>(k, 0, vocab));
  if (k == 0) return out;
  // One pass keeping the best k ids in order (k <= kMaxLogprobs: most entries are rejected by
  // one comparison with the current k-th).
  std::vector<int32_t> best;
  best.reserve(k + 1);
  for (int32_t i = 0; i < vocab; ++i) {
    const uint32_t key = Key(logits[i]);
    if (static_cast<int>(best.size()) == k &&
        !Before(key, i, Key(logits[best.back()]), best.back())) {
      continue;
    }
    auto at = std::upper_bound(best.begin(), best.end(), i, [&](int32_t a, int32_t b) {
      return Before(Key(logits[a]), a, Key(logits[b]), b);
    });
    best.insert(at, i);
    if (static_cast<int>(best.size()) > k) best.pop_back();
  }
  out.top.reserve(k);
  for (int32_t id : best) out.top.emplace_back(id, logprob(logits[id]));
  // Distinct logits may round to one logprob (and NaN and -inf both give -inf): the order is the
  // one stated on the values.
  std::stable_sort(out.top.begin(), out.top.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  return out;
}

}  // namespace glm::engine
