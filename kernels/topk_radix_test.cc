// topk_radix against a CPU reference: 2K, 128K and 1,048,576 columns, k 1..2048, batches, per-row
// lengths (0, < k, == k, k + 1, random), ties, NaN/Inf, padded strides, the GB10-like limits
// (99 KiB, 48 SMs), the streaming path, guard bytes around the output. Skips without a GPU.
// GLM_KERNELS_SMEM_CAP_BYTES=101376 in the environment caps every plan to GB10's 99 KiB.
#include "kernels/topk_radix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"

namespace glm::kernels {
namespace {

using testing::GuardedBuffer;

uint32_t Key(float f) {
  if (std::isnan(f)) return 0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

enum class Data { kUniform, kNormal, kFewValues, kAllEqual, kSpecials, kSorted };
enum class Lengths { kFull, kMixed };

struct Case {
  int64_t rows;
  int64_t max_len;
  int k;
  Data data = Data::kUniform;
  Lengths lengths = Lengths::kFull;
  int64_t stride_pad = 0;  // row_stride = max_len + stride_pad
  const DeviceLimits* caps = nullptr;
  bool expect_streaming = false;
  TopkPath path = TopkPath::kAuto;
};

std::string DataName(Data d) {
  switch (d) {
    case Data::kUniform: return "uniform";
    case Data::kNormal: return "normal";
    case Data::kFewValues: return "few_values";
    case Data::kAllEqual: return "all_equal";
    case Data::kSpecials: return "specials";
    case Data::kSorted: return "sorted";
  }
  return "?";
}

// Checks one output row: min(k, len) distinct in-range indices then -1; every selected key >=
// the k-th largest key; every key above the k-th largest selected.
void CheckRow(const float* row, int64_t len, int k, const int32_t* out, const std::string& ctx) {
  const int64_t n_valid = std::min<int64_t>(k, len);
  std::vector<char> seen(static_cast<size_t>(len), 0);
  for (int64_t j = 0; j < n_valid; ++j) {
    const int32_t idx = out[j];
    ASSERT_TRUE(idx >= 0 && idx < len) << ctx << " slot " << j << " holds " << idx;
    ASSERT_FALSE(seen[idx]) << ctx << " index " << idx << " twice";
    seen[idx] = 1;
  }
  for (int64_t j = n_valid; j < k; ++j) ASSERT_EQ(out[j], -1) << ctx << " padding slot " << j;
  if (len <= k) return;
  std::vector<uint32_t> keys(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) keys[i] = Key(row[i]);
  std::vector<uint32_t> sorted = keys;
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(),
                   std::greater<uint32_t>());
  const uint32_t kth = sorted[k - 1];
  int64_t above = 0, above_selected = 0;
  for (int64_t i = 0; i < len; ++i) above += keys[i] > kth;
  for (int64_t j = 0; j < k; ++j) {
    const uint32_t key = keys[out[j]];
    ASSERT_GE(key, kth) << ctx << " selected index " << out[j] << " is below the k-th largest";
    above_selected += key > kth;
  }
  ASSERT_EQ(above_selected, above) << ctx << " missed scores above the k-th largest";
}

class TopkRadixTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }

  void Run(const Case& c, uint32_t seed) {
    const std::string ctx =
        absl::StrCat("rows=", c.rows, " max_len=", c.max_len, " k=", c.k, " data=",
                     DataName(c.data), " lengths=", c.lengths == Lengths::kFull ? "full" : "mixed",
                     " pad=", c.stride_pad, " path=", static_cast<int>(c.path), " caps=", c.caps ? c.caps->DebugString() : "none");
    SCOPED_TRACE(ctx);
    const int64_t stride = c.max_len + c.stride_pad;
    std::mt19937 rng(seed);
    std::vector<float> scores(static_cast<size_t>(c.rows * stride));
    std::uniform_real_distribution<float> uni(-10.0f, 10.0f);
    std::uniform_int_distribution<int> few(0, 7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> pick(0, 99);
    for (int64_t r = 0; r < c.rows; ++r) {
      float* row = scores.data() + r * stride;
      for (int64_t i = 0; i < stride; ++i) {
        switch (c.data) {
          case Data::kUniform: row[i] = uni(rng); break;
          case Data::kNormal: row[i] = normal(rng); break;
          case Data::kFewValues: row[i] = static_cast<float>(few(rng)) * 0.5f; break;
          case Data::kAllEqual: row[i] = 1.25f; break;
          case Data::kSorted: row[i] = static_cast<float>(i) * 1e-3f; break;
          case Data::kSpecials: {
            const int p = pick(rng);
            row[i] = p == 0   ? std::numeric_limits<float>::quiet_NaN()
                     : p == 1 ? std::numeric_limits<float>::infinity()
                     : p == 2 ? -std::numeric_limits<float>::infinity()
                     : p == 3 ? -0.0f
                     : p == 4 ? 0.0f
                              : uni(rng);
            break;
          }
        }
      }
      if (c.stride_pad > 0) {  // padding past max_len must never be selected
        for (int64_t i = c.max_len; i < stride; ++i) row[i] = 1e30f;
      }
    }
    std::vector<int32_t> lengths(static_cast<size_t>(c.rows), static_cast<int32_t>(c.max_len));
    if (c.lengths == Lengths::kMixed) {
      const int64_t special[] = {0, 1, c.k - 1, c.k, c.k + 1, c.max_len, c.max_len - 1};
      std::uniform_int_distribution<int64_t> len_dist(0, c.max_len);
      for (int64_t r = 0; r < c.rows; ++r) {
        int64_t len = r < 7 ? special[r] : len_dist(rng);
        lengths[r] = static_cast<int32_t>(std::clamp<int64_t>(len, 0, c.max_len));
      }
    }
    // Also cover padding the kernel would read if it ignored lengths.
    for (int64_t r = 0; r < c.rows && c.lengths == Lengths::kMixed; ++r) {
      float* row = scores.data() + r * stride;
      for (int64_t i = lengths[r]; i < c.max_len; ++i) row[i] = 1e30f;
    }

    auto plan = PlanTopkForDevice(c.rows, c.max_len, c.k, c.caps, c.path);
    ASSERT_TRUE(plan.ok()) << plan.status();
    SCOPED_TRACE(plan->DebugString());
    if (c.expect_streaming) {
      EXPECT_FALSE(plan->cache_in_smem);
    }

    GuardedBuffer d_scores(scores.size() * sizeof(float));
    GuardedBuffer d_lengths(lengths.size() * sizeof(int32_t));
    GuardedBuffer d_out(static_cast<size_t>(c.rows * c.k) * sizeof(int32_t));
    GuardedBuffer d_ws(std::max<size_t>(plan->workspace_bytes, 16));
    ASSERT_TRUE(d_scores.ok() && d_lengths.ok() && d_out.ok() && d_ws.ok());
    GLM_CUDA_ASSERT(d_scores.Upload(scores.data(), d_scores.bytes()));
    GLM_CUDA_ASSERT(d_lengths.Upload(lengths.data(), d_lengths.bytes()));
    std::vector<int32_t> out(static_cast<size_t>(c.rows * c.k));
    // Twice: the second run checks the workspace reset between launches.
    for (int iter = 0; iter < 2; ++iter) {
      GLM_CUDA_ASSERT(d_out.Poison(0x5A));
      const absl::Status st = TopkRadix(
          *plan, d_scores.as<float>(), stride,
          c.lengths == Lengths::kMixed ? d_lengths.as<int32_t>() : nullptr, d_out.as<int32_t>(),
          d_ws.data(), plan->workspace_bytes, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      GLM_CUDA_ASSERT(cudaDeviceSynchronize());
      ASSERT_TRUE(d_out.GuardsIntact()) << "write outside the output";
      ASSERT_TRUE(d_ws.GuardsIntact()) << "write outside the workspace";
      GLM_CUDA_ASSERT(d_out.Download(out.data(), d_out.bytes()));
      for (int64_t r = 0; r < c.rows; ++r) {
        CheckRow(scores.data() + r * stride, lengths[r], c.k, out.data() + r * c.k,
                 absl::StrCat("iter ", iter, " row ", r));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
};

TEST_F(TopkRadixTest, ShortRows2K) {
  for (int k : {1, 17, 512, 2048}) {
    Run({.rows = 5, .max_len = 2048, .k = k}, 1 + k);
    Run({.rows = 9, .max_len = 2049, .k = k, .stride_pad = 3}, 2 + k);
    Run({.rows = 40, .max_len = 2048, .k = k, .lengths = Lengths::kMixed}, 3 + k);
  }
  Run({.rows = 1, .max_len = 1, .k = 1}, 4);
  Run({.rows = 1, .max_len = 3, .k = 8}, 5);
}

TEST_F(TopkRadixTest, Rows128K) {
  for (int k : {2048, 512, 1}) {
    Run({.rows = 1, .max_len = 131072, .k = k}, 10 + k);
    Run({.rows = 8, .max_len = 131072, .k = k, .lengths = Lengths::kMixed}, 11 + k);
  }
  Run({.rows = 3, .max_len = 131071, .k = 2048, .stride_pad = 5}, 12);
  Run({.rows = 32, .max_len = 131072, .k = 2048}, 13);
}

TEST_F(TopkRadixTest, Rows1M) {
  Run({.rows = 1, .max_len = 1048576, .k = 2048}, 20);
  Run({.rows = 8, .max_len = 1048576, .k = 2048, .lengths = Lengths::kMixed}, 21);
  Run({.rows = 2, .max_len = 1048576, .k = 512}, 22);
  Run({.rows = 33, .max_len = 1048576, .k = 2048}, 23);
}

TEST_F(TopkRadixTest, TiesAndSpecials) {
  for (Data d : {Data::kFewValues, Data::kAllEqual, Data::kSpecials, Data::kSorted}) {
    Run({.rows = 3, .max_len = 2048 + 7, .k = 2048, .data = d}, 30);
    Run({.rows = 2, .max_len = 131072, .k = 2048, .data = d}, 31);
    Run({.rows = 2, .max_len = 1048576, .k = 1024, .data = d, .lengths = Lengths::kMixed}, 32);
  }
}

TEST_F(TopkRadixTest, Gb10LikeLimits) {
  DeviceLimits gb10 = Gb10Limits();
  for (int64_t rows : {1, 8}) {
    Run({.rows = rows, .max_len = 1048576, .k = 2048, .caps = &gb10}, 40);
    Run({.rows = rows, .max_len = 131072, .k = 2048, .lengths = Lengths::kMixed, .caps = &gb10},
        41);
  }
  Run({.rows = 4, .max_len = 1048576, .k = 2048, .data = Data::kFewValues, .caps = &gb10}, 42);
}

TEST_F(TopkRadixTest, StreamingPath) {
  DeviceLimits tiny;
  tiny.num_sms = 4;
  tiny.smem_optin_per_block = 24576;
  tiny.smem_per_sm = 24576 + 1024;
  for (int64_t rows : {1, 5}) {
    Run({.rows = rows, .max_len = 1048576, .k = 2048, .caps = &tiny, .expect_streaming = true},
        50);
    Run({.rows = rows, .max_len = 1048576, .k = 2048, .data = Data::kFewValues,
         .lengths = Lengths::kMixed, .caps = &tiny, .expect_streaming = true},
        51);
  }
}

TEST_F(TopkRadixTest, ForcedPaths) {
  // Streaming with the candidate buffer (normal scores: candidates fit) and with its per-CTA
  // fallback (uniform scores: ~10 % of a chunk is still in play after pass 0); cached likewise.
  for (TopkPath path : {TopkPath::kStreaming, TopkPath::kCached}) {
    for (Data d : {Data::kNormal, Data::kUniform, Data::kFewValues}) {
      Run({.rows = 8, .max_len = 1048576, .k = 2048, .data = d, .path = path}, 60);
      Run({.rows = 3, .max_len = 131072, .k = 512, .data = d, .lengths = Lengths::kMixed,
           .path = path},
          61);
    }
    Run({.rows = 33, .max_len = 1048576, .k = 2048, .data = Data::kNormal, .path = path}, 62);
  }
}

TEST_F(TopkRadixTest, PrintsPlans) {
  for (int64_t len : {131072, 1048576}) {
    for (int64_t rows : {1, 8, 32}) {
      auto plan = PlanTopkForDevice(rows, len, 2048);
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::printf("plan: %s\n", plan->DebugString().c_str());
    }
  }
}

TEST_F(TopkRadixTest, LauncherRejectsBadInputs) {
  auto plan = PlanTopkForDevice(2, 131072, 2048);
  ASSERT_TRUE(plan.ok()) << plan.status();
  GuardedBuffer d_scores(2 * 131072 * sizeof(float));
  GuardedBuffer d_out(2 * 2048 * sizeof(int32_t));
  GuardedBuffer d_ws(plan->workspace_bytes + 16);
  std::vector<float> host(16);
  std::vector<int32_t> host_out(16);
  EXPECT_FALSE(TopkRadix(*plan, host.data(), 131072, nullptr, d_out.as<int32_t>(), d_ws.data(),
                         plan->workspace_bytes, nullptr)
                   .ok());
  EXPECT_FALSE(TopkRadix(*plan, d_scores.as<float>(), 131072, nullptr, host_out.data(),
                         d_ws.data(), plan->workspace_bytes, nullptr)
                   .ok());
  EXPECT_FALSE(TopkRadix(*plan, d_scores.as<float>(), 1000, nullptr, d_out.as<int32_t>(),
                         d_ws.data(), plan->workspace_bytes, nullptr)
                   .ok());
  if (plan->cooperative) {
    EXPECT_FALSE(TopkRadix(*plan, d_scores.as<float>(), 131072, nullptr, d_out.as<int32_t>(),
                           d_ws.data(), plan->workspace_bytes - 1, nullptr)
                     .ok());
  }
  TopkPlan bogus;
  EXPECT_FALSE(TopkRadix(bogus, d_scores.as<float>(), 131072, nullptr, d_out.as<int32_t>(),
                         d_ws.data(), 0, nullptr)
                   .ok());
}

}  // namespace
}  // namespace glm::kernels
