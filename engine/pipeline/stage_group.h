// One rank's membership in its replica: the communicators and the data movement of a pipeline
// step, shared by the head (PipelinedModel) and the followers (StageFollower).
//
// Communicators (GlooCommunicator, host memory):
//  - world: every rank of the replica, rank = ShardTopology::world_rank(). Carries the head's
//    step messages (Broadcast from world rank 0, step_message.h), the activations between
//    stages and the last stage's result.
//  - tp: the tp_size ranks of this stage (null when tp_size is 1), handed to the model for the
//    all-reduces inside its layers.
//
// One step, every rank in the same order (so every rank issues the same operations):
//  1. the head broadcasts the message; every other rank receives it;
//  2. a stage after the first receives from the same tp rank of the previous stage one Send of
//     [T, hidden] floats (the residual stream of every new token, slices in batch order), then,
//     when its first layer is IndexShare "shared", [T, index_topk] int32 top-k (as float bits)
//     in the same message;
//  3. it runs its layers (Model::Forward; the TP ranks all-reduce inside);
//  4. a stage before the last sends its activations on the same way (all TP ranks of a stage
//     hold the full residual, so tp rank r sends to tp rank r of the next stage);
//  5. the last stage's tp 0 (when it is not the head) sends the head the result: first a
//     descriptor of 4 floats per slice (as bits: i32 sampled_token, u32 logits floats, u32
//     hidden floats, u32 logprob floats), then, when any is non-empty, per slice in order its
//     logits, hidden rows and logprobs. A slice that asks for logprobs (sample.logprobs = k,
//     forward_batch.h) with one logits row is drawn here (SampleToken, the head's rule) and
//     sends the token and 1 + 2k logprob floats (the token's logprob, then (i32 id as bits,
//     logprob) per alternative) instead of its vocab row.
// An MTP step (kMtpStep) is step 1 then, on the last stage only, Model::ForwardMtp and step 5.
//
// Failure: any error (a peer that closed its sockets, a timeout, a size mismatch, a model
// error) closes this rank's communicators, so every rank blocked on it fails at once too, and
// the group stays failed. Not thread-safe: one thread (the step loop).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config/model_config.h"
#include "engine/dist/communicator.h"
#include "engine/model/forward_batch.h"
#include "engine/pipeline/shard_topology.h"
#include "engine/pipeline/step_message.h"

namespace glm::engine::pipeline {

class StageGroup {
 public:
  // Publishes this rank's layer range in the rendezvous, connects the world group, then this
  // stage's TP group (blocking until every rank has joined, up to connect_timeout), and checks
  // that the stages' layer ranges tile the model (the TP ranks of a stage agree; stage s + 1
  // starts where stage s ends). `topology` must be valid for `config` (ValidateShardTopology)
  // and its rendezvous is used during this call only.
  static absl::StatusOr<std::unique_ptr<StageGroup>> Create(const ShardTopology& topology,
                                                           const ModelConfig& config);
  ~StageGroup();

  const ShardTopology& topology() const { return topology_; }
  // This stage's TP communicator (ModelLoadOptions::tp_comm); null when tp_size is 1.
  Communicator* tp_comm() const { return tp_.get(); }

  // Every rank publishes its KV block count once its model is loaded, or its load failure;
  // returns the smallest count over the replica, which the head's block manager must use (every
  // rank holds each block the head hands out), or the first failure published (naming the rank)
  // so that a rank that cannot load fails the others at once. Waits up to connect_timeout for
  // each rank (the bound on the skew between the ranks' loading). Uses the rendezvous: call it
  // inside Engine::Create.
  absl::StatusOr<int> AgreeKvBlocks(const absl::StatusOr<int>& local_blocks);

  // The head: broadcasts `message` (its header, then the payload). Followers: receives the next
  // one and checks its sequence number.
  absl::Status Send(const StepMessage& message);
  absl::StatusOr<StepMessage> Receive();

  // Steps 2-5 above for a kStep message whose slices are `batch` (input_residual / input_topk
  // are filled here on a later stage). On the head, `result` gets the last stage's outputs
  // (logits or sampled tokens, hidden when asked); on other ranks it holds the local outputs.
  absl::Status RunStep(Model& model, ForwardBatch& batch, ForwardResult* result);
  // The MTP step: on the last stage Model::ForwardMtp, then the result to the head.
  absl::Status RunMtpStep(Model& model, const ForwardBatch& batch,
                          const std::vector<std::vector<float>>& hidden, ForwardResult* result);

  // Every rank of the replica: returns once all have arrived (after a kStop message, so that
  // no rank closes its connections while another still reads the message).
  absl::Status Barrier();

  // Closes both communicators: peers blocked on this rank fail at once. Later calls fail.
  void Close();
  // The first failure (OK while the group works).
  const absl::Status& failure() const { return failure_; }

 private:
  StageGroup(const ShardTopology& topology, const ModelConfig& config);
  // Records the first failure, annotated with this rank and `what`, and closes the group.
  absl::Status Fail(const absl::Status& status, const std::string& what);
  absl::Status Usable() const;
  // The TP ranks of this stage hold the same layers; this stage starts where the previous ends.
  absl::Status CheckNeighbours() const;
  // `symptom` (a failed group formation), unless another rank posted that it failed: then that
  // rank's reason, which is the cause.
  absl::Status PeerFailureOr(const absl::Status& symptom) const;
  absl::Status RecvActivations(ForwardBatch& batch);
  absl::Status SendActivations(const ForwardBatch& batch, const ForwardResult& local);
  absl::Status SendResult(const ForwardBatch& batch, const ForwardResult& local);
  absl::Status RecvResult(const ForwardBatch& batch, ForwardResult* result);
  int last_tp0() const { return topology_.WorldRank(topology_.pp_size - 1, 0); }

  ShardTopology topology_;  // last_layer resolved
  const ModelConfig config_;
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<Communicator> tp_;
  uint64_t sequence_ = 0;  // of the last message sent (head) or received (followers)
  absl::Status failure_;
};

}  // namespace glm::engine::pipeline
