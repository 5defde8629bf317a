#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/cpu_kv_fp8.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <utility>
#include <vector>

#include "engine/backend/cpu/cpu_narrow.h"

// The 8-wide vector helpers below are inlined into the target_clones kernels; their ABI never
// crosses a call boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace glm::engine {
namespace {

class HostBuffer : public Buffer {
 public:
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded);
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, 0, rounded);
  }
  ~HostBuffer() override { std::free(data_); }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// 8-wide fp32 vectors through GCC vector extensions: native ymm in the AVX2 clone, two xmm
// halves in the baseline x86-64 clone.
typedef float v8f __attribute__((vector_size(32)));

#if defined(__clang__)
// clang refuses to pass a 256-bit vector by value to or from a function in the baseline clone
// (no AVX), inlined or not, so there the helpers take no vector by value: an unaligned load
// expression and a sum through a reference. Same arithmetic as the functions below.
typedef float v8f_unaligned __attribute__((vector_size(32), aligned(4), may_alias));
#define Load8(p) (*reinterpret_cast<const v8f_unaligned*>(p))

inline float HorizontalSum(const v8f& v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
#else
inline v8f Load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float HorizontalSum(v8f v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
#endif

// out[i * 2 + j] = x[i] . w[j] over k < K for 4 x rows and 2 w rows (callers pad missing rows by
// repeating a valid pointer and drop those results).
__attribute__((target_clones("arch=haswell", "default")))
void DotTile4x2(const float* x0, const float* x1, const float* x2, const float* x3,
                const float* w0, const float* w1, int64_t K, float* out) {
  v8f a00 = {}, a01 = {}, a10 = {}, a11 = {}, a20 = {}, a21 = {}, a30 = {}, a31 = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    v8f b0 = Load8(w0 + k), b1 = Load8(w1 + k);
    v8f x = Load8(x0 + k);
    a00 += x * b0;
    a01 += x * b1;
    x = Load8(x1 + k);
    a10 += x * b0;
    a11 += x * b1;
    x = Load8(x2 + k);
    a20 += x * b0;
    a21 += x * b1;
    x = Load8(x3 + k);
    a30 += x * b0;
    a31 += x * b1;
  }
  float r[8] = {HorizontalSum(a00), HorizontalSum(a01), HorizontalSum(a10), HorizontalSum(a11),
                HorizontalSum(a20), HorizontalSum(a21), HorizontalSum(a30), HorizontalSum(a31)};
  for (; k < K; ++k) {
    r[0] += x0[k] * w0[k];
    r[1] += x0[k] * w1[k];
    r[2] += x1[k] * w0[k];
    r[3] += x1[k] * w1[k];
    r[4] += x2[k] * w0[k];
    r[5] += x2[k] * w1[k];
    r[6] += x3[k] * w0[k];
    r[7] += x3[k] * w1[k];
  }
  std::memcpy(out, r, sizeof(r));
}

__attribute__((target_clones("arch=haswell", "default")))
float Dot(const float* a, const float* b, int64_t n) {
  v8f acc0 = {}, acc1 = {};
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    acc0 += Load8(a + k) * Load8(b + k);
    acc1 += Load8(a + k + 8) * Load8(b + k + 8);
  }
  for (; k + 8 <= n; k += 8) acc0 += Load8(a + k) * Load8(b + k);
  float s = HorizontalSum(acc0 + acc1);
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
}

// y += a * x over n elements.
__attribute__((target_clones("arch=haswell", "default")))
void Axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// out[j] = x . w[j] for 4 w rows (single-row path: decode, remainders).
__attribute__((target_clones("arch=haswell", "default")))
void DotTile1x4(const float* x, const float* w0, const float* w1, const float* w2,
                const float* w3, int64_t K, float* out) {
  v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const v8f xv = Load8(x + k);
    a0 += xv * Load8(w0 + k);
    a1 += xv * Load8(w1 + k);
    a2 += xv * Load8(w2 + k);
    a3 += xv * Load8(w3 + k);
  }
  float r[4] = {HorizontalSum(a0), HorizontalSum(a1), HorizontalSum(a2), HorizontalSum(a3)};
  for (; k < K; ++k) {
    r[0] += x[k] * w0[k];
    r[1] += x[k] * w1[k];
    r[2] += x[k] * w2[k];
    r[3] += x[k] * w3[k];
  }
  std::memcpy(out, r, sizeof(r));
}

inline void Store(float* y, float v, bool accumulate) {
  if (accumulate) {
    *y += v;
  } else {
    *y = v;
  }
}

// Single-threaded y[M, N] (+)= x[M, K] . w[N, K]^T on output rows [m0, m1) x cols [n0, n1).
// Groups of 4 x rows use the 4x2 tile; leftover rows the 1x4 tile. Missing rows of a tile are
// padded by repeating a valid row and their results dropped.
void LinearBlock(const MatView& x, const MatView& w, const MatView& y, bool accumulate,
                 int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int64_t K = x.cols;
  float r[8];
  int64_t m = m0;
  for (; m + 4 <= m1; m += 4) {
    for (int64_t n = n0; n < n1; n += 2) {
      const int64_t nr = std::min<int64_t>(2, n1 - n);
      DotTile4x2(x.Row(m), x.Row(m + 1), x.Row(m + 2), x.Row(m + 3), w.Row(n),
                 w.Row(n + nr - 1), K, r);
      for (int64_t i = 0; i < 4; ++i) {
        for (int64_t j = 0; j < nr; ++j) Store(y.Row(m + i) + n + j, r[i * 2 + j], accumulate);
      }
    }
  }
  for (; m < m1; ++m) {
    for (int64_t n = n0; n < n1; n += 4) {
      const int64_t nr = std::min<int64_t>(4, n1 - n);
      const float* wr[4];
      for (int j = 0; j < 4; ++j) wr[j] = w.Row(n + std::min<int64_t>(j, nr - 1));
      DotTile1x4(x.Row(m), wr[0], wr[1], wr[2], wr[3], K, r);
      for (int64_t j = 0; j < nr; ++j) Store(y.Row(m) + n + j, r[j], accumulate);
    }
  }
}

// Items per ParallelFor chunk so that a chunk carries at least ~64K multiply-adds: waking the
// workers costs tens of microseconds, more than a tiny model's whole op.
int64_t MinChunk(int64_t work_per_item) {
  constexpr int64_t kMinWorkPerChunk = 1 << 16;
  return std::max<int64_t>(1, kMinWorkPerChunk / std::max<int64_t>(1, work_per_item));
}

// Strict order "a before b": larger score first, then lower index.
struct ScoreIndexGreater {
  const float* score;
  bool operator()(int32_t a, int32_t b) const {
    if (score[a] != score[b]) return score[a] > score[b];
    return a < b;
  }
};

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(int num_threads) {
  return std::make_unique<CpuBackend>(num_threads);
}

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {}

std::unique_ptr<Buffer> CpuBackend::Allocate(size_t bytes) {
  return std::make_unique<HostBuffer>(bytes);
}

void CpuBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuBackend::Linear(const MatView& x, const MatView& w, const MatView& y, bool accumulate) {
  const int64_t M = x.rows, N = w.rows;
  if (M == 0 || N == 0) return;
  if (w.dtype != WeightDType::kF32) {  // bf16 / fp8: x rounded like the weight (backend.h)
    cpu::NarrowLinear(pool_, x, w, y, accumulate, cpu::NarrowX::kLikeWeight, &LinearBlock);
    return;
  }
  // Tiles of 16 x rows by 32 w rows; ~2 * 16 * 32 * K flops each.
  constexpr int64_t kTileM = 16, kTileN = 32;
  const int64_t tiles_m = (M + kTileM - 1) / kTileM;
  const int64_t tiles_n = (N + kTileN - 1) / kTileN;
  const int64_t min_tiles =
      MinChunk(x.cols * std::min(M, kTileM) * std::min(N, kTileN));
  pool_.ParallelFor(tiles_m * tiles_n, min_tiles, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t tn = t % tiles_n, tm = t / tiles_n;
      LinearBlock(x, w, y, accumulate, tm * kTileM, std::min(M, (tm + 1) * kTileM), tn * kTileN,
                  std::min(N, (tn + 1) * kTileN));
    }
  });
}

void CpuBackend::LinearPerHead(const HeadsView& x, const float* weights,
                               int64_t weight_head_stride, int64_t w_ld, const HeadsView& y) {
  for (int64_t h = 0; h < x.heads; ++h) {
    MatView w{const_cast<float*>(weights) + h * weight_head_stride, y.dim, x.dim, w_ld};
    Linear(x.Head(h), w, y.Head(h), /*accumulate=*/false);
  }
}

void CpuBackend::AbsorbPerHead(const HeadsView& x, const MatView& w, int64_t head_rows,
                               int64_t row_begin, PerHeadContract contract, const HeadsView& y) {
  cpu::AbsorbPerHead(pool_, x, w, head_rows, row_begin, contract, y, &LinearBlock);
}

void CpuBackend::RmsNorm(const MatView& x, const float* w, float eps, const MatView& y) {
  pool_.ParallelFor(x.rows, MinChunk(4 * x.cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x.Row(r);
      float* yr = y.Row(r);
      float sum = 0.0f;
      for (int64_t i = 0; i < x.cols; ++i) sum += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(sum / static_cast<float>(x.cols) + eps);
      for (int64_t i = 0; i < x.cols; ++i) yr[i] = w[i] * (xr[i] * inv);
    }
  });
}

void CpuBackend::LayerNorm(const MatView& x, const float* w, const float* b, float eps,
                           const MatView& y) {
  pool_.ParallelFor(x.rows, MinChunk(4 * x.cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x.Row(r);
      float* yr = y.Row(r);
      const float n = static_cast<float>(x.cols);
      float mean = 0.0f;
      for (int64_t i = 0; i < x.cols; ++i) mean += xr[i];
      mean /= n;
      float var = 0.0f;
      for (int64_t i = 0; i < x.cols; ++i) var += (xr[i] - mean) * (xr[i] - mean);
      var /= n;
      const float inv = 1.0f / std::sqrt(var + eps);
      for (int64_t i = 0; i < x.cols; ++i) yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
    }
  });
}

void CpuBackend::RopeInterleaved(const HeadsView& x, const int32_t* positions,
                                 const float* inv_freq, int num_freqs) {
  pool_.ParallelFor(x.rows, MinChunk(x.heads * num_freqs * 8), [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(num_freqs), sin_v(num_freqs);
    for (int64_t r = begin; r < end; ++r) {
      // fp32 angle as the reference computes it (inv_freq * position in float32).
      for (int i = 0; i < num_freqs; ++i) {
        const float angle = static_cast<float>(positions[r]) * inv_freq[i];
        cos_v[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sin_v[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
      for (int64_t h = 0; h < x.heads; ++h) {
        float* p = x.At(r, h);
        for (int i = 0; i < num_freqs; ++i) {
          const float a = p[2 * i], b = p[2 * i + 1];
          p[2 * i] = a * cos_v[i] - b * sin_v[i];
          p[2 * i + 1] = b * cos_v[i] + a * sin_v[i];
        }
      }
    }
  });
}

void CpuBackend::SiluMul(const MatView& gate, const MatView& up, const MatView& out) {
  pool_.ParallelFor(gate.rows, MinChunk(16 * gate.cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gate.Row(r);
      const float* u = up.Row(r);
      float* o = out.Row(r);
      for (int64_t i = 0; i < gate.cols; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
}

void CpuBackend::Fill(const MatView& y, float value) {
  for (int64_t r = 0; r < y.rows; ++r) std::fill(y.Row(r), y.Row(r) + y.cols, value);
}

void CpuBackend::Add(const MatView& x, const MatView& y) {
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.Row(r);
    float* yr = y.Row(r);
    for (int64_t i = 0; i < x.cols; ++i) yr[i] += xr[i];
  }
}

void CpuBackend::Copy(const MatView& x, const MatView& y) {
  for (int64_t r = 0; r < x.rows; ++r) std::memcpy(y.Row(r), x.Row(r), x.cols * sizeof(float));
}

void CpuBackend::GatherRows(const MatView& src, const int32_t* rows, const MatView& out) {
  for (int64_t r = 0; r < out.rows; ++r) {
    std::memcpy(out.Row(r), src.Row(rows[r]), out.cols * sizeof(float));
  }
}

void CpuBackend::ScatterRows(const MatView& src, const int32_t* rows, const MatView& dst) {
  for (int64_t r = 0; r < src.rows; ++r) {
    std::memcpy(dst.Row(rows[r]), src.Row(r), src.cols * sizeof(float));
  }
}

void CpuBackend::WriteLatentFp8(const MatView& src, const int32_t* slots,
                                const Fp8LatentCache& dst) {
  cpu_kv_fp8::WriteLatent(src, slots, dst);
}

void CpuBackend::WriteIndexKeysFp8(const MatView& src, const int32_t* slots,
                                   const Fp8IndexCache& dst) {
  cpu_kv_fp8::WriteIndexKeys(src, slots, dst);
}

void CpuBackend::GatherLatentFp8(const Fp8LatentCache& src, const int32_t* slots,
                                 const MatView& out) {
  cpu_kv_fp8::GatherLatent(src, slots, out);
}

void CpuBackend::IndexerTopK(const IndexerTopKArgs& a) {
  if (a.keys_fp8.data != nullptr) return cpu_kv_fp8::IndexerTopK(*this, a);
  const int64_t num_rows = a.q.rows;
  const int64_t row_work = int64_t{a.table.max_num_keys} * a.q.heads * a.q.dim;
  pool_.ParallelFor(num_rows, MinChunk(row_work), [&](int64_t begin, int64_t end) {
    std::vector<float> score;
    std::vector<int32_t> order;
    for (int64_t t = begin; t < end; ++t) {
      int32_t* out = a.out + t * a.top_k;
      const int32_t num_keys = a.table.row_num_keys[t];
      if (num_keys <= a.top_k) {
        for (int32_t i = 0; i < a.top_k; ++i) out[i] = i < num_keys ? i : -1;
        continue;
      }
      const int32_t* slots = a.table.slots + a.table.row_offset[t];
      score.assign(num_keys, 0.0f);
      const float* w = a.weights.Row(t);
      for (int32_t s = 0; s < num_keys; ++s) {
        const float* k = a.keys.Row(slots[s]);
        float acc = 0.0f;
        for (int64_t h = 0; h < a.q.heads; ++h) {
          const float d = Dot(a.q.At(t, h), k, a.q.dim) * a.score_scale;
          acc += std::max(d, 0.0f) * (w[h] * a.weight_scale);
        }
        score[s] = acc;
      }
      order.resize(num_keys);
      for (int32_t s = 0; s < num_keys; ++s) order[s] = s;
      std::nth_element(order.begin(), order.begin() + a.top_k, order.end(),
                       ScoreIndexGreater{score.data()});
      std::sort(order.begin(), order.begin() + a.top_k);
      std::copy(order.begin(), order.begin() + a.top_k, out);
    }
  });
}

void CpuBackend::Attention(const AttentionArgs& a) {
  if (a.latent_fp8.data != nullptr) return cpu_kv_fp8::Attention(*this, a);
  const int64_t num_rows = a.q_a.rows, num_heads = a.q_a.heads;
  const int64_t head_work = int64_t{std::min(a.table.max_num_keys, a.indices != nullptr
                                                                        ? a.index_width
                                                                        : a.table.max_num_keys)} *
                            (a.q_a.dim + a.q_b.dim + a.v.dim);
  pool_.ParallelFor(num_rows * num_heads, MinChunk(head_work), [&](int64_t begin, int64_t end) {
    std::vector<int32_t> pos;
    std::vector<float> p;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / num_heads, h = task % num_heads;
      const int32_t num_keys = a.table.row_num_keys[t];
      const int32_t* slots = a.table.slots + a.table.row_offset[t];
      pos.clear();
      if (a.indices != nullptr) {
        const int32_t* idx = a.indices + t * a.index_width;
        for (int32_t i = 0; i < a.index_width; ++i) {
          if (idx[i] >= 0 && idx[i] < num_keys) pos.push_back(idx[i]);
        }
      } else {
        for (int32_t i = 0; i < num_keys; ++i) pos.push_back(i);
      }
      float* out = a.out.At(t, h);
      std::fill(out, out + a.out.dim, 0.0f);
      if (pos.empty()) continue;
      const float* qa = a.q_a.At(t, h);
      const float* qb = a.q_b.At(t, h);
      p.resize(pos.size());
      float max_s = -std::numeric_limits<float>::infinity();
      for (size_t i = 0; i < pos.size(); ++i) {
        const int64_t r = slots[pos[i]];
        const float s = (Dot(qa, a.k_a.At(r, h), a.q_a.dim) + Dot(qb, a.k_b.At(r, h), a.q_b.dim)) *
                        a.scale;
        p[i] = s;
        max_s = std::max(max_s, s);
      }
      float sum = 0.0f;
      for (float& v : p) {
        v = std::exp(v - max_s);
        sum += v;
      }
      const float inv = 1.0f / sum;
      for (size_t i = 0; i < pos.size(); ++i) {
        Axpy(p[i] * inv, a.v.At(slots[pos[i]], h), out, a.out.dim);
      }
    }
  });
}

void CpuBackend::MoeRoute(const MatView& logits, const float* bias, int n_group, int topk_group,
                          int top_k, bool renormalize, float scale, int appended, int32_t* ids,
                          float* weights) {
  const int out_k = appended >= 0 ? top_k + 1 : top_k;  // entries per row of ids / weights
  const int64_t num_experts = logits.cols;
  n_group = std::max(1, n_group);
  const int64_t group_size = num_experts / n_group;
  std::vector<float> s(num_experts), choice(num_experts), group_score(n_group);
  std::vector<int32_t> order(num_experts), groups(n_group);
  for (int64_t t = 0; t < logits.rows; ++t) {
    const float* l = logits.Row(t);
    for (int64_t e = 0; e < num_experts; ++e) {
      s[e] = 1.0f / (1.0f + std::exp(-l[e]));
      choice[e] = s[e] + (bias != nullptr ? bias[e] : 0.0f);
      order[e] = static_cast<int32_t>(e);
    }
    if (n_group > 1 && topk_group < n_group) {
      for (int g = 0; g < n_group; ++g) {
        float top1 = -std::numeric_limits<float>::infinity(), top2 = top1;
        for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) {
          if (choice[e] > top1) {
            top2 = top1;
            top1 = choice[e];
          } else if (choice[e] > top2) {
            top2 = choice[e];
          }
        }
        group_score[g] = group_size > 1 ? top1 + top2 : top1;
        groups[g] = g;
      }
      std::partial_sort(groups.begin(), groups.begin() + topk_group, groups.end(),
                        ScoreIndexGreater{group_score.data()});
      std::vector<bool> keep(n_group, false);
      for (int g = 0; g < topk_group; ++g) keep[groups[g]] = true;
      for (int64_t e = 0; e < num_experts; ++e) {
        if (!keep[e / group_size]) choice[e] = -std::numeric_limits<float>::infinity();
      }
    }
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      ScoreIndexGreater{choice.data()});
    float sum = 0.0f;
    for (int j = 0; j < top_k; ++j) sum += s[order[j]];
    const float denom = renormalize ? sum + 1e-20f : 1.0f;
    for (int j = 0; j < top_k; ++j) {
      ids[t * out_k + j] = order[j];
      weights[t * out_k + j] = s[order[j]] / denom * scale;
    }
    if (appended >= 0) {
      ids[t * out_k + top_k] = appended;
      weights[t * out_k + top_k] = 1.0f;
    }
  }
}

void CpuBackend::MoeExperts(const MatView& x, const int32_t* ids, const float* weights, int top_k,
                            const ExpertWeights& experts, const MatView& out) {
  const int64_t hidden = x.cols;
  // Tokens (and their routing weight) per expert.
  std::vector<std::vector<std::pair<int32_t, float>>> assigned(experts.num_experts);
  for (int64_t t = 0; t < x.rows; ++t) {
    for (int j = 0; j < top_k; ++j) {
      assigned[ids[t * top_k + j]].push_back({static_cast<int32_t>(t), weights[t * top_k + j]});
    }
  }
  for (int32_t e = 0; e < experts.num_experts; ++e) {
    const auto& tokens = assigned[e];
    if (tokens.empty()) continue;
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int64_t inter = experts.gate[e].rows;
    moe_x_.resize(n * hidden);
    moe_gate_.resize(n * inter);
    moe_up_.resize(n * inter);
    moe_y_.resize(n * hidden);
    MatView xs{moe_x_.data(), n, hidden, hidden};
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(xs.Row(i), x.Row(tokens[i].first), hidden * sizeof(float));
    }
    MatView g{moe_gate_.data(), n, inter, inter}, u{moe_up_.data(), n, inter, inter};
    MatView y{moe_y_.data(), n, hidden, hidden};
    // Narrow expert weights are widened, x stays fp32 (backend.h MoeExperts).
    auto expert_linear = [&](const MatView& in, const MatView& w, const MatView& res) {
      if (w.dtype == WeightDType::kF32) {
        Linear(in, w, res, false);
      } else {
        cpu::NarrowLinear(pool_, in, w, res, false, cpu::NarrowX::kF32, &LinearBlock);
      }
    };
    expert_linear(xs, experts.gate[e], g);
    expert_linear(xs, experts.up[e], u);
    SiluMul(g, u, g);
    expert_linear(g, experts.down[e], y);
    for (int64_t i = 0; i < n; ++i) Axpy(tokens[i].second, y.Row(i), out.Row(tokens[i].first), hidden);
  }
}

}  // namespace glm::engine
