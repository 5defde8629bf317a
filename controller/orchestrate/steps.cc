#include "controller/orchestrate/steps.h"

#include <algorithm>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace glm::orchestrate {
namespace {

double Seconds(Clock::Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

absl::Status ValidateStep::Run(BringUpContext& ctx) {
  absl::StatusOr<ClusterTopology> topology = loader_();
  if (!topology.ok()) return topology.status();
  if (topology->nodes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(topology->config_path, ": no nodes: list at least one node under `nodes:`"));
  }
  ctx.topology = *std::move(topology);
  ctx.agents.clear();
  ctx.state().Reset(ctx.topology);
  glm::v1::UpEvent e;
  e.set_phase(glm::v1::BRING_UP_PHASE_VALIDATE);
  e.set_message(absl::StrCat(ctx.topology.config_path, ": cluster '", ctx.topology.cluster_name,
                             "', ", ctx.topology.nodes.size(), " nodes",
                             ctx.topology.tls.enabled() ? ", mTLS" : ""));
  ctx.Emit(e);
  return absl::OkStatus();
}

absl::Status ConnectStep::ConnectOne(BringUpContext& ctx, const NodeEndpoint& node) {
  auto client = factory_->Create(node);
  if (!client.ok()) {
    ctx.NodeEvent(node.name, glm::v1::NODE_STATE_FAILED, std::string(client.status().message()),
                  std::string(client.status().message()));
    return client.status();
  }
  ctx.NodeEvent(node.name, glm::v1::NODE_STATE_CONNECTING,
                absl::StrCat("connecting to agent at ", node.address));
  Clock::Duration backoff = policy_.initial_backoff;
  Clock::Duration waited{0};
  absl::Status last;
  for (int attempt = 1; attempt <= policy_.max_attempts; ++attempt) {
    absl::StatusOr<glm::v1::InfoResponse> info = (*client)->Info(policy_.call_timeout);
    if (info.ok()) {
      if (info->node() != node.name) {
        std::string msg = absl::StrCat(
            "the agent at ", node.address, " says it is node '", info->node(),
            "', but cluster.yaml has node '", node.name, "' at that address: fix nodes[",
            node.name, "].address, or restart that agent with --node ", node.name);
        ctx.NodeEvent(node.name, glm::v1::NODE_STATE_FAILED, msg, msg);
        return absl::FailedPreconditionError(msg);
      }
      ctx.state().RecordInfo(node.name, *info);
      ctx.SetInfo(node.name, *info);
      ctx.SetAgent(node.name, *client);
      ctx.NodeEvent(node.name, glm::v1::NODE_STATE_CONNECTED,
                    absl::StrFormat("connected: glm-agent %s on %s (%d CPUs), attempt %d",
                                    info->version(), info->host().hostname(),
                                    info->host().cpu_count(), attempt));
      return absl::OkStatus();
    }
    last = info.status();
    if (attempt == policy_.max_attempts) break;
    ctx.NodeEvent(node.name, glm::v1::NODE_STATE_CONNECTING,
                  absl::StrFormat("attempt %d/%d: %s; retrying in %.1f s", attempt,
                                  policy_.max_attempts, last.message(), Seconds(backoff)));
    sleeper_(backoff);
    waited += backoff;
    backoff = std::min(backoff * 2, policy_.max_backoff);
  }
  std::string msg = absl::StrFormat(
      "cannot reach the agent of node '%s' at %s after %d attempts over %.1f s: %s. Fix: start "
      "it on that host (glm-agent serve --listen %s --node %s), check that the address and port "
      "in cluster.yaml are right and that no firewall blocks the port%s",
      node.name, node.address, policy_.max_attempts, Seconds(waited), last.message(),
      node.address, node.name,
      ctx.topology.tls.enabled() ? ", and that its certificate is signed by the cluster CA" : "");
  ctx.NodeEvent(node.name, glm::v1::NODE_STATE_FAILED, msg, msg);
  return absl::UnavailableError(msg);
}

absl::Status ForEachConnectedNode(
    BringUpContext& ctx, const std::string& what,
    const std::function<void(const NodeEndpoint&, AgentClient&, const NodeFailFn&)>& fn) {
  std::mutex mu;
  std::vector<std::string> failures;
  ParallelFor(ctx.topology.nodes, [&](const NodeEndpoint& node) {
    std::shared_ptr<AgentClient> client;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = ctx.agents.find(node.name);
      if (it != ctx.agents.end()) client = it->second;
    }
    const NodeFailFn fail = [&](const std::string& msg) {
      ctx.NodeEvent(node.name, glm::v1::NODE_STATE_FAILED, msg, msg);
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(msg);
    };
    if (!client) {
      fail(absl::StrCat("node ", node.name, ": not connected; ", what, " skipped"));
      return;
    }
    fn(node, *client, fail);
  });
  if (!failures.empty()) {
    std::sort(failures.begin(), failures.end());
    return absl::FailedPreconditionError(absl::StrJoin(failures, "\n"));
  }
  return absl::OkStatus();
}

absl::Status ConnectStep::Run(BringUpContext& ctx) {
  std::mutex mu;
  std::vector<std::string> errors;
  absl::StatusCode code = absl::StatusCode::kOk;
  ParallelFor(ctx.topology.nodes, [&](const NodeEndpoint& node) {
    absl::Status s = ConnectOne(ctx, node);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(std::string(s.message()));
      // One code for the whole step: the failures' if they agree, else UNAVAILABLE.
      code = (code == absl::StatusCode::kOk || code == s.code()) ? s.code()
                                                                 : absl::StatusCode::kUnavailable;
    }
  });
  if (!errors.empty()) {
    std::sort(errors.begin(), errors.end());
    return absl::Status(code, absl::StrJoin(errors, "\n"));
  }
  return absl::OkStatus();
}

absl::Status PreflightStep::Run(BringUpContext& ctx) {
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::pair<std::string, glm::v1::GidEntry>> gids;
  std::map<std::string, glm::v1::PreflightResponse> responses;
  ParallelFor(ctx.topology.nodes, [&](const NodeEndpoint& node) {
    auto it = ctx.agents.find(node.name);
    if (it == ctx.agents.end()) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(absl::StrCat("node '", node.name, "': not connected"));
      return;
    }
    glm::v1::PreflightRequest request = BuildPreflightRequest(ctx.topology, node, ctx.infos);
    ctx.NodeEvent(node.name, glm::v1::NODE_STATE_PREFLIGHT, "running preflight checks");
    absl::StatusOr<glm::v1::PreflightResponse> resp = it->second->Preflight(request, timeout_);
    if (!resp.ok()) {
      std::string msg = absl::StrCat("node '", node.name, "' (", node.address,
                                     "): preflight call failed: ", resp.status().message());
      ctx.NodeEvent(node.name, glm::v1::NODE_STATE_FAILED, msg, msg);
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(msg);
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    responses[node.name] = *std::move(resp);
  });
  // NCCL: which build is pinned and who holds it decides whether a node's missing library is a
  // warning (staged later) or a failure (nobody can provide it).
  std::optional<NcclSourceFile> controller_copy;
  if (nccl_source_ && !ctx.topology.nccl_library.empty()) {
    absl::StatusOr<std::optional<NcclSourceFile>> copy = nccl_source_(ctx.topology);
    if (!copy.ok()) {
      failures.push_back(absl::StrCat("reading the NCCL source on the controller's host: ",
                                      copy.status().message(),
                                      " Fix: make nccl.source (or nccl.library) readable there, "
                                      "or remove it from this host"));
    } else {
      controller_copy = *std::move(copy);
    }
  }
  ctx.nccl_plan = ApplyNcclStaging(ctx.topology, controller_copy, &responses);
  for (const NodeEndpoint& node : ctx.topology.nodes) {
    auto found = responses.find(node.name);
    if (found == responses.end()) continue;
    const glm::v1::PreflightResponse* resp = &found->second;
    std::vector<std::string> node_failures;
    std::vector<std::string> warnings;
    for (const auto& check : resp->checks()) {
      if (check.status() == glm::v1::CHECK_STATUS_FAIL) {
        node_failures.push_back(absl::StrCat("node '", node.name, "': check ", check.id(),
                                             " failed: ", check.message(), " [evidence: ",
                                             check.evidence(), "] Fix: ", check.fix()));
      } else if (check.status() == glm::v1::CHECK_STATUS_WARN) {
        warnings.push_back(absl::StrCat(check.id(), ": ", check.message()));
      }
    }
    glm::v1::UpEvent e;
    e.set_phase(glm::v1::BRING_UP_PHASE_PREFLIGHT);
    e.set_node(node.name);
    for (const auto& check : resp->checks()) *e.add_checks() = check;
    if (resp->has_gid()) {
      ctx.state().SetNodeGid(node.name, resp->gid());
      gids.emplace_back(node.name, resp->gid());
    }
    if (node_failures.empty()) {
      e.set_node_state(glm::v1::NODE_STATE_PREFLIGHT);
      e.set_message(absl::StrCat("preflight passed (", resp->checks_size(), " checks",
                                 resp->has_gid() ? "; GID " + DescribeGid(resp->gid()) : "",
                                 warnings.empty() ? "" : "; warnings: ",
                                 absl::StrJoin(warnings, "; "), ")"));
      ctx.Emit(e);
      continue;
    }
    std::string msg = absl::StrJoin(node_failures, "\n");
    ctx.state().SetNodeState(node.name, glm::v1::NODE_STATE_FAILED, msg);
    e.set_node_state(glm::v1::NODE_STATE_FAILED);
    e.set_message(msg);
    ctx.Emit(e);
    for (auto& f : node_failures) failures.push_back(std::move(f));
  }
  if (std::string warning = GidDisagreement(gids); !warning.empty()) {
    glm::v1::UpEvent e;
    e.set_phase(glm::v1::BRING_UP_PHASE_PREFLIGHT);
    e.set_message("warning: " + warning);
    ctx.Emit(e);
  }
  if (!failures.empty()) {
    std::sort(failures.begin(), failures.end());
    return absl::FailedPreconditionError(absl::StrJoin(failures, "\n"));
  }
  return absl::OkStatus();
}

glm::v1::PreflightRequest BuildPreflightRequest(
    const ClusterTopology& topology, const NodeEndpoint& node,
    const std::map<std::string, glm::v1::InfoResponse>& infos) {
  glm::v1::PreflightRequest request;
  request.set_model_dir(topology.model_dir);
  request.set_required_disk_bytes(node.required_disk_bytes);
  request.set_required_memory_bytes(node.required_memory_bytes);
  request.set_require_gpu(topology.require_gpu);
  request.set_fabric_ip(node.fabric_ip);
  request.set_hca(node.hca);
  request.set_hca_port(node.hca_port);
  request.set_gid_index_auto(!node.gid_index.has_value());
  request.set_gid_index(node.gid_index.value_or(0));
  request.set_netdev(node.netdev);
  request.set_fabric_mtu(topology.fabric_mtu);
  request.set_nccl_library(topology.nccl_library);
  request.set_nccl_expected_version(topology.nccl_expected_version);
  // The Stage phase installs the pinned build where it is missing (ApplyNcclStaging decides
  // whether some node can provide it).
  request.set_nccl_stage_if_missing(!topology.nccl_library.empty());
  for (const auto& peer : topology.nodes) {
    if (peer.name == node.name || peer.fabric_ip.empty()) continue;
    glm::v1::PreflightRequest::MtuPeer* p = request.add_mtu_peers();
    p->set_node(peer.name);
    p->set_fabric_ip(peer.fabric_ip);
    auto it = infos.find(peer.name);
    p->set_port(it == infos.end() ? 0 : it->second.mtu_echo_port());
  }
  return request;
}

std::string DescribeGid(const glm::v1::GidEntry& gid) {
  return absl::StrCat("index ", gid.index(), " ", gid.gid(), " (", gid.type().empty() ? "?" : gid.type(),
                      ", ", gid.hca(), " port ", gid.port(),
                      gid.netdev().empty() ? "" : ", " + gid.netdev(), ")");
}

std::string GidDisagreement(const std::vector<std::pair<std::string, glm::v1::GidEntry>>& gids) {
  std::map<int, std::vector<std::string>> by_index;
  for (const auto& [node, gid] : gids) by_index[gid.index()].push_back(node);
  if (by_index.size() < 2) return "";
  std::vector<std::string> parts;
  for (auto& [index, nodes] : by_index) {
    std::sort(nodes.begin(), nodes.end());
    parts.push_back(absl::StrCat("index ", index, " on ", absl::StrJoin(nodes, ", ")));
  }
  return absl::StrCat(
      "nodes resolved different GID indices: ", absl::StrJoin(parts, "; "),
      ". NCCL_IB_GID_INDEX is one value for the whole job in most recipes: make the GID tables "
      "agree (persist each node's fabric IP so it lands at the same index) or set the index per "
      "node");
}

glm::v1::ClusterPreflightResponse RunClusterPreflight(const ClusterTopology& topology,
                                                      AgentClientFactory* factory,
                                                      const RetryPolicy& policy,
                                                      const Sleeper& sleeper,
                                                      Clock::Duration timeout,
                                                      const NcclSourceProvider& nccl_source) {
  glm::v1::ClusterPreflightResponse out;
  std::mutex mu;
  std::map<std::string, std::shared_ptr<AgentClient>> clients;
  std::map<std::string, glm::v1::InfoResponse> infos;
  std::map<std::string, glm::v1::NodePreflightResult> results;
  for (const auto& node : topology.nodes) {
    results[node.name].set_node(node.name);
    results[node.name].set_address(node.address);
  }
  // Connect (Info) first: peers' echo ports go into every request.
  ParallelFor(topology.nodes, [&](const NodeEndpoint& node) {
    auto client = factory->Create(node);
    absl::Status last;
    if (client.ok()) {
      Clock::Duration backoff = policy.initial_backoff;
      for (int attempt = 1; attempt <= policy.max_attempts; ++attempt) {
        auto info = (*client)->Info(policy.call_timeout);
        if (info.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (info->node() != node.name) {
            results[node.name].set_error(absl::StrCat(
                "the agent at ", node.address, " says it is node '", info->node(),
                "': fix nodes[", node.name, "].address or restart it with --node ", node.name));
            return;
          }
          clients[node.name] = *client;
          infos[node.name] = *info;
          return;
        }
        last = info.status();
        if (attempt == policy.max_attempts) break;
        sleeper(backoff);
        backoff = std::min(backoff * 2, policy.max_backoff);
      }
    } else {
      last = client.status();
    }
    std::lock_guard<std::mutex> lock(mu);
    results[node.name].set_error(absl::StrCat(
        "cannot reach the agent at ", node.address, ": ", last.message(),
        ". Fix: start it (glm-agent serve --listen ", node.address, " --node ", node.name, ")"));
  });
  std::vector<std::pair<std::string, glm::v1::GidEntry>> gids;
  std::map<std::string, glm::v1::PreflightResponse> responses;
  ParallelFor(topology.nodes, [&](const NodeEndpoint& node) {
    std::shared_ptr<AgentClient> client;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = clients.find(node.name);
      if (it == clients.end()) return;
      client = it->second;
    }
    auto resp = client->Preflight(BuildPreflightRequest(topology, node, infos), timeout);
    std::lock_guard<std::mutex> lock(mu);
    glm::v1::NodePreflightResult& r = results[node.name];
    if (!resp.ok()) {
      r.set_error(absl::StrCat("preflight call failed: ", resp.status().message()));
      return;
    }
    responses[node.name] = *std::move(resp);
  });
  std::optional<NcclSourceFile> controller_copy;
  if (nccl_source && !topology.nccl_library.empty()) {
    if (auto copy = nccl_source(topology); copy.ok()) controller_copy = *std::move(copy);
  }
  ApplyNcclStaging(topology, controller_copy, &responses);
  for (auto& [name, resp] : responses) {
    glm::v1::NodePreflightResult& r = results[name];
    r.set_ok(resp.ok());
    *r.mutable_checks() = resp.checks();
    if (resp.has_gid()) {
      *r.mutable_gid() = resp.gid();
      gids.emplace_back(name, resp.gid());
    }
  }
  bool ok = true;
  for (const auto& node : topology.nodes) {
    glm::v1::NodePreflightResult& r = results[node.name];
    if (!r.error().empty()) r.set_ok(false);
    ok = ok && r.ok();
    *out.add_nodes() = std::move(r);
  }
  out.set_ok(ok);
  out.set_gid_warning(GidDisagreement(gids));
  return out;
}

absl::Status PlanStep::Run(BringUpContext& ctx) {
  absl::StatusOr<Outcome> outcome = planner_(ctx.topology);
  if (!outcome.ok()) return outcome.status();
  for (const auto& replica : outcome->replicas) {
    for (const auto& name : replica) {
      if (!ctx.topology.FindNode(name)) {
        return absl::InternalError(
            absl::StrCat("the plan places node '", name, "' in a replica, but cluster.yaml has "
                         "no such node"));
      }
    }
  }
  ctx.topology.replicas = outcome->replicas;
  ctx.state().SetReplicas(outcome->replicas);
  glm::v1::UpEvent e;
  e.set_phase(glm::v1::BRING_UP_PHASE_PLAN);
  e.set_message(outcome->summary);
  ctx.Emit(e);
  return absl::OkStatus();
}

}  // namespace glm::orchestrate
