#include "controller/orchestrate/load_step.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_util.h"
#include "controller/orchestrate/steps.h"

namespace glm::orchestrate {

absl::StatusOr<glm::v1::LoadShardRequest> BuildLoadShardRequest(const ClusterTopology& topology,
                                                                const NodeEndpoint& node) {
  if (node.layer_end <= node.layer_begin) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", node.name, ": the plan assigned it no decoder layers (", node.layer_begin, "..",
        node.layer_end, "); fix: check `glmctl plan ", topology.config_path,
        "` (parallel.layer_partition, nodes) and re-run glmctl up"));
  }
  glm::v1::LoadShardRequest r;
  r.mutable_shard()->set_replica(node.replica);
  r.mutable_shard()->set_pp_rank(node.pp_rank);
  r.mutable_shard()->set_tp_rank(node.tp_rank);
  r.set_model_dir(topology.model_dir);
  r.set_layer_begin(node.layer_begin);
  r.set_layer_end(node.layer_end);
  r.set_tp_size(std::max(1, topology.tensor));
  r.set_pp_size(std::max(1, topology.pipeline));
  r.set_kv_cache_bytes(node.kv_cache_bytes);
  r.set_load_mtp(topology.mtp && node.last_stage);
  r.set_mtp_draft_tokens(topology.mtp ? topology.mtp_draft_tokens : 0);
  r.set_max_steps_in_flight(topology.micro_batches);
  r.set_gpu(node.gpu);
  r.mutable_page_cache()->set_policy(topology.page_cache.policy);
  r.mutable_page_cache()->set_interval_s(topology.page_cache.interval_s);
  r.mutable_page_cache()->set_min_available_bytes(topology.page_cache.min_available_bytes);
  // "auto" goes as "": the agent picks (cuda when usable, else cpu; fp32 weights on cpu).
  r.set_backend(topology.backend == "auto" ? "" : topology.backend);
  r.set_weight_dtype(topology.weight_dtype == "auto" ? "" : topology.weight_dtype);
  r.set_kv_dtype(topology.kv_dtype);
  r.set_max_num_seqs(topology.max_num_seqs);
  r.set_max_model_len(topology.max_model_len);
  return r;
}

namespace {

int64_t Millis(Clock::Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

}  // namespace

absl::Status StartReplicas(BringUpContext& ctx, Clock::Duration timeout) {
  // One epoch per bring-up run: the rendezvous namespace of every group started now.
  const int64_t epoch = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  // Workers first, head last, all concurrently: each StartShard returns only once its rank has
  // joined the group, which needs every rank of the replica to be starting.
  std::vector<const NodeEndpoint*> order;
  for (const NodeEndpoint& n : ctx.topology.nodes) {
    if (n.pp_rank != 0 || n.tp_rank != 0) order.push_back(&n);
  }
  for (const NodeEndpoint& n : ctx.topology.nodes) {
    if (n.pp_rank == 0 && n.tp_rank == 0) order.push_back(&n);
  }
  std::mutex mu;
  std::vector<std::string> failures;
  ParallelFor(order, [&](const NodeEndpoint* node) {
    std::shared_ptr<AgentClient> client;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = ctx.agents.find(node->name);
      if (it != ctx.agents.end()) client = it->second;
    }
    auto fail = [&](const std::string& msg) {
      ctx.NodeEvent(node->name, glm::v1::NODE_STATE_FAILED, msg, msg);
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(msg);
    };
    if (!client) {
      fail(absl::StrCat("node ", node->name, ": not connected; shard start skipped"));
      return;
    }
    glm::v1::StartShardRequest req;
    req.mutable_shard()->set_replica(node->replica);
    req.mutable_shard()->set_pp_rank(node->pp_rank);
    req.mutable_shard()->set_tp_rank(node->tp_rank);
    req.mutable_shard()->set_epoch(epoch);
    req.set_rendezvous_address(ctx.topology.controller_listen);
    req.set_connect_timeout_ms(Millis(ctx.topology.connect_timeout));
    req.set_op_timeout_ms(Millis(ctx.topology.op_timeout));
    auto forward = [&](const glm::v1::Progress& p) {
      if (p.has_shard()) ctx.state().SetNodeShard(node->name, p.shard());
      glm::v1::UpEvent e;
      e.set_phase(glm::v1::BRING_UP_PHASE_LOAD);
      e.set_node(node->name);
      e.set_node_state(glm::v1::NODE_STATE_CONNECTED);
      e.set_message(p.message());
      ctx.Emit(e);
    };
    absl::Status s = client->StartShard(req, forward, timeout);
    if (!s.ok()) {
      fail(absl::StrCat("node ", node->name, ": starting its shard (replica ", node->replica,
                        ", pp ", node->pp_rank, ", tp ", node->tp_rank, ") failed: ",
                        s.message()));
    }
  });
  if (!failures.empty()) {
    std::sort(failures.begin(), failures.end());
    return absl::FailedPreconditionError(absl::StrJoin(failures, "\n"));
  }
  return absl::OkStatus();
}

absl::Status LoadStep::Run(BringUpContext& ctx) {
  GLM_RETURN_IF_ERROR(ForEachConnectedNode(ctx, "shard load", [&](const NodeEndpoint& node,
                                                     AgentClient& client, const NodeFailFn& fail) {
    absl::StatusOr<glm::v1::LoadShardRequest> req = BuildLoadShardRequest(ctx.topology, node);
    if (!req.ok()) {
      fail(std::string(req.status().message()));
      return;
    }
    auto forward = [&](const glm::v1::Progress& p) {
      if (p.has_shard()) ctx.state().SetNodeShard(node.name, p.shard());
      glm::v1::UpEvent e;
      e.set_phase(glm::v1::BRING_UP_PHASE_LOAD);
      e.set_node(node.name);
      e.set_node_state(glm::v1::NODE_STATE_CONNECTED);
      e.set_message(p.message());
      if (p.total_bytes() > 0) {
        *e.mutable_progress() = p;
        e.mutable_progress()->clear_shard();  // the CLI needs the bytes, not the whole status
      }
      ctx.Emit(e);
    };
    absl::Status s = client.LoadShard(*req, forward, timeout_);
    if (!s.ok()) {
      fail(absl::StrCat("node ", node.name, ": loading its shard (layers [", req->layer_begin(),
                        ", ", req->layer_end(), ")) failed: ", s.message()));
    }
  }));
  return StartReplicas(ctx, timeout_);
}

std::vector<std::string> StopShards(const ClusterTopology& topology, AgentClientFactory* factory,
                                    Clock::Duration timeout, int* stopped) {
  std::mutex mu;
  std::vector<std::string> lines;
  int count = 0;
  ParallelFor(topology.nodes, [&](const NodeEndpoint& node) {
    std::string line;
    absl::StatusOr<std::shared_ptr<AgentClient>> client = factory->Create(node);
    if (!client.ok()) {
      line = absl::StrCat(node.name, ": ", client.status().message());
    } else {
      std::string last;
      absl::Status s = (*client)->StopShard(
          glm::v1::StopShardRequest(), [&](const glm::v1::Progress& p) { last = p.message(); },
          timeout);
      line = absl::StrCat(node.name, ": ", s.ok() ? last : std::string(s.message()));
      if (s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        ++count;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(std::move(line));
  });
  std::sort(lines.begin(), lines.end());
  if (stopped) *stopped = count;
  return lines;
}

}  // namespace glm::orchestrate
