// CPU backend ops against naive double-precision references, over shape sweeps (1, non-multiples
// of the tiles, padded row strides) with guard values around outputs.
#include "engine/backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace glm::engine {
namespace {

constexpr float kGuard = 12345.0f;

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 3, 17, 1000}) {
    for (int64_t min_chunk : {1, 7, 2000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, min_chunk, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << i;
    }
  }
}

TEST(CpuBackend, LinearMatchesReferenceOverShapes) {
  CpuBackend b(3);
  for (int64_t M : {1, 3, 4, 5, 17, 33}) {
    for (int64_t N : {1, 2, 3, 5, 33, 70}) {
      for (int64_t K : {1, 7, 8, 9, 64, 130}) {
        for (bool acc : {false, true}) {
          const int64_t ldx = K + 3, ldw = K + 1, ldy = N + 2;
          auto x = Random(M * ldx, 1), w = Random(N * ldw, 2);
          std::vector<float> y(M * ldy, kGuard);
          std::vector<float> y0 = y;
          b.Linear({x.data(), M, K, ldx}, {w.data(), N, K, ldw}, {y.data(), M, N, ldy}, acc);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < ldy; ++n) {
              if (n >= N) {
                ASSERT_EQ(y[m * ldy + n], kGuard) << "wrote outside the view";
                continue;
              }
              double ref = acc ? y0[m * ldy + n] : 0.0;
              for (int64_t k = 0; k < K; ++k) ref += double(x[m * ldx + k]) * w[n * ldw + k];
              ASSERT_NEAR(y[m * ldy + n], ref, 1e-4 * (1 + std::fabs(ref)))
                  << "M=" << M << " N=" << N << " K=" << K << " acc=" << acc;
            }
          }
        }
      }
    }
  }
}

TEST(CpuBackend, NormsMatchReference) {
  CpuBackend b(2);
  const int64_t rows = 5, cols = 37;
  auto x = Random(rows * cols, 3, 2.0f), w = Random(cols, 4), bias = Random(cols, 5);
  std::vector<float> y(rows * cols), z(rows * cols);
  b.RmsNorm({x.data(), rows, cols, cols}, w.data(), 1e-6f, {y.data(), rows, cols, cols});
  b.LayerNorm({x.data(), rows, cols, cols}, w.data(), bias.data(), 1e-6f,
              {z.data(), rows, cols, cols});
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0, mean = 0, var = 0;
    for (int64_t i = 0; i < cols; ++i) {
      ss += double(x[r * cols + i]) * x[r * cols + i];
      mean += x[r * cols + i];
    }
    mean /= cols;
    for (int64_t i = 0; i < cols; ++i) var += (x[r * cols + i] - mean) * (x[r * cols + i] - mean);
    var /= cols;
    for (int64_t i = 0; i < cols; ++i) {
      EXPECT_NEAR(y[r * cols + i], w[i] * x[r * cols + i] / std::sqrt(ss / cols + 1e-6), 1e-5);
      EXPECT_NEAR(z[r * cols + i], (x[r * cols + i] - mean) / std::sqrt(var + 1e-6) * w[i] + bias[i],
                  1e-5);
    }
  }
}

// HF's apply_rotary_pos_emb_interleave returns [rotated evens | rotated odds]; ours keeps pairs
// in place. The same rotation, permuted.
TEST(CpuBackend, RopeInterleavedMatchesHfUpToItsPermutation) {
  CpuBackend b(2);
  const int64_t rows = 3, heads = 2, dim = 12, rope = 8, num_freqs = rope / 2;
  auto x = Random(rows * heads * dim, 6);
  std::vector<float> inv_freq(num_freqs);
  for (int i = 0; i < num_freqs; ++i) inv_freq[i] = 1.0f / std::pow(10000.0f, 2.0f * i / rope);
  std::vector<int32_t> pos = {0, 5, 1000};
  auto y = x;
  b.RopeInterleaved({y.data(), rows, heads, rope, heads * dim, dim}, pos.data(), inv_freq.data(),
                    static_cast<int>(num_freqs));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* in = x.data() + r * heads * dim + h * dim;
      const float* out = y.data() + r * heads * dim + h * dim;
      for (int i = 0; i < num_freqs; ++i) {
        const double a = double(pos[r]) * inv_freq[i], c = std::cos(a), s = std::sin(a);
        const double hf_first = in[2 * i] * c - in[2 * i + 1] * s;   // HF out[i]
        const double hf_second = in[2 * i + 1] * c + in[2 * i] * s;  // HF out[i + rope/2]
        EXPECT_NEAR(out[2 * i], hf_first, 1e-4);
        EXPECT_NEAR(out[2 * i + 1], hf_second, 1e-4);
      }
      for (int64_t d = rope; d < dim; ++d) EXPECT_EQ(out[d], in[d]) << "pass-through dims moved";
    }
  }
}

struct Table {
  std::vector<int32_t> slots, offset, num_keys;
  KeyTable View() {
    return {slots.data(), offset.data(), num_keys.data(),
            *std::max_element(num_keys.begin(), num_keys.end())};
  }
};

TEST(CpuBackend, IndexerTopKSelectsLargestScoresCausallyWithLowerPositionOnTies) {
  CpuBackend b(2);
  const int64_t heads = 2, dim = 4, top_k = 2;
  // Keys live in reverse slot order to exercise the slot table.
  const int num_keys = 5;
  std::vector<float> keys(8 * dim, 0.0f);
  Table t;
  for (int p = 0; p < num_keys; ++p) t.slots.push_back(7 - p);
  // key p = e_0 * score_p (head 0 sees it, head 1 sees -it).
  const float score[num_keys] = {1.0f, 3.0f, 2.0f, 3.0f, 0.5f};
  for (int p = 0; p < num_keys; ++p) keys[(7 - p) * dim] = score[p];
  // Row 0: 5 keys; row 1: 2 keys (<= top_k: all selected, no scoring); row 2: 4 keys.
  t.offset = {0, 0, 0};
  t.num_keys = {5, 2, 4};
  std::vector<float> q(3 * heads * dim, 0.0f), w(3 * heads, 0.0f);
  for (int r = 0; r < 3; ++r) {
    q[r * heads * dim] = 1.0f;             // head 0
    q[r * heads * dim + dim] = -1.0f;      // head 1 (relu kills it)
    w[r * heads] = 1.0f;
    w[r * heads + 1] = 5.0f;
  }
  std::vector<int32_t> out(3 * top_k, 99);
  IndexerTopKArgs a;
  a.q = {q.data(), 3, heads, dim, heads * dim, dim};
  a.weights = {w.data(), 3, heads, heads};
  a.keys = {keys.data(), 8, dim, dim};
  a.table = t.View();
  a.top_k = top_k;
  a.out = out.data();
  b.IndexerTopK(a);
  auto row = [&](int r) {
    std::vector<int32_t> v(out.begin() + r * top_k, out.begin() + (r + 1) * top_k);
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(row(0), (std::vector<int32_t>{1, 3}));  // 3.0 and 3.0 beat 2.0
  EXPECT_EQ(row(1), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(row(2), (std::vector<int32_t>{1, 3}));
  // Exact ties at the boundary (as ReLU zeros give in real models): {2, 2, 2}, k = 2 -> 0, 1.
  for (int p = 0; p < 3; ++p) keys[(7 - p) * dim] = 2.0f;
  t.num_keys = {3, 3, 3};
  a.table = t.View();
  b.IndexerTopK(a);
  EXPECT_EQ(row(0), (std::vector<int32_t>{0, 1}));
}

TEST(CpuBackend, AttentionMatchesNaiveSoftmaxWithBroadcastKeysAndSparseIndices) {
  CpuBackend b(3);
  const int64_t rows = 3, heads = 4, da = 6, db = 2, dv = 5, num_slots = 9;
  auto qa = Random(rows * heads * da, 7), qb = Random(rows * heads * db, 8);
  auto ka = Random(num_slots * heads * da, 9), kb = Random(num_slots * db, 10);
  auto v = Random(num_slots * heads * dv, 11);
  Table t;
  t.slots = {8, 2, 5, 0, 3, 7};  // logical position -> slot
  t.offset = {0, 0, 0};
  t.num_keys = {4, 5, 6};
  std::vector<int32_t> idx = {0, 2, 3, -1,  // row 0
                              4, 1, -1, -1,  // row 1
                              5, 0, 1, 3};   // row 2
  std::vector<float> out(rows * heads * dv + 1, kGuard);
  AttentionArgs a;
  a.q_a = {qa.data(), rows, heads, da, heads * da, da};
  a.q_b = {qb.data(), rows, heads, db, heads * db, db};
  a.k_a = {ka.data(), num_slots, heads, da, heads * da, da};
  a.k_b = {kb.data(), num_slots, heads, db, db, 0};  // broadcast
  a.v = {v.data(), num_slots, heads, dv, heads * dv, dv};
  a.table = t.View();
  a.indices = idx.data();
  a.index_width = 4;
  a.scale = 0.3f;
  a.out = {out.data(), rows, heads, dv, heads * dv, dv};
  b.Attention(a);
  EXPECT_EQ(out.back(), kGuard);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<int> sel;
      for (int i = 0; i < 4; ++i) {
        if (idx[r * 4 + i] >= 0) sel.push_back(idx[r * 4 + i]);
      }
      std::vector<double> s;
      double mx = -1e30;
      for (int p : sel) {
        const int slot = t.slots[p];
        double d = 0;
        for (int i = 0; i < da; ++i) d += double(qa[(r * heads + h) * da + i]) * ka[(slot * heads + h) * da + i];
        for (int i = 0; i < db; ++i) d += double(qb[(r * heads + h) * db + i]) * kb[slot * db + i];
        s.push_back(d * 0.3);
        mx = std::max(mx, s.back());
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < dv; ++d) {
        double ref = 0;
        for (size_t i = 0; i < sel.size(); ++i) ref += s[i] / sum * v[(t.slots[sel[i]] * heads + h) * dv + d];
        EXPECT_NEAR(out[(r * heads + h) * dv + d], ref, 1e-5);
      }
    }
  }
}

TEST(CpuBackend, MoeRouteUsesBiasOnlyForChoosing) {
  CpuBackend b(1);
  // Expert 3 has the largest sigmoid but a bias that pushes it out; expert 0 is pulled in.
  std::vector<float> logits = {0.0f, 1.0f, 0.5f, 2.0f};
  std::vector<float> bias = {1.0f, 0.0f, 0.0f, -2.0f};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  b.MoeRoute({logits.data(), 1, 4, 4}, bias.data(), 1, 1, 2, true, 2.5f, -1, ids.data(), w.data());
  auto sig = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
  EXPECT_EQ(ids[0], 0);  // 0.5 + 1.0
  EXPECT_EQ(ids[1], 1);  // 0.731
  const float sum = sig(0.0f) + sig(1.0f);
  EXPECT_NEAR(w[0], sig(0.0f) / sum * 2.5f, 1e-6);
  EXPECT_NEAR(w[1], sig(1.0f) / sum * 2.5f, 1e-6);
  // Without renormalisation the weights are the raw sigmoids times the scale.
  b.MoeRoute({logits.data(), 1, 4, 4}, bias.data(), 1, 1, 2, false, 1.0f, -1, ids.data(), w.data());
  EXPECT_NEAR(w[0], sig(0.0f), 1e-6);
  // Group-limited: 2 groups {0,1} {2,3}; keep 1 group. Group scores (top-2 sums of s + bias):
  // g0 = 1.5 + 0.731 = 2.23, g1 = 0.622 + (0.881 - 2) < g0 -> experts from group 0 only.
  std::vector<float> logits2 = {0.0f, 1.0f, 3.0f, 2.0f};
  std::vector<float> nobias = {0.0f, 0.0f, 0.0f, 0.0f};
  b.MoeRoute({logits2.data(), 1, 4, 4}, nobias.data(), 2, 1, 2, true, 1.0f, -1, ids.data(),
             w.data());
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 3}));
  b.MoeRoute({logits2.data(), 1, 4, 4}, bias.data(), 2, 1, 2, true, 1.0f, -1, ids.data(), w.data());
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
  // appended: a shared expert's (id, 1.0) follows the top_k of every row, outside the
  // renormalization.
  std::vector<float> logits3 = {0.0f, 1.0f, 0.5f, 2.0f, 2.0f, 0.5f, 1.0f, 0.0f};
  std::vector<int32_t> ids3(6, -1);
  std::vector<float> w3(6, -1.0f);
  b.MoeRoute({logits3.data(), 2, 4, 4}, nobias.data(), 1, 1, 2, true, 2.5f, 4, ids3.data(),
             w3.data());
  EXPECT_EQ(ids3, (std::vector<int32_t>{3, 1, 4, 0, 2, 4}));
  const float sum3 = sig(2.0f) + sig(1.0f);
  EXPECT_NEAR(w3[0], sig(2.0f) / sum3 * 2.5f, 1e-6);
  EXPECT_NEAR(w3[1], sig(1.0f) / sum3 * 2.5f, 1e-6);
  EXPECT_EQ(w3[2], 1.0f);
  EXPECT_NEAR(w3[3], sig(2.0f) / sum3 * 2.5f, 1e-6);
  EXPECT_EQ(w3[5], 1.0f);
}

TEST(CpuBackend, MoeExpertsMatchesNaive) {
  CpuBackend b(2);
  const int64_t T = 5, H = 9, I = 6, E = 3, top_k = 2;
  auto x = Random(T * H, 12);
  std::vector<std::vector<float>> g, u, d;
  std::vector<MatView> gv, uv, dv;
  for (int e = 0; e < E; ++e) {
    g.push_back(Random(I * H, 20 + e));
    u.push_back(Random(I * H, 30 + e));
    d.push_back(Random(H * I, 40 + e));
  }
  for (int e = 0; e < E; ++e) {
    gv.push_back({g[e].data(), I, H, H});
    uv.push_back({u[e].data(), I, H, H});
    dv.push_back({d[e].data(), H, I, I});
  }
  std::vector<int32_t> ids = {0, 2, 1, 2, 2, 0, 1, 0, 2, 1};  // expert 1 gets 3 tokens, etc.
  std::vector<float> w = Random(T * top_k, 50);
  std::vector<float> out(T * H, 0.5f);
  b.MoeExperts({x.data(), T, H, H}, ids.data(), w.data(), top_k,
               {gv.data(), uv.data(), dv.data(), static_cast<int32_t>(E)}, {out.data(), T, H, H});
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> ref(H, 0.5);
    for (int j = 0; j < top_k; ++j) {
      const int e = ids[t * top_k + j];
      std::vector<double> hmid(I);
      for (int64_t i = 0; i < I; ++i) {
        double gs = 0, us = 0;
        for (int64_t k = 0; k < H; ++k) {
          gs += double(g[e][i * H + k]) * x[t * H + k];
          us += double(u[e][i * H + k]) * x[t * H + k];
        }
        hmid[i] = gs / (1 + std::exp(-gs)) * us;
      }
      for (int64_t k = 0; k < H; ++k) {
        double s = 0;
        for (int64_t i = 0; i < I; ++i) s += d[e][k * I + i] * hmid[i];
        ref[k] += w[t * top_k + j] * s;
      }
    }
    for (int64_t k = 0; k < H; ++k) EXPECT_NEAR(out[t * H + k], ref[k], 1e-4);
  }
}

TEST(CpuBackend, GatherScatterAndPerHeadLinear) {
  CpuBackend b(2);
  std::vector<float> src = {1, 2, 3, 4, 5, 6};  // [3, 2]
  std::vector<int32_t> rows = {2, 0};
  std::vector<float> out(4);
  b.GatherRows({src.data(), 3, 2, 2}, rows.data(), {out.data(), 2, 2, 2});
  EXPECT_EQ(out, (std::vector<float>{5, 6, 1, 2}));
  std::vector<float> dst(6, 0.0f);
  b.ScatterRows({out.data(), 2, 2, 2}, rows.data(), {dst.data(), 3, 2, 2});
  EXPECT_EQ(dst, (std::vector<float>{1, 2, 0, 0, 5, 6}));
  // Per head h: y[:, h] = x[:, h] . W_h^T with W_h [2 out, 3 in] at stride 6.
  const int64_t heads = 2;
  auto x = Random(2 * heads * 3, 60), w = Random(heads * 6, 61);
  std::vector<float> y(2 * heads * 2);
  b.LinearPerHead({x.data(), 2, heads, 3, heads * 3, 3}, w.data(), 6, 3,
                  {y.data(), 2, heads, 2, heads * 2, 2});
  for (int r = 0; r < 2; ++r) {
    for (int h = 0; h < heads; ++h) {
      for (int o = 0; o < 2; ++o) {
        double ref = 0;
        for (int i = 0; i < 3; ++i) ref += double(x[(r * heads + h) * 3 + i]) * w[h * 6 + o * 3 + i];
        EXPECT_NEAR(y[(r * heads + h) * 2 + o], ref, 1e-5);
      }
    }
  }
}

}  // namespace
}  // namespace glm::engine
