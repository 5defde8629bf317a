// Where one engine shard sits in its replica: its pipeline stage, its tensor-parallel rank, the
// decoder layers it holds, and how it finds the other ranks (EngineOptions::shard).
//
// A replica is pp_size stages of tp_size ranks each. World rank = pp_rank * tp_size + tp_rank;
// the head is world rank 0 (pp 0, tp 0): it runs the scheduler and is the only rank that accepts
// requests. Every rank of a stage holds the same layer range; stage s + 1 starts at the layer
// after stage s ends, stage 0 at layer 0, the last stage on the last decoder layer (and the MTP
// layer, when the engine drafts with it). Partitions may be uneven, and a boundary may fall
// right before an IndexShare "shared" layer (the previous stage's top-k crosses it).
#pragma once

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "engine/dist/nccl_table.h"

namespace glm::engine {

class CommMeter;
class Rendezvous;
struct ModelConfig;

struct ShardTopology {
  int pp_rank = 0;
  int pp_size = 1;
  int tp_rank = 0;
  int tp_size = 1;
  // Decoder layers of this shard, inclusive (ModelLoadOptions' convention); last_layer -1 = the
  // model's last layer. The default (0, -1) is the whole model.
  int first_layer = 0;
  int last_layer = -1;
  // How the ranks meet (engine/dist/rendezvous.h): the controller's store in production,
  // InProcessRendezvous in tests. Not owned; must outlive Engine::Create (the communicators need
  // it only while they connect). Required when pp_size * tp_size > 1.
  Rendezvous* rendezvous = nullptr;
  // Scopes every rendezvous key of this group: unique per replica and bring-up epoch, so a
  // restarted group never reads a dead group's addresses. The same on every rank.
  std::string group_key;
  // Numeric IP this rank binds for its group connections (the node's fabric IP).
  std::string host = "127.0.0.1";
  // Bound on forming the group: every rank must have called Engine::Create within it.
  std::chrono::milliseconds connect_timeout{60'000};
  // Bound on any one group operation: a rank that makes no progress for this long (dead without
  // closing its sockets, or stalled) fails the whole group. It must exceed the longest pipeline
  // step (the head waits for the last stage's result) and the idle heartbeat interval follows
  // from it (op_timeout / 4). A peer that exits closes its sockets and fails the group at once.
  std::chrono::milliseconds op_timeout{30'000};
  // When set, every communicator of this rank (world, tp, control, result: stage_group.h)
  // records its calls into it under its channel (MeteredCommunicator): benchmarks split a step
  // into compute and communication. Not owned; must outlive the engine. Null (the default) =
  // not metered.
  CommMeter* comm_meter = nullptr;
  // The NCCL library this rank may use for its stage's TP all-reduces (the one the agent loaded
  // and verified: agent/stage/nccl_loader.h). Not owned; must outlive the engine. The TP group
  // runs over NCCL only when every rank of the stage has one, runs the cuda backend and sits on
  // a GPU of its own (pipeline/tp_transport.h); null = Gloo.
  const nccl::FunctionTable* nccl = nullptr;

  int world_size() const { return pp_size * tp_size; }
  int world_rank() const { return pp_rank * tp_size + tp_rank; }
  bool distributed() const { return world_size() > 1; }
  bool is_head() const { return pp_rank == 0 && tp_rank == 0; }
  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp_size - 1; }
  int WorldRank(int pp, int tp) const { return pp * tp_size + tp; }
};

// Field checks alone (sizes, ranks, timeouts, rendezvous, group_key) and, with a config, the
// layer range against the model (stage 0 starts at layer 0, the last stage ends on the last
// layer). InvalidArgument naming the field and the fix.
absl::Status ValidateShardTopology(const ShardTopology& topology);
absl::Status ValidateShardTopology(const ShardTopology& topology, const ModelConfig& config);

// "world rank 3 (pp 1, tp 1)": how errors name a rank.
std::string DescribeRank(const ShardTopology& topology, int world_rank);

}  // namespace glm::engine
