// kernels/dsa_indexer: the launchers' input checks (no GPU needed: they come before any CUDA
// call), and the select paths on given scores against a host reference of the tie rules (GPU;
// skips without one). The whole op against the CPU backend, fp8 keys and graph replay:
// engine/backend/cuda/cuda_indexer_test.cc.
#include "kernels/dsa_indexer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/gpu_test_util.h"
#include "kernels/testing/dsa_indexer_reference.h"

namespace glm::kernels {
namespace {

using testing::GuardedBuffer;

// A workspace that must not be asked for memory (the checks come first).
absl::StatusOr<void*> NoWorkspace(int slot, size_t bytes) {
  ADD_FAILURE() << "workspace asked for slot " << slot << " (" << bytes << " bytes)";
  return absl::InternalError("no workspace");
}

TEST(DsaIndexerArgsTest, TopKRejectsBadShapes) {
  alignas(16) static float keys[64] = {};
  alignas(16) static uint8_t cache[256] = {};
  static int32_t nk[1] = {100};
  DsaIndexerArgs a;
  a.rows = 1;
  a.heads = 32;
  a.dim = 128;
  a.keys = keys;
  a.keys_ld = 128;
  a.row_num_keys = nk;
  a.max_num_keys = 100;
  a.top_k = 16;
  struct Case {
    const char* name;
    void (*edit)(DsaIndexerArgs&);
    const char* message;
  };
  const Case cases[] = {
      {"dim not a multiple of 4", [](DsaIndexerArgs& x) { x.dim = 130; }, "multiples of 4"},
      {"key stride not a multiple of 4", [](DsaIndexerArgs& x) { x.keys_ld = 130; },
       "multiples of 4"},
      {"misaligned fp32 keys", [](DsaIndexerArgs& x) { x.keys = keys + 1; }, "aligned"},
      {"fp8 block_size 0",
       [](DsaIndexerArgs& x) {
         x.keys_fp8 = cache;
         x.block_size = 0;
       },
       "block_size"},
      {"misaligned fp8 cache",
       [](DsaIndexerArgs& x) {
         x.keys_fp8 = cache + 4;
         x.block_size = 64;
       },
       "aligned"},
      {"fp8 dim not a multiple of 4",
       [](DsaIndexerArgs& x) {
         x.keys_fp8 = cache;
         x.block_size = 64;
         x.dim = 6;
       },
       "multiple of 4"},
      {"rows past 2^31 - 1", [](DsaIndexerArgs& x) { x.rows = int64_t{1} << 31; }, "rows"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    DsaIndexerArgs x = a;
    c.edit(x);
    const absl::Status st = DsaIndexerTopK(x, IndexerPolicy{}, 0, NoWorkspace, nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("DsaIndexerTopK"), absl::string_view::npos) << st;
    EXPECT_NE(st.message().find(c.message), absl::string_view::npos) << st;
  }
  // Nothing to do: no check, no launch.
  DsaIndexerArgs empty = a;
  empty.rows = 0;
  empty.dim = 3;
  EXPECT_TRUE(DsaIndexerTopK(empty, IndexerPolicy{}, 0, NoWorkspace, nullptr).ok());
}

TEST(DsaIndexerArgsTest, SelectRejectsBadScoreLayout) {
  alignas(16) static float scores[16] = {};
  auto select = [&](const float* s, int64_t ld, int32_t max_num_keys) {
    return DsaIndexerSelect(s, ld, /*rows=*/1, nullptr, max_num_keys, /*top_k=*/2, nullptr,
                            IndexerPolicy{}, 0, NoWorkspace, nullptr);
  };
  for (const absl::Status& st : {select(scores, 6, 6), select(scores, 8, 9),
                                 select(scores + 1, 8, 8)}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("DsaIndexerSelect"), absl::string_view::npos) << st;
    EXPECT_NE(st.message().find("multiple of 4"), absl::string_view::npos) << st;
  }
}

using ::glm::kernels::testing::RefTopK;

class DsaIndexerSelectTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
  ~DsaIndexerSelectTest() override {
    for (void* p : workspace_) cudaFree(p);
  }

  absl::StatusOr<void*> Workspace(int slot, size_t bytes) {
    if (bytes > workspace_bytes_[slot]) {
      cudaFree(workspace_[slot]);
      workspace_[slot] = nullptr;
      if (cudaMalloc(&workspace_[slot], bytes) != cudaSuccess) {
        return absl::ResourceExhaustedError("cudaMalloc");
      }
      workspace_bytes_[slot] = bytes;
    }
    return workspace_[slot];
  }

  // Rows of n_t <= max_keys scores with many ties and special values; every select path (forced
  // through the policy) and the choice by shape must give the reference's output.
  void Check(int rows, int max_keys, int top_k) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " max_keys " << max_keys << " top_k "
                                      << top_k);
    const int64_t ld = (max_keys + 3) / 4 * 4;
    std::vector<float> s(static_cast<size_t>(rows) * ld, 0.f);
    std::vector<int32_t> nk(rows);
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::infinity(), -0.f, 0.f, 0.5f};
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::uniform_int_distribution<int> pick(0, 15);
    for (int t = 0; t < rows; ++t) {
      nk[t] = t == 0 ? max_keys : std::max(1, max_keys - 97 * t);
      for (int i = 0; i < nk[t]; ++i) {
        const int k = pick(rng_);
        s[size_t(t) * ld + i] = k < 6 ? specials[k] : u(rng_);
      }
    }
    std::vector<int32_t> want;
    for (int t = 0; t < rows; ++t) {
      const std::vector<int32_t> r = RefTopK(s.data() + size_t(t) * ld, nk[t], top_k);
      want.insert(want.end(), r.begin(), r.end());
    }
    GuardedBuffer ds(s.size() * 4), dnk(nk.size() * 4), dout(want.size() * 4);
    ASSERT_EQ(ds.Upload(s.data(), s.size() * 4), cudaSuccess);
    ASSERT_EQ(dnk.Upload(nk.data(), nk.size() * 4), cudaSuccess);
    using Select = IndexerPolicy::Select;
    for (const Select path : {Select::kByShape, Select::kSingleCta, Select::kMultiCta,
                              Select::kShortRow}) {
      SCOPED_TRACE(static_cast<int>(path));
      IndexerPolicy policy;
      policy.select = path;
      ASSERT_EQ(dout.Poison(0x7B), cudaSuccess);
      DsaIndexerLaunch launched;
      const absl::Status st = DsaIndexerSelect(
          ds.as<float>(), ld, rows, dnk.as<int32_t>(), max_keys, top_k, dout.as<int32_t>(),
          policy, 0, [this](int slot, size_t bytes) { return Workspace(slot, bytes); }, nullptr,
          &launched);
      ASSERT_TRUE(st.ok()) << st;
      GLM_CUDA_ASSERT(cudaDeviceSynchronize());
      // A forced path runs only when some row has more keys than top_k; otherwise every row is
      // copied whole and the launch reports kByShape (no select ran).
      if (max_keys <= top_k) {
        EXPECT_EQ(launched.select, Select::kByShape);
      } else if (path == Select::kSingleCta || path == Select::kMultiCta) {
        EXPECT_EQ(launched.select, path);
      }
      std::vector<int32_t> got(want.size());
      ASSERT_EQ(dout.Download(got.data(), got.size() * 4), cudaSuccess);
      EXPECT_TRUE(dout.GuardsIntact());
      EXPECT_TRUE(got == want) << "differs from the host reference";
    }
  }

  void* workspace_[2] = {nullptr, nullptr};
  size_t workspace_bytes_[2] = {0, 0};
  std::mt19937 rng_{5};
};

TEST_F(DsaIndexerSelectTest, PathsMatchReference) {
  for (const int keys : {1, 100, 2049, 4096, 16385, 40000}) Check(3, keys, 2048);
  Check(1, 5000, 1);
  Check(8, 3000, 100);
}

}  // namespace
}  // namespace glm::kernels
