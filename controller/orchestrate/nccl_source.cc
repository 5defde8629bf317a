#include "controller/orchestrate/nccl_source.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace glm::orchestrate {
namespace {

// The suffixes agent/preflight adds to nccl.version when staging is on (CheckNcclVersion).
constexpr const char* kMissingSuffix =
    " is missing; will be staged from a node holding the pinned build (hash and version are "
    "verified in the Stage phase)";
constexpr const char* kReplacedSuffix = "; will be replaced by the pinned build in the Stage phase";

glm::v1::Check* FindCheck(glm::v1::PreflightResponse* resp, const std::string& id) {
  for (auto& c : *resp->mutable_checks()) {
    if (c.id() == id) return &c;
  }
  return nullptr;
}

}  // namespace

bool NcclStagePlan::Holds(const std::string& node) const {
  return std::find(holders.begin(), holders.end(), node) != holders.end();
}

std::string NcclStagePlan::HoldersExcept(const std::string& node) const {
  std::vector<std::string> out;
  for (const auto& h : holders) {
    if (h != node) out.push_back(h);
  }
  return absl::StrJoin(out, ", ");
}

NcclStagePlan ApplyNcclStaging(const ClusterTopology& topology,
                               const std::optional<NcclSourceFile>& controller_copy,
                               std::map<std::string, glm::v1::PreflightResponse>* responses) {
  NcclStagePlan plan;
  if (topology.nccl_library.empty()) return plan;
  const std::string& want = topology.nccl_expected_version;
  if (controller_copy && !controller_copy->xxh3_128.empty()) {
    plan.expected_hash = controller_copy->xxh3_128;
    plan.size = controller_copy->size;
    plan.source = absl::StrCat("the controller's copy ", controller_copy->path);
  } else {
    for (const auto& node : topology.nodes) {
      auto it = responses->find(node.name);
      if (it == responses->end() || !it->second.has_nccl()) continue;
      const glm::v1::NcclLibraryState& st = it->second.nccl();
      if (st.xxh3_128().empty() || st.version().empty()) continue;
      if (!want.empty() && st.version() != want) continue;
      plan.expected_hash = st.xxh3_128();
      plan.size = static_cast<uint64_t>(st.size());
      plan.source = absl::StrCat(node.name, "'s copy ", st.path());
      break;
    }
  }
  if (!plan.expected_hash.empty()) {
    for (const auto& node : topology.nodes) {
      auto it = responses->find(node.name);
      if (it != responses->end() && it->second.nccl().xxh3_128() == plan.expected_hash) {
        plan.holders.push_back(node.name);
      }
    }
  }
  const std::string version = want.empty() ? std::string("the pinned NCCL build")
                                           : absl::StrCat("NCCL ", want);
  for (const auto& node : topology.nodes) {
    auto it = responses->find(node.name);
    if (it == responses->end()) continue;
    glm::v1::PreflightResponse& resp = it->second;
    glm::v1::Check* check = FindCheck(&resp, "nccl.version");
    if (check == nullptr) continue;
    const glm::v1::NcclLibraryState& st = resp.nccl();
    const std::string path = st.path().empty() ? topology.nccl_library : st.path();
    std::string base = check->message();
    bool staged_warning = false;
    for (const char* suffix : {kMissingSuffix, kReplacedSuffix}) {
      if (absl::EndsWith(base, suffix)) {
        base.resize(base.size() - std::string(suffix).size());
        staged_warning = true;
      }
    }
    if (staged_warning && absl::EndsWith(check->message(), kMissingSuffix)) {
      base = absl::StrCat(base, " is missing");
    }
    const std::string fix = absl::StrCat(
        "install ", version, " at ", path, " on one node (the Stage phase copies it to the "
        "others), or point nccl.source at the pinned build on the controller's host");
    if (plan.Holds(node.name)) {
      if (staged_warning) {  // this copy *is* the pinned build: staging cannot change it
        check->set_status(glm::v1::CHECK_STATUS_FAIL);
        check->set_message(absl::StrCat(node.name, ": ", base, " (this copy is the pinned build, ",
                                        plan.source, ", so staging cannot fix it)"));
        if (check->fix().empty()) check->set_fix(fix);
      }
      continue;
    }
    std::string what;
    if (!st.present()) {
      what = absl::StrCat(path, " is missing");
    } else if (check->status() == glm::v1::CHECK_STATUS_PASS) {
      what = absl::StrCat(path, " (NCCL ", st.version(), ", xxh3_128 ", st.xxh3_128(),
                          ") differs from the pinned build");
    } else {
      what = base;
    }
    const std::string from = plan.HoldersExcept(node.name);
    if (!plan.expected_hash.empty() && !from.empty()) {
      check->set_status(glm::v1::CHECK_STATUS_WARN);
      check->set_message(absl::StrCat(what, "; will be staged from ", from, " (", plan.source,
                                      "; hash and version are verified in the Stage phase)"));
      check->clear_fix();
      continue;
    }
    check->set_status(glm::v1::CHECK_STATUS_FAIL);
    check->set_message(absl::StrCat(
        what, "; no node holds the pinned build to stage from (",
        plan.expected_hash.empty()
            ? absl::StrCat("no copy on the controller's host and no node's ", path, " loads as ",
                           version)
            : absl::StrCat(plan.source, ", xxh3_128 ", plan.expected_hash),
        ")"));
    check->set_fix(fix);
  }
  for (auto& [name, resp] : *responses) {
    bool ok = true;
    for (const auto& c : resp.checks()) ok = ok && c.status() != glm::v1::CHECK_STATUS_FAIL;
    resp.set_ok(ok);
  }
  return plan;
}

}  // namespace glm::orchestrate
