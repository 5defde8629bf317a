#include "agent/service/node_preflight.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "agent/stage/nccl_loader.h"
#include "cluster/manifest/file_hash.h"

namespace glm::agent {

glm::v1::NcclLibraryState InspectNcclLibrary(const std::string& path) {
  glm::v1::NcclLibraryState state;
  state.set_path(path);
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    state.set_error("no such file");
    return state;
  }
  state.set_present(true);
  if (absl::StatusOr<cluster::FileHash> h = cluster::HashFile(path); h.ok()) {
    state.set_xxh3_128(h->xxh3_128);
    state.set_size(static_cast<int64_t>(h->size));
  }
  absl::StatusOr<std::unique_ptr<stage::NcclLibrary>> lib = stage::NcclLibrary::Load(path, "");
  if (lib.ok()) {
    state.set_version((*lib)->version());
  } else {
    state.set_error(std::string(lib.status().message()));
  }
  return state;
}

glm::v1::Check ToProto(const preflight::CheckResult& c) {
  glm::v1::Check out;
  out.set_id(c.id);
  switch (c.status) {
    case preflight::CheckStatus::kPass: out.set_status(glm::v1::CHECK_STATUS_PASS); break;
    case preflight::CheckStatus::kWarn: out.set_status(glm::v1::CHECK_STATUS_WARN); break;
    case preflight::CheckStatus::kFail: out.set_status(glm::v1::CHECK_STATUS_FAIL); break;
  }
  out.set_message(c.message);
  out.set_evidence(c.evidence);
  out.set_fix(c.fix);
  return out;
}

glm::v1::GidEntry ToProto(const preflight::GidEntry& e) {
  glm::v1::GidEntry out;
  out.set_hca(e.hca);
  out.set_port(e.port);
  out.set_index(e.index);
  out.set_gid(preflight::FormatGid(e.gid));
  out.set_type(e.type);
  out.set_netdev(e.netdev);
  return out;
}

NodePreflightOutcome RunAgentNodePreflight(const std::string& node,
                                           const glm::v1::PreflightRequest& req,
                                           const preflight::SystemRoots& roots, bool require_gpu) {
  preflight::PreflightOptions options;
  options.node.name = node;
  options.node.fabric_ip = req.fabric_ip();
  options.node.hca = req.hca();
  options.node.port = req.hca_port() > 0 ? req.hca_port() : 1;
  if (!req.gid_index_auto()) options.node.gid_index = req.gid_index();
  options.node.netdev = req.netdev();
  options.node.nccl_library = req.nccl_library();
  options.node.nccl_expected_version = req.nccl_expected_version();
  options.nccl_stageable = req.nccl_stage_if_missing();
  options.node.fabric_mtu = req.fabric_mtu();
  options.roots = roots;
  options.require_gpu = require_gpu;
  options.disk_path = "/";
  std::vector<std::string> no_responder;
  for (const auto& peer : req.mtu_peers()) {
    if (peer.fabric_ip().empty()) continue;
    if (peer.port() <= 0 || peer.port() > 65535) {
      no_responder.push_back(peer.node());
      continue;
    }
    options.mtu_peers.push_back(
        {peer.node(), peer.fabric_ip(), static_cast<uint16_t>(peer.port())});
  }
  preflight::PreflightReport report = preflight::RunNodePreflight(options);

  NodePreflightOutcome out;
  const bool rdma = !req.hca().empty();
  for (preflight::CheckResult& c : report.checks) {
    // The host checks (host.memory.available, host.disk.free) measure these against the plan.
    if (c.id == "mem.free" || c.id == "disk.free") continue;
    if (!rdma && c.status == preflight::CheckStatus::kFail &&
        (c.id == "memlock" || c.id == "cap_ipc_lock")) {
      c.status = preflight::CheckStatus::kWarn;
      c.message += " (no RDMA fabric is configured for this node, so nothing needs pinned memory)";
    }
    out.checks.push_back(ToProto(c));
  }
  for (const auto& peer : no_responder) {
    glm::v1::Check c;
    c.set_id("mtu.path");
    c.set_status(glm::v1::CHECK_STATUS_WARN);
    c.set_message(absl::StrCat("path MTU to ", peer, " not probed: its agent serves no UDP echo "
                                                     "responder"));
    c.set_fix(absl::StrCat("start the agent of ", peer, " with --fabric-ip <its fabric IP>"));
    out.checks.push_back(std::move(c));
  }
  out.gid = report.gid;
  if (!req.nccl_library().empty()) out.nccl = InspectNcclLibrary(req.nccl_library());
  if (rdma) {
    out.gid_input = preflight::GidCheckInput{node,          req.hca(),
                                             options.node.port, options.node.gid_index,
                                             req.fabric_ip(), req.netdev()};
  }
  return out;
}

}  // namespace glm::agent
