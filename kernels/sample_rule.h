// The sampling rule shared by the host reference (engine/sample, the CPU backend's Sample op)
// and the CUDA kernel (kernels/sample.cuh). Plain C++ that also compiles as CUDA device code.
//
// The rule, per row of logits l[vocab] with (temperature T, top_k, top_p, seed, index):
//  - key(l): a uint32 that orders logits (larger logit -> larger key); NaN maps to 0, below -inf.
//    Candidates are ordered by key descending, then id ascending (the engine/sample order).
//  - Greedy when T <= 1e-5 or top_k == 1, or when the largest logit is -inf/NaN: the first id of
//    the largest key.
//  - Else each token gets an integer weight q = round(exp((l - max) / T) * 2^kWeightBits), computed
//    by DetExp below with IEEE double operations and explicit FMAs only, so host and device get
//    the same bits. Tokens with exp(...) < 2^-41 (relative to the most likely) get q = 0 and are
//    never drawn. Integer masses make every sum exact and order-free (no atomics-order or
//    summation-order effects), so a row's token does not depend on the batch or the backend.
//  - top-k: keep the first min(top_k, vocab) tokens of the order (0 = off).
//  - top-p: with total = sum of kept q and P = round(top_p * 2^24), keep the shortest prefix whose
//    mass reaches max(1, ceil(total * P / 2^24)) (off when top_p >= 1).
//  - Draw: u = SplitMix64(SplitMix64(seed) ^ index) >> 11 (53 bits, engine/sample UniformDraw);
//    r = floor(u * mass / 2^53); the token is the first of the order whose cumulative q > r.
// Limits: vocab < 2^22 (so masses fit 64 bits with kWeightBits = 40).
#pragma once

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__CUDACC__)
#define GLM_SAMPLE_HD __host__ __device__ __forceinline__
#else
#define GLM_SAMPLE_HD inline
#endif

namespace glm::sample_rule {

#if !defined(__CUDA_ARCH__)
__extension__ typedef unsigned __int128 U128;
#endif

inline constexpr int kWeightBits = 40;
inline constexpr int kTopPBits = 24;
inline constexpr int64_t kMaxVocab = int64_t{1} << 22;
inline constexpr float kGreedyTemperature = 1e-5f;  // engine/sample IsGreedy

GLM_SAMPLE_HD uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// 53 random bits for draw `index` of stream `seed`.
GLM_SAMPLE_HD uint64_t DrawBits(uint64_t seed, int64_t index) {
  return SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(index)) >> 11;
}

GLM_SAMPLE_HD uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

GLM_SAMPLE_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// Order-preserving key; every NaN -> 0 (below -inf's key 0x007fffff).
GLM_SAMPLE_HD uint32_t Key(float x) {
  const uint32_t u = FloatBits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

GLM_SAMPLE_HD float KeyToFloat(uint32_t key) {
  return BitsFloat((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

inline constexpr uint32_t kNegInfKey = 0x007fffffu;  // Key(-inf)

// exp(x) for x <= 0, bit-identical on host and device: range reduction by ln 2 and a degree-13
// Taylor polynomial in Horner form, every multiply-add an explicit fma (so -ffp-contract or
// nvcc's fmad cannot change the bits). Relative error < 1e-15. Returns 0 below -745.
GLM_SAMPLE_HD double DetExp(double x) {
  if (!(x > -745.0)) return 0.0;
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  const double kd = x * kLog2e;
#if defined(__CUDA_ARCH__)
  const double n = rint(kd);
  double r = fma(-n, kLn2Hi, x);
  r = fma(-n, kLn2Lo, r);
#else
  const double n = std::nearbyint(kd);
  double r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
#endif
  constexpr double c[14] = {1.0,
                            1.0,
                            1.0 / 2,
                            1.0 / 6,
                            1.0 / 24,
                            1.0 / 120,
                            1.0 / 720,
                            1.0 / 5040,
                            1.0 / 40320,
                            1.0 / 362880,
                            1.0 / 3628800,
                            1.0 / 39916800,
                            1.0 / 479001600,
                            1.0 / 6227020800.0};
  double p = c[13];
  for (int i = 12; i >= 0; --i) {
#if defined(__CUDA_ARCH__)
    p = fma(p, r, c[i]);
#else
    p = std::fma(p, r, c[i]);
#endif
  }
#if defined(__CUDA_ARCH__)
  return scalbn(p, static_cast<int>(n));
#else
  return std::scalbn(p, static_cast<int>(n));
#endif
}

// Per-row constants of the rule.
struct RowParams {
  double inv_t = 1.0;    // 1 / temperature
  double max_logit = 0;  // the largest logit (finite or +inf)
};

// Integer weight of logit `l` (see the rule above). `l` must not be above max_logit.
GLM_SAMPLE_HD uint64_t Weight(float l, const RowParams& p) {
  if (Key(l) <= kNegInfKey) return 0;  // NaN, -inf
  if (static_cast<double>(l) == p.max_logit) return uint64_t{1} << kWeightBits;
  const double d = static_cast<double>(l) - p.max_logit;  // exact; -inf when max is +inf
  const double x = d * p.inv_t;
  if (!(x > -30.0)) return 0;  // exp(-30) * 2^40 < 0.5 (also catches -inf, NaN)
  const double e = DetExp(x) * 1099511627776.0;  // * 2^40, exact
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(floor(e + 0.5));
#else
  return static_cast<uint64_t>(std::floor(e + 0.5));
#endif
}

// floor(a * b / 2^shift) and ceil(...), exact; results must fit 64 bits.
GLM_SAMPLE_HD uint64_t MulShiftFloor(uint64_t a, uint64_t b, int shift) {
#if defined(__CUDA_ARCH__)
  const uint64_t hi = __umul64hi(a, b), lo = a * b;
  return shift == 0 ? lo : (lo >> shift) | (hi << (64 - shift));
#else
  return static_cast<uint64_t>((static_cast<U128>(a) * b) >> shift);
#endif
}

GLM_SAMPLE_HD uint64_t MulShiftCeil(uint64_t a, uint64_t b, int shift) {
  const uint64_t f = MulShiftFloor(a, b, shift);
#if defined(__CUDA_ARCH__)
  const uint64_t lo = a * b;
#else
  const uint64_t lo = static_cast<uint64_t>(static_cast<U128>(a) * b);
#endif
  const uint64_t mask = (uint64_t{1} << shift) - 1;
  return f + ((lo & mask) != 0 ? 1 : 0);
}

// top_p in 2^-24 units.
GLM_SAMPLE_HD uint64_t TopPUnits(float top_p) {
  return static_cast<uint64_t>(top_p * 16777216.0f + 0.5f);
}

// The mass the top-p prefix must reach: max(1, ceil(total * P / 2^24)).
GLM_SAMPLE_HD uint64_t TopPTarget(uint64_t total, float top_p) {
  const uint64_t t = MulShiftCeil(total, TopPUnits(top_p), kTopPBits);
  return t < 1 ? 1 : t;
}

// The cumulative mass the drawn token's prefix must reach: r + 1, r = floor(u * mass / 2^53).
GLM_SAMPLE_HD uint64_t DrawTarget(uint64_t mass, uint64_t seed, int64_t index) {
  return MulShiftFloor(DrawBits(seed, index), mass, 53) + 1;
}

GLM_SAMPLE_HD bool IsGreedy(float temperature, int32_t top_k) {
  return !(temperature > kGreedyTemperature) || top_k == 1;
}

// The host implementation of the rule: the reference the kernel is tested against, used by
// engine/sample SampleToken and the CPU backend's Sample op. O(vocab) plus a sort of the tokens
// with q > 0 (top_k off) or of the top_k tokens. Host code (also parsed, not run, under nvcc).
inline int32_t SampleRowHost(const float* logits, int64_t vocab, float temperature, int32_t top_k,
                             float top_p, uint64_t seed, int64_t index) {
  int32_t best = 0;
  uint32_t best_key = Key(logits[0]);
  for (int64_t i = 1; i < vocab; ++i) {
    const uint32_t k = Key(logits[i]);
    if (k > best_key) {
      best_key = k;
      best = static_cast<int32_t>(i);
    }
  }
  if (IsGreedy(temperature, top_k) || best_key <= kNegInfKey) return best;
  RowParams rp;
  rp.inv_t = 1.0 / static_cast<double>(temperature);
  rp.max_logit = static_cast<double>(logits[best]);
  struct Cand {
    uint32_t key;
    int32_t id;
  };
  auto before = [](const Cand& a, const Cand& b) {
    return a.key > b.key || (a.key == b.key && a.id < b.id);
  };
  std::vector<Cand> cands;
  if (top_k > 0 && top_k < vocab) {
    cands.resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) cands[i] = {Key(logits[i]), static_cast<int32_t>(i)};
    std::nth_element(cands.begin(), cands.begin() + (top_k - 1), cands.end(), before);
    cands.resize(static_cast<size_t>(top_k));
  } else {
    // Tokens with q = 0 add no mass and are never drawn: leave them out.
    for (int64_t i = 0; i < vocab; ++i) {
      if (Weight(logits[i], rp) > 0) cands.push_back({Key(logits[i]), static_cast<int32_t>(i)});
    }
  }
  std::sort(cands.begin(), cands.end(), before);
  std::vector<uint64_t> q(cands.size());
  uint64_t mass = 0;
  for (size_t i = 0; i < cands.size(); ++i) {
    q[i] = Weight(logits[cands[i].id], rp);
    mass += q[i];
  }
  size_t n = cands.size();
  if (top_p < 1.0f) {
    const uint64_t target = TopPTarget(mass, top_p);
    uint64_t cum = 0;
    for (n = 0; n < cands.size() && cum < target; ++n) cum += q[n];
    mass = cum;
  }
  const uint64_t target = DrawTarget(mass, seed, index);
  uint64_t cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += q[i];
    if (cum >= target) return cands[i].id;
  }
  return cands[n - 1].id;  // unreachable: target <= mass
}

// log softmax(logits)[id]: the model's own log-probability of the token (before temperature and
// truncation). -inf when it is NaN/-inf; 0 for a +inf logit at the maximum.
inline float LogProbHost(const float* logits, int64_t vocab, int32_t id) {
  uint32_t best_key = 0;
  for (int64_t i = 0; i < vocab; ++i) best_key = Key(logits[i]) > best_key ? Key(logits[i]) : best_key;
  const double l = logits[id];
  if (best_key <= kNegInfKey || Key(logits[id]) <= kNegInfKey) return -INFINITY;
  const double m = KeyToFloat(best_key);
  if (std::isinf(m)) return l == m ? 0.0f : -INFINITY;
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (Key(logits[i]) > kNegInfKey) sum += std::exp(static_cast<double>(logits[i]) - m);
  }
  return static_cast<float>(l - m - std::log(sum));
}

}  // namespace glm::sample_rule
