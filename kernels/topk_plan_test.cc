// PlanTopk never asks for more than the device gives and always covers the row: checked for
// GB10 (99 KiB opt-in smem, 48 SMs), H200 (227 KiB, 132 SMs), H200 capped to 99 KiB and a small
// device that forces the streaming path. Runs on the CPU.
#include "kernels/topk_plan.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/device_limits.h"

namespace glm::kernels {
namespace {

DeviceLimits TinyLimits() {
  DeviceLimits l;
  l.num_sms = 4;
  l.smem_optin_per_block = 24576;
  l.smem_per_sm = 24576 + 1024;
  l.max_threads_per_sm = 1024;
  return l;
}

void ExpectPlanFits(const DeviceLimits& l, const TopkPlan& p, const std::string& ctx) {
  SCOPED_TRACE(ctx + " plan: " + p.DebugString());
  EXPECT_GE(p.blocks_per_sm, 1);
  EXPECT_LE(p.smem_bytes, l.smem_optin_per_block);
  EXPECT_GE(p.smem_bytes, kTopkFixedSmemBytes);
  EXPECT_LE(int64_t{p.blocks_per_sm} * kTopkThreads, l.max_threads_per_sm);
  if (l.max_blocks_per_sm_cap > 0) {
    EXPECT_LE(p.blocks_per_sm, l.max_blocks_per_sm_cap);
  }
  EXPECT_LE(int64_t{p.blocks_per_sm} * (p.smem_bytes + l.reserved_smem_per_block), l.smem_per_sm);
  EXPECT_EQ(p.chunk % 4, 0);
  EXPECT_GE(p.ctas_per_group, 1);
  EXPECT_GE(int64_t{p.ctas_per_group} * p.chunk, p.max_len) << "row not covered";
  EXPECT_LT(int64_t{p.ctas_per_group - 1} * p.chunk, p.max_len) << "an idle CTA per group";
  if (p.max_len > p.k) {
    EXPECT_GE(p.smem_bytes,
              kTopkFixedSmemBytes + 8 * p.candidates + (p.cache_in_smem ? 4 * p.chunk : 0));
  }
  EXPECT_EQ(p.candidates % 32, 0);
  if (p.cooperative) {
    EXPECT_GT(p.ctas_per_group, 1);
    EXPECT_LE(p.total_ctas, int64_t{l.num_sms} * p.blocks_per_sm) << "would oversubscribe";
    EXPECT_EQ(p.total_ctas, p.num_groups * p.ctas_per_group);
    EXPECT_GE(p.num_groups, 1);
    EXPECT_LE(p.num_groups, p.rows);
    EXPECT_EQ(p.workspace_bytes, static_cast<size_t>(p.rows) * kTopkRowStateBytes);
  } else {
    EXPECT_EQ(p.ctas_per_group, 1);
    EXPECT_EQ(p.num_groups, p.rows);
    EXPECT_EQ(p.total_ctas, p.rows);
    EXPECT_EQ(p.workspace_bytes, 0u);
  }
}

struct NamedLimits {
  const char* name;
  DeviceLimits limits;
};

TEST(TopkPlanTest, NeverExceedsLimitsAndCoversTheRow) {
  DeviceLimits h200_reg2 = H200Limits();
  h200_reg2.max_blocks_per_sm_cap = 2;  // what the register count allows for the real kernel
  DeviceLimits gb10_reg1 = Gb10Limits();
  gb10_reg1.max_blocks_per_sm_cap = 1;
  const NamedLimits devices[] = {
      {"gb10", Gb10Limits()},
      {"gb10_reg1", gb10_reg1},
      {"h200", H200Limits()},
      {"h200_reg2", h200_reg2},
      {"h200_cap99k", CapDeviceLimits(H200Limits(), 101376, 0)},
      {"h200_cap99k_48sms", CapDeviceLimits(H200Limits(), 101376, 48)},
      {"tiny", TinyLimits()},
  };
  const int64_t lens[] = {1, 100, 2047, 2048, 2049, 4096, 4097, 8191, 32768, 131072, 131075,
                          1048576, 4194304};
  const int64_t rows_list[] = {1, 2, 8, 32, 33, 1000};
  const int ks[] = {1, 64, 512, 2048};
  for (const auto& d : devices) {
    for (int64_t len : lens) {
      for (int64_t rows : rows_list) {
        for (int k : ks) {
          const std::string ctx =
              absl::StrCat(d.name, " rows=", rows, " len=", len, " k=", k);
          auto plan = PlanTopk(d.limits, rows, len, k);
          ASSERT_TRUE(plan.ok()) << ctx << ": " << plan.status();
          ExpectPlanFits(d.limits, *plan, ctx);
        }
      }
    }
  }
}

TEST(TopkPlanTest, LongRowsOnGb10AreCooperativeAndCached) {
  // The vLLM persistent top-k failure case (spec §6.2): 1M columns on 99 KiB / 48 SMs.
  for (int64_t rows : {1, 8, 32}) {
    auto p = PlanTopk(Gb10Limits(), rows, 1048576, 2048);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(p->cooperative) << p->DebugString();
    EXPECT_TRUE(p->cache_in_smem) << p->DebugString();
    EXPECT_LE(p->total_ctas, 48 * p->blocks_per_sm) << p->DebugString();
    std::printf("gb10 rows=%lld len=1048576: %s\n", static_cast<long long>(rows),
                p->DebugString().c_str());
  }
}

TEST(TopkPlanTest, H200PlansAtTheBriefSizes) {
  for (int64_t len : {2048, 131072, 1048576}) {
    for (int64_t rows : {1, 8, 32}) {
      auto p = PlanTopk(H200Limits(), rows, len, 2048);
      ASSERT_TRUE(p.ok()) << p.status();
      std::printf("h200 rows=%lld len=%lld: %s\n", static_cast<long long>(rows),
                  static_cast<long long>(len), p->DebugString().c_str());
      if (len == 2048) {
        EXPECT_FALSE(p->cooperative);  // len <= k: identity, one CTA per row
      } else if (len == 1048576 && rows == 32) {
        // 128 MB of keys would take 7 rounds of cached rows: with 4 CTAs/SM (no register cap)
        // every row streams at once, 16 CTAs x 65,536 columns.
        EXPECT_FALSE(p->cache_in_smem);
        EXPECT_EQ(p->num_groups, 32);
        EXPECT_GT(p->candidates, 0);
        EXPECT_LE(p->chunk, kTopkStreamMaxChunk);
      } else {
        EXPECT_TRUE(p->cache_in_smem);
      }
    }
  }
}

TEST(TopkPlanTest, AutoStreamsOnlyShortChunks) {
  // The real H200 kernel keeps 2 CTAs/SM (registers): 32 rows x 1M would stream 131,072 columns
  // per CTA, which measured slower than cached rounds, so the plan stays cached.
  DeviceLimits h200 = H200Limits();
  h200.max_blocks_per_sm_cap = 2;
  auto p = PlanTopk(h200, 32, 1048576, 2048);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->cache_in_smem) << p->DebugString();
  // GB10-capped 32 x 128K: 3 CTAs x 43,692 columns per row, all rows at once.
  DeviceLimits gb10 = CapDeviceLimits(H200Limits(), 101376, 48);
  gb10.max_blocks_per_sm_cap = 2;
  p = PlanTopk(gb10, 32, 131072, 2048);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->cache_in_smem) << p->DebugString();
  EXPECT_EQ(p->num_groups, 32);
  // Forced paths are honoured.
  p = PlanTopk(h200, 8, 1048576, 2048, TopkPath::kStreaming);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->cache_in_smem);
  p = PlanTopk(gb10, 32, 131072, 2048, TopkPath::kCached);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->cache_in_smem);
}

TEST(TopkPlanTest, SmallDeviceFallsBackToStreaming) {
  auto p = PlanTopk(TinyLimits(), 1, 1048576, 2048);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->cache_in_smem) << p->DebugString();
  // 24 KiB holds only the smallest streaming candidate buffer.
  EXPECT_EQ(p->candidates, kTopkStreamCandidates / 2);
  EXPECT_EQ(p->smem_bytes, kTopkFixedSmemBytes + 8 * p->candidates);
  ExpectPlanFits(TinyLimits(), *p, "tiny 1M");
}

TEST(TopkPlanTest, ShortRowsUseOneCtaPerRow) {
  auto p = PlanTopk(H200Limits(), 5000, 3000, 512);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->cooperative);
  EXPECT_EQ(p->total_ctas, 5000);
  EXPECT_TRUE(p->cache_in_smem);
}

TEST(TopkPlanTest, RejectsBadArguments) {
  EXPECT_FALSE(PlanTopk(H200Limits(), 0, 10, 1).ok());
  EXPECT_FALSE(PlanTopk(H200Limits(), 1, 0, 1).ok());
  EXPECT_FALSE(PlanTopk(H200Limits(), 1, 10, 0).ok());
  DeviceLimits none;
  EXPECT_FALSE(PlanTopk(none, 1, 10, 1).ok());
}

TEST(DeviceLimitsTest, CapsOnlyLower) {
  const DeviceLimits c = CapDeviceLimits(H200Limits(), 101376, 48);
  EXPECT_EQ(c.smem_optin_per_block, 101376);
  EXPECT_EQ(c.smem_per_sm, 101376 + 1024);
  EXPECT_EQ(c.num_sms, 48);
  const DeviceLimits g = CapDeviceLimits(Gb10Limits(), 1 << 30, 1000);
  EXPECT_EQ(g.smem_optin_per_block, Gb10Limits().smem_optin_per_block);
  EXPECT_EQ(g.num_sms, 48);
}

TEST(DeviceLimitsTest, EnvCaps) {
  setenv("GLM_KERNELS_SMEM_CAP_BYTES", "101376", 1);
  setenv("GLM_KERNELS_MAX_SMS", "bogus", 1);
  std::string warning;
  const DeviceLimits c = ApplyEnvCaps(H200Limits(), &warning);
  unsetenv("GLM_KERNELS_SMEM_CAP_BYTES");
  unsetenv("GLM_KERNELS_MAX_SMS");
  EXPECT_EQ(c.smem_optin_per_block, 101376);
  EXPECT_EQ(c.num_sms, 132);
  EXPECT_NE(warning.find("GLM_KERNELS_MAX_SMS"), std::string::npos) << warning;
}

}  // namespace
}  // namespace glm::kernels
