// kernels/moe.h launcher checks that run without a GPU: every bad argument is InvalidArgument
// naming the op before anything touches the device, and a forced path outside its limits is
// FailedPrecondition naming the path. The kernels themselves are compared with the CPU backend
// and the tiled reference through every path in engine/backend/cuda/cuda_moe_test.
#include "kernels/moe.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace glm::kernels {
namespace {

// Never dereferenced on the host: the checks below fail before any launch.
const MoeExpert* FakeDeviceTable() { return reinterpret_cast<const MoeExpert*>(uintptr_t{4096}); }

class NoWorkspace : public MoeWorkspace {
 public:
  absl::StatusOr<void*> Get(int, size_t) override {
    ADD_FAILURE() << "a rejected call asked for workspace";
    return absl::InternalError("no workspace");
  }
};

struct Fixture {
  MoeExpertTable table;
  alignas(16) float x[8 * 64] = {};
  float out[8 * 64] = {};
  int32_t ids[64] = {};
  float weights[64] = {};
  MoeArgs args;
  Fixture(MoeWeightType type, bool rows16) {
    table.device = FakeDeviceTable();
    table.num_experts = 16, table.hidden = 64, table.inter = 32, table.type = type;
    table.rows16 = rows16;
    args.x = x, args.x_ld = 64, args.tokens = 8, args.ids = ids, args.weights = weights;
    args.top_k = 8, args.experts = &table, args.out = out, args.out_ld = 64;
  }
};

absl::Status RunMoe(const MoeArgs& args, MoePolicy::Path path = MoePolicy::Path::kAuto) {
  KernelPolicy policy;
  policy.moe.path = path;
  NoWorkspace ws;
  return MoeExperts(args, policy, ws, nullptr);
}

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& part) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find("MoeExperts"), std::string::npos) << s;
  EXPECT_NE(s.message().find(part), std::string::npos) << s;
}

TEST(MoeExpertsChecks, NoTokensIsANoOp) {
  Fixture f(MoeWeightType::kF32, true);
  f.args.tokens = 0;
  f.args.experts = nullptr;
  EXPECT_TRUE(RunMoe(f.args).ok());
}

TEST(MoeExpertsChecks, RejectsBadArguments) {
  {
    Fixture f(MoeWeightType::kF32, true);
    f.args.experts = nullptr;
    ExpectError(RunMoe(f.args), absl::StatusCode::kInvalidArgument, "expert table");
  }
  {
    Fixture f(MoeWeightType::kF32, true);
    f.args.top_k = 0;
    ExpectError(RunMoe(f.args), absl::StatusCode::kInvalidArgument, "top_k 0");
  }
  {
    Fixture f(MoeWeightType::kF32, true);
    f.table.num_experts = kMoeMaxExperts + 1;
    ExpectError(RunMoe(f.args), absl::StatusCode::kInvalidArgument, "num_experts at most 1024");
  }
  {
    Fixture f(MoeWeightType::kF32, true);
    f.args.tokens = int64_t{1} << 29;  // x 8 pairs: 2^32
    ExpectError(RunMoe(f.args), absl::StatusCode::kInvalidArgument, "exceed 2^31 - 1");
  }
  {
    Fixture f(MoeWeightType::kF32, true);
    f.args.x = f.x + 1;  // 4-byte aligned only
    ExpectError(RunMoe(f.args), absl::StatusCode::kInvalidArgument, "16-byte aligned");
  }
  {
    Fixture f(MoeWeightType::kF32, true);
    f.args.x_ld = 62;
    ExpectError(RunMoe(f.args), absl::StatusCode::kInvalidArgument, "multiples of 4");
  }
  {
    Fixture f(MoeWeightType::kF32, true);
    f.table.inter = 30;
    ExpectError(RunMoe(f.args), absl::StatusCode::kInvalidArgument, "moe_inter (30)");
  }
}

TEST(MoeExpertsChecks, RejectsBadRouting) {
  Fixture f(MoeWeightType::kF32, true);
  MoeRouting r;
  r.logits = f.x, r.logits_ld = 16, r.logits_rows = 7, r.num_routed = 16, r.top_k = 8;
  r.ids = f.ids, r.weights = f.weights;
  f.args.route = &r;
  const absl::Status s = RunMoe(f.args);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("MoeRouteExperts: logits has 7 rows for 8 tokens"),
            std::string::npos)
      << s;
}

TEST(MoeExpertsChecks, ForcedPathOutsideItsLimitsNamesIt) {
  using Path = MoePolicy::Path;
  {
    Fixture f(MoeWeightType::kF8E4M3Block128, true);
    f.args.top_k = 9;  // 72 pairs
    ExpectError(RunMoe(f.args, Path::kDecode), absl::StatusCode::kFailedPrecondition,
                "Path::kDecode cannot run 72");
  }
  {
    Fixture f(MoeWeightType::kBF16, true);
    ExpectError(RunMoe(f.args, Path::kMma), absl::StatusCode::kFailedPrecondition, "fp8 weights");
  }
  {
    Fixture f(MoeWeightType::kF32, /*rows16=*/false);
    ExpectError(RunMoe(f.args, Path::kGrouped), absl::StatusCode::kFailedPrecondition,
                "16-byte weight rows");
  }
}

TEST(MoeExpertTableFor, RejectsBadTablesBeforeTheDevice) {
  std::vector<MoeExpert> experts(2, MoeExpert{});
  auto r = MoeExpertTableFor(nullptr, experts.data(), 0, 64, 32, MoeWeightType::kF32, nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  r = MoeExpertTableFor(nullptr, nullptr, 2, 64, 32, MoeWeightType::kF32, nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  r = MoeExpertTableFor(nullptr, experts.data(), kMoeMaxExperts + 1, 64, 32, MoeWeightType::kF32,
                        nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
}

}  // namespace
}  // namespace glm::kernels
