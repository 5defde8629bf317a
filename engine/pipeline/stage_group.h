// One rank's membership in its replica: the communicators and the data movement of a pipeline
// step, shared by the head (PipelinedModel) and the followers (StageFollower).
//
// Communicators (GlooCommunicator, host memory, except tp over NCCL as below):
//  - control: every rank of the replica, rank = ShardTopology::world_rank(). Carries the head's
//    step messages (step_message.h) as point-to-point sends from world rank 0 to every other
//    rank, in world-rank order. A Gloo send completes once its receiver has posted the matching
//    receive, so the head sends from a thread of its own (PipelinedModel): the head's step
//    thread never waits for a busy stage to take the next message.
//  - world: every rank of the replica. Carries the activations between stages and the final
//    barrier.
//  - result: the head and the last stage's tp 0 (none when pp_size is 1), rank 0 = the head.
//    Carries the last stage's result; the head receives it on a thread of its own.
//  - tp: the tp_size ranks of this stage (null when tp_size is 1), handed to the model for the
//    all-reduces inside its layers. A NcclCommunicator on the backend's stream (device memory)
//    when every rank of the stage runs the cuda backend on a GPU of its own with the NCCL
//    library loaded; else Gloo (tp_transport.h has the rule; tp_transport() the choice). The
//    activations between stages stay on the Gloo world group (host memory; a hand-off per step
//    is small next to the two all-reduces per layer).
// Three communicators on the head because each is used by one thread there (a Communicator is
// not thread-safe): control by the sender, world and tp by the step thread, result by the
// receiver. A follower uses all of them from its one loop thread.
//
// One step, every rank in the same order (so every rank issues the same operations):
//  1. the head sends the message to every rank; every other rank receives it;
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
// Several steps may be in flight (micro-batches): a follower serves the messages strictly in
// order, each stage hands step i on before it takes step i + 1, and the last stage's results
// reach the head in message order, so every pair of ranks issues matching operations in the same
// order and the pipeline cannot deadlock: stage s works on step i while stage s + 1 works on
// step i - 1.
//
// Failure: any error (a peer that closed its sockets, a timeout, a size mismatch, a model
// error) is recorded as the group's failure and closes the failing thread's communicators (on a
// follower: all of them), so every rank blocked on it fails at once too, and the group stays
// failed: every later call returns the first failure. Threads: a follower's loop uses
// everything; on the head, Send is the sender thread's, RecvResult the receiver thread's, the
// rest the step thread's; failure() from any of them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config/model_config.h"
#include "engine/dist/communicator.h"
#include "engine/model/forward_batch.h"
#include "engine/pipeline/shard_topology.h"
#include "engine/pipeline/step_message.h"
#include "engine/pipeline/tp_transport.h"

namespace glm::engine {
class DeviceStream;
class NcclCommunicator;
}  // namespace glm::engine

namespace glm::engine::pipeline {

// The backend this rank runs, for its TP group's transport (tp_transport.h). The default is a
// host backend.
struct StageDevice {
  std::string backend = "cpu";     // Backend::name()
  // Backend::device_stream(): where a NcclCommunicator enqueues. Not owned; must outlive every
  // use of tp_comm() (the model's; the group's destructor does not use it). Null on cpu.
  DeviceStream* stream = nullptr;
};

class StageGroup {
 public:
  // Publishes this rank's layer range in the rendezvous, connects the world group, then this
  // stage's TP group (blocking until every rank has joined, up to connect_timeout), and checks
  // that the stages' layer ranges tile the model (the TP ranks of a stage agree; stage s + 1
  // starts where stage s ends). `topology` must be valid for `config` (ValidateShardTopology)
  // and its rendezvous is used during this call only. The TP group's transport is chosen from
  // what every rank of the stage publishes (`device`, topology.nccl), logged, and kept in
  // tp_transport().
  static absl::StatusOr<std::unique_ptr<StageGroup>> Create(const ShardTopology& topology,
                                                           const ModelConfig& config,
                                                           const StageDevice& device = {});
  ~StageGroup();

  const ShardTopology& topology() const { return topology_; }
  // This stage's TP communicator (ModelLoadOptions::tp_comm); null when tp_size is 1.
  Communicator* tp_comm() const { return tp_.get(); }
  // How the TP group all-reduces (the same choice on every rank of the stage); Gloo with the
  // reason "one rank: nothing to all-reduce" when tp_size is 1.
  const TpTransportChoice& tp_transport() const { return tp_transport_; }

  // Every rank publishes its KV block count once its model is loaded, or its load failure;
  // returns the smallest count over the replica, which the head's block manager must use (every
  // rank holds each block the head hands out), or the first failure published (naming the rank)
  // so that a rank that cannot load fails the others at once. Waits up to connect_timeout for
  // each rank (the bound on the skew between the ranks' loading). Uses the rendezvous: call it
  // inside Engine::Create.
  absl::StatusOr<int> AgreeKvBlocks(const absl::StatusOr<int>& local_blocks);
  // For a rank that fails before Create (its backend): posts `failure` where AgreeKvBlocks
  // would, so the other ranks, whose group formation then times out, report it as the cause.
  static void PostLoadFailure(const ShardTopology& topology, const absl::Status& failure);

  // The head (its sender thread): numbers `message` and sends it (its header, then the payload)
  // to every other rank. Followers: receives the next one and checks its sequence number.
  absl::Status Send(const StepMessage& message);
  absl::StatusOr<StepMessage> Receive();

  // Steps 2-5 above for a kStep message whose slices are `batch` (input_residual / input_topk
  // are filled here on a later stage); `result` gets this rank's outputs. On the head with
  // pp_size > 1 those are stage 0's (residuals, already handed on): the last stage's result
  // comes through RecvResult.
  absl::Status RunStep(Model& model, ForwardBatch& batch, ForwardResult* result);
  // The MTP step: on the last stage Model::ForwardMtp, then the result to the head (which, with
  // pp_size > 1, receives it through RecvResult).
  absl::Status RunMtpStep(Model& model, const ForwardBatch& batch,
                          const std::vector<std::vector<float>>& hidden, ForwardResult* result);
  // The head (its receiver thread), pp_size > 1: the last stage's result of the oldest step not
  // received yet, whose slices are `batch` (logits or sampled tokens, hidden when asked).
  absl::Status RecvResult(const ForwardBatch& batch, ForwardResult* result);

  // Every rank of the replica: returns once all have arrived (after a kStop message, so that
  // no rank closes its connections while another still reads the message).
  absl::Status Barrier();

  // Closes every communicator: peers blocked on this rank fail at once. Later calls fail. Only
  // when no other thread uses the group (the head joins its sender and receiver first).
  void Close();
  // The first failure (OK while the group works). Any thread.
  absl::Status failure() const;
  // Wall time this rank spent in its stage's layers (Model::Forward / ForwardMtp inside RunStep
  // and RunMtpStep) so far: over an interval, its growth / the interval is the stage's busy
  // fraction. Any thread.
  int64_t compute_nanos() const { return compute_nanos_.load(); }

 private:
  // Which communicators a thread owns (closed by that thread when it fails).
  enum Owned : unsigned { kStepComms = 1, kControl = 2, kResult = 4, kAll = 7 };

  StageGroup(const ShardTopology& topology, const ModelConfig& config);
  // Records the first failure, annotated with this rank and `what`, and closes the calling
  // thread's communicators (`owned` on the head; every one on a follower).
  absl::Status Fail(const absl::Status& status, const std::string& what,
                    Owned owned = kStepComms);
  void CloseOwned(Owned owned);
  // The failure, if any (then closing `owned`), or an error when `owned`'s communicator is gone.
  absl::Status Usable(Owned owned = kStepComms);
  // The TP ranks of this stage hold the same layers; this stage starts where the previous ends.
  absl::Status CheckNeighbours() const;
  // `symptom` (a failed group formation), unless another rank posted that it failed: then that
  // rank's reason, which is the cause.
  absl::Status PeerFailureOr(const absl::Status& symptom) const;
  // Reads every TP rank's device (published before the world group formed), chooses the
  // transport (tp_transport_) and forms tp_ over it.
  absl::Status FormTpGroup(const StageDevice& device);
  absl::Status RecvActivations(ForwardBatch& batch);
  absl::Status SendActivations(const ForwardBatch& batch, const ForwardResult& local);
  absl::Status SendResult(const ForwardBatch& batch, const ForwardResult& local);
  int last_tp0() const { return topology_.WorldRank(topology_.pp_size - 1, 0); }

  ShardTopology topology_;  // last_layer resolved
  const ModelConfig config_;
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<Communicator> tp_;
  NcclCommunicator* nccl_tp_ = nullptr;  // tp_'s NCCL communicator (inside the meter), if NCCL
  TpTransportChoice tp_transport_;
  std::unique_ptr<Communicator> control_;
  std::unique_ptr<Communicator> result_;  // head and last tp 0 only, pp_size > 1
  uint64_t sequence_ = 0;  // of the last message sent (head) or received (followers)
  std::atomic<int64_t> compute_nanos_{0};
  mutable std::mutex failure_mu_;
  absl::Status failure_;  // guarded by failure_mu_
};

}  // namespace glm::engine::pipeline
