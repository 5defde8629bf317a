#include "agent/preflight/check.h"

#include "absl/strings/str_cat.h"
#include "agent/preflight/gid.h"

namespace glm::preflight {

const char* CheckStatusName(CheckStatus status) {
  switch (status) {
    case CheckStatus::kPass: return "pass";
    case CheckStatus::kWarn: return "warn";
    case CheckStatus::kFail: return "fail";
  }
  return "fail";
}

std::string GidEntry::Describe() const {
  std::string out = absl::StrCat(hca, " port ", port, " index ", index, " gid ", FormatGid(gid));
  absl::StrAppend(&out, " (", type.empty() ? "no type" : type, ", ",
                  netdev.empty() ? "no netdev" : netdev, ")");
  return out;
}

bool PreflightReport::ok() const {
  for (const CheckResult& c : checks) {
    if (c.status == CheckStatus::kFail) return false;
  }
  return true;
}

const CheckResult* PreflightReport::Find(const std::string& id) const {
  for (const CheckResult& c : checks) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

nlohmann::json PreflightReport::ToJson() const {
  nlohmann::json out;
  out["node"] = node;
  out["ok"] = ok();
  nlohmann::json list = nlohmann::json::array();
  for (const CheckResult& c : checks) {
    list.push_back({{"id", c.id},
                    {"status", CheckStatusName(c.status)},
                    {"message", c.message},
                    {"evidence", c.evidence},
                    {"fix", c.fix}});
  }
  out["checks"] = std::move(list);
  if (gid.has_value()) {
    out["gid"] = {{"hca", gid->hca},   {"port", gid->port}, {"index", gid->index},
                  {"gid", gid->gid},   {"type", gid->type}, {"netdev", gid->netdev}};
  } else {
    out["gid"] = nullptr;
  }
  return out;
}

std::string PreflightReport::ToText() const {
  std::string out = absl::StrCat("preflight node=", node, "\n");
  for (const CheckResult& c : checks) {
    absl::StrAppend(&out, "  [", CheckStatusName(c.status), "] ", c.id, ": ", c.message, "\n");
    if (c.status != CheckStatus::kPass && !c.fix.empty()) {
      absl::StrAppend(&out, "         fix: ", c.fix, "\n");
    }
  }
  if (gid.has_value()) absl::StrAppend(&out, "  gid: ", gid->Describe(), "\n");
  absl::StrAppend(&out, ok() ? "result: ok\n" : "result: FAILED\n");
  return out;
}

}  // namespace glm::preflight
