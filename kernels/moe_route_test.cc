// MoeRoute on the GPU against a host copy of the CPU backend's router (engine/backend/cpu):
// identical expert ids (order included) and weights to ~1 ulp over a sweep: 1 expert, GLM-5's
// 256/top-8, DeepSeek-V3's 8 groups keep 4, groups of one expert, top_k beyond the kept groups
// (-inf choices), no bias, all-equal logits (every choice a tie), the maximum 1024 experts /
// top-64; coarse logits / bias (ties between distinct experts and groups decide the order) with
// and without renormalizing, one row and 1001 rows; padded logits stride, guard bytes, finite
// weights. Skips without a GPU.
#include "kernels/moe_route.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"

namespace glm::kernels {
namespace {

using testing::GuardedBuffer;

struct Greater {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] != v[b] ? v[a] > v[b] : a < b; }
};

// The CPU backend's MoeRoute for one row.
void HostRoute(const float* l, const float* bias, int num_experts, int n_group, int topk_group,
               int top_k, bool renormalize, float scale, int32_t* ids, float* weights) {
  std::vector<float> s(num_experts), choice(num_experts), group_score(n_group);
  std::vector<int32_t> order(num_experts), groups(n_group);
  const int group_size = num_experts / n_group;
  for (int e = 0; e < num_experts; ++e) {
    s[e] = 1.0f / (1.0f + std::exp(-l[e]));
    choice[e] = s[e] + (bias != nullptr ? bias[e] : 0.0f);
    order[e] = e;
  }
  if (n_group > 1 && topk_group < n_group) {
    for (int g = 0; g < n_group; ++g) {
      float top1 = -std::numeric_limits<float>::infinity(), top2 = top1;
      for (int e = g * group_size; e < (g + 1) * group_size; ++e) {
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
                      Greater{group_score.data()});
    std::vector<bool> keep(n_group, false);
    for (int g = 0; g < topk_group; ++g) keep[groups[g]] = true;
    for (int e = 0; e < num_experts; ++e) {
      if (!keep[e / group_size]) choice[e] = -std::numeric_limits<float>::infinity();
    }
  }
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(), Greater{choice.data()});
  float sum = 0.0f;
  for (int j = 0; j < top_k; ++j) sum += s[order[j]];
  const float denom = renormalize ? sum + 1e-20f : 1.0f;
  for (int j = 0; j < top_k; ++j) {
    ids[j] = order[j];
    weights[j] = s[order[j]] / denom * scale;
  }
}

class MoeRouteTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
};

TEST_F(MoeRouteTest, MatchesCpuRouter) {
  struct Case {
    int64_t rows;
    int experts, n_group, topk_group, top_k;
    bool renormalize, with_bias, all_equal;
    float scale;
    bool coarse = false;  // logits from {-1, 0, 1}, bias from {0, 0.5}: ties between experts
  };
  const Case cases[] = {
      {1, 1, 1, 1, 1, true, true, false, 1.0f},      {5, 8, 1, 1, 2, true, true, false, 1.0f},
      {17, 256, 1, 1, 8, true, true, false, 2.5f},   {33, 256, 8, 4, 8, true, true, false, 2.5f},
      {9, 160, 1, 1, 6, false, false, false, 1.0f},  {4, 64, 64, 5, 6, true, true, false, 1.0f},
      {6, 16, 8, 1, 4, true, true, false, 1.0f},     {3, 64, 4, 2, 8, true, false, true, 1.0f},
      {5, 1024, 16, 3, 64, true, true, false, 1.5f}, {300, 72, 6, 6, 5, false, true, false, 0.5f},
      // One row (decode), many rows over several CTAs (rows % 4 != 0), coarse values so that
      // ties (to the lower expert / group) decide the order, with and without renormalizing,
      // grouped and not, 300 experts (the 32-per-lane kernel) with groups of one.
      {1, 256, 1, 1, 8, true, true, false, 2.5f},
      {1, 256, 1, 1, 8, true, true, false, 2.5f, true},
      {1001, 256, 8, 4, 8, false, true, false, 1.0f, true},
      {37, 256, 8, 3, 8, true, false, false, 2.5f, true},
      {7, 256, 1, 1, 1, false, true, false, 1.0f, true},
      {11, 300, 300, 7, 40, true, true, false, 1.0f, true},
      {2, 33, 1, 1, 33, true, true, false, 1.0f}};
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("rows=", c.rows, " experts=", c.experts, " n_group=", c.n_group,
                              " topk_group=", c.topk_group, " top_k=", c.top_k,
                              " renormalize=", c.renormalize, " coarse=", c.coarse));
    const int64_t ld = c.experts + 3;
    std::vector<float> logits(static_cast<size_t>(c.rows * ld)), bias(c.experts);
    std::uniform_int_distribution<int> level(0, 2);
    for (float& v : logits) v = c.all_equal ? 0.25f : c.coarse ? level(rng) - 1.0f : nd(rng);
    for (float& v : bias) {
      v = c.all_equal ? 0.0f : c.coarse ? 0.5f * (level(rng) & 1) : 0.1f * nd(rng);
    }
    // appended >= 0: a shared expert's (id, 1.0) after the top_k, every row.
    for (const int appended : {-1, c.experts}) {
      SCOPED_TRACE(absl::StrCat("appended=", appended));
      const int out_k = appended >= 0 ? c.top_k + 1 : c.top_k;
      GuardedBuffer dl(logits.size() * 4), db(bias.size() * 4);
      GuardedBuffer dids(static_cast<size_t>(c.rows * out_k) * 4);
      GuardedBuffer dw(static_cast<size_t>(c.rows * out_k) * 4);
      ASSERT_TRUE(dl.ok() && db.ok() && dids.ok() && dw.ok());
      GLM_CUDA_ASSERT(dl.Upload(logits.data(), logits.size() * 4));
      GLM_CUDA_ASSERT(db.Upload(bias.data(), bias.size() * 4));
      GLM_CUDA_ASSERT(dids.Poison(0xFF));
      GLM_CUDA_ASSERT(dw.Poison(0xFF));
      ASSERT_TRUE(MoeRoute(dl.as<float>(), ld, c.with_bias ? db.as<float>() : nullptr, c.rows,
                           c.experts, c.n_group, c.topk_group, c.top_k, c.renormalize, c.scale,
                           appended, dids.as<int32_t>(), dw.as<float>(), nullptr)
                      .ok());
      GLM_CUDA_ASSERT(cudaDeviceSynchronize());
      ASSERT_TRUE(dl.GuardsIntact() && db.GuardsIntact() && dids.GuardsIntact() &&
                  dw.GuardsIntact());
      std::vector<int32_t> ids(static_cast<size_t>(c.rows * out_k));
      std::vector<float> w(ids.size());
      GLM_CUDA_ASSERT(dids.Download(ids.data(), ids.size() * 4));
      GLM_CUDA_ASSERT(dw.Download(w.data(), w.size() * 4));
      std::vector<int32_t> want_ids(c.top_k);
      std::vector<float> want_w(c.top_k);
      for (int64_t t = 0; t < c.rows; ++t) {
        HostRoute(&logits[t * ld], c.with_bias ? bias.data() : nullptr, c.experts, c.n_group,
                  c.topk_group, c.top_k, c.renormalize, c.scale, want_ids.data(), want_w.data());
        for (int j = 0; j < c.top_k; ++j) {
          const size_t i = static_cast<size_t>(t * out_k + j);
          ASSERT_EQ(ids[i], want_ids[j]) << "row " << t << " slot " << j;
          ASSERT_TRUE(std::isfinite(w[i])) << "row " << t << " slot " << j;
          ASSERT_NEAR(w[i], want_w[j], 1e-6f * std::abs(want_w[j]) + 1e-7f)
              << "row " << t << " slot " << j;
        }
        if (appended >= 0) {
          ASSERT_EQ(ids[t * out_k + c.top_k], appended) << "row " << t;
          ASSERT_EQ(w[t * out_k + c.top_k], 1.0f) << "row " << t;
        }
      }
    }
  }
}

// Infinite logits order like any others (sigmoid 1 / 0: the CPU's order); NaN logits (a broken
// upstream layer) still give distinct, valid experts: every number before every NaN, NaNs from
// the lowest expert up.
TEST_F(MoeRouteTest, NonFiniteLogitsGiveValidDistinctExperts) {
  constexpr int kExperts = 256, kTopK = 8;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> logits(2 * kExperts), bias(kExperts, 0.0f);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (float& v : logits) v = nd(rng);
  logits[7] = inf;
  logits[9] = inf;  // a tie at 1.0: expert 7 first
  logits[3] = -inf;
  for (int e = 0; e < kExperts; ++e) {
    if (e % 50 != 5) logits[kExperts + e] = nan;  // row 1: 6 numbers (5, 55, ..., 255)
  }
  logits[kExperts + 255] = -inf;
  GuardedBuffer dl(logits.size() * 4), db(bias.size() * 4);
  GuardedBuffer dids(2 * kTopK * 4), dw(2 * kTopK * 4);
  ASSERT_TRUE(dl.ok() && db.ok() && dids.ok() && dw.ok());
  GLM_CUDA_ASSERT(dl.Upload(logits.data(), logits.size() * 4));
  GLM_CUDA_ASSERT(db.Upload(bias.data(), bias.size() * 4));
  ASSERT_TRUE(MoeRoute(dl.as<float>(), kExperts, db.as<float>(), 2, kExperts, 1, 1, kTopK, true,
                       1.0f, -1, dids.as<int32_t>(), dw.as<float>(), nullptr)
                  .ok());
  GLM_CUDA_ASSERT(cudaDeviceSynchronize());
  ASSERT_TRUE(dids.GuardsIntact() && dw.GuardsIntact());
  std::vector<int32_t> ids(2 * kTopK);
  GLM_CUDA_ASSERT(dids.Download(ids.data(), ids.size() * 4));
  std::vector<int32_t> want(kTopK);
  std::vector<float> want_w(kTopK);
  HostRoute(logits.data(), bias.data(), kExperts, 1, 1, kTopK, true, 1.0f, want.data(),
            want_w.data());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + kTopK), want);
  EXPECT_EQ(ids[0], 7);
  EXPECT_EQ(ids[1], 9);
  // Row 1: the five finite logits by choice (HostRoute over just them), then -inf's expert 255,
  // then the NaN experts 0 and 1.
  std::vector<float> finite = {logits[kExperts + 5], logits[kExperts + 55], logits[kExperts + 105],
                               logits[kExperts + 155], logits[kExperts + 205]};
  std::vector<int32_t> order(5);
  std::vector<float> order_w(5);
  HostRoute(finite.data(), nullptr, 5, 1, 1, 5, true, 1.0f, order.data(), order_w.data());
  for (int j = 0; j < 5; ++j) EXPECT_EQ(ids[kTopK + j], 5 + 50 * order[j]) << "slot " << j;
  EXPECT_EQ(ids[kTopK + 5], 255);
  EXPECT_EQ(ids[kTopK + 6], 0);
  EXPECT_EQ(ids[kTopK + 7], 1);
}

TEST_F(MoeRouteTest, RejectsBadInputs) {
  GuardedBuffer d(1 << 16);
  std::vector<float> host(64);
  float* p = d.as<float>();
  int32_t* ids = d.as<int32_t>();
  EXPECT_FALSE(MoeRoute(p, 8, p, 1, 8, 3, 1, 2, true, 1.0f, -1, ids, p, nullptr).ok());  // 8 % 3
  EXPECT_FALSE(MoeRoute(p, 8, p, 1, 8, 2, 3, 2, true, 1.0f, -1, ids, p, nullptr).ok());  // tg > g
  EXPECT_FALSE(MoeRoute(p, 8, p, 1, 8, 1, 1, 9, true, 1.0f, -1, ids, p, nullptr).ok());  // k > E
  EXPECT_FALSE(MoeRoute(p, 4, p, 1, 8, 1, 1, 2, true, 1.0f, -1, ids, p, nullptr).ok());  // ld < E
  EXPECT_FALSE(MoeRoute(p, 2048, p, 1, 2048, 1, 1, 2, true, 1.0f, -1, ids, p, nullptr).ok());
  EXPECT_FALSE(MoeRoute(host.data(), 8, p, 1, 8, 1, 1, 2, true, 1.0f, -1, ids, p, nullptr).ok());
  EXPECT_FALSE(MoeRoute(p, 8, p, 1, 8, 1, 1, 2, true, 1.0f, -2, ids, p, nullptr).ok());
  EXPECT_TRUE(MoeRoute(p, 8, p, 0, 8, 1, 1, 2, true, 1.0f, -1, ids, p, nullptr).ok());
}

}  // namespace
}  // namespace glm::kernels
