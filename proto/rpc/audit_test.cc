#include "proto/rpc/audit.h"

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::rpc {
namespace {

TEST(Audit, NoAuthContextIsInsecure) { EXPECT_EQ(IdentityFromAuthContext(nullptr), "insecure"); }

TEST(Audit, FormatsOkAndErrorOutcomes) {
  EXPECT_EQ(FormatAudit("Up", "insecure", "ipv4:127.0.0.1:5000", absl::OkStatus(), "replicas=1"),
            "audit action=Up who=insecure peer=ipv4:127.0.0.1:5000 outcome=ok replicas=1");
  EXPECT_EQ(FormatAudit("StopShard", "glmctl", "ipv4:10.0.0.1:1",
                        absl::FailedPreconditionError("no shard \"s0\""), ""),
            "audit action=StopShard who=glmctl peer=ipv4:10.0.0.1:1 outcome=FAILED_PRECONDITION "
            "error=\"no shard \\\"s0\\\"\"");
}

TEST(Audit, IdentityCannotForgeFieldsOrLines) {
  const std::string line =
      FormatAudit("Down", "evil who=admin\nfake", "p", absl::OkStatus(), "");
  EXPECT_EQ(line, "audit action=Down who=\"evil who=adminfake\" peer=p outcome=ok");
}

}  // namespace
}  // namespace glm::rpc
