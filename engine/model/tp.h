// Tensor parallelism inside the linear layers (../shared/specs/serving.md §6.1). The loader
// (WeightLoader, layers.h) reads each rank's share of a weight by its TpSplit; a row-parallel
// layer's partial products are summed over the group by TpGroup::AllReduce. The model file only
// passes the rank and the group down.
//
// The splits of GlmMoeDsaForCausalLM (layers.cc):
// - attention: q_a / kv_a and their norms replicated; q_b_proj and kv_b_proj column-parallel by
//   head (num_heads / tp_size heads per rank; attention runs on this rank's heads); o_proj
//   row-parallel, then one all-reduce of the [T, H] output;
// - DSA indexer (wq_b, wk, weights_proj, k_norm) replicated: every rank scores with all indexer
//   heads and selects the full top-k, so the ranks agree on the keys without communicating;
// - MoE: the router (fp32) replicated; each routed expert's intermediate width split (gate / up
//   column-parallel, down row-parallel), all experts on every rank; the shared expert the same;
//   one all-reduce after the routed and shared experts together;
// - dense MLP: gate / up column-parallel, down row-parallel, one all-reduce;
// - embed_tokens, lm_head, the MTP layer's eh_proj and norms replicated;
// - the latent and indexer KV caches whole on every rank (one MLA latent per token, not per head).
#pragma once

#include <vector>

#include "absl/status/status.h"

namespace glm::engine {

class Backend;
class Communicator;
struct MatView;

// How a Linear weight [out, in] = [rows, cols] is divided across the ranks of a TP group.
enum class TpSplit {
  kReplicated,      // every rank holds all of it
  // Output features split: rank r holds rows [r * rows / tp_size, (r + 1) * rows / tp_size),
  // and computes those output columns only (by head for q_b / kv_b: rows are head-major).
  kColumnParallel,
  // Input features split: rank r holds columns [r * cols / tp_size, (r + 1) * cols / tp_size)
  // and computes a partial sum of every output; TpGroup::AllReduce adds them up.
  kRowParallel,
};

// This rank's place in its TP group, as the loader slices by it.
struct TpShard {
  int rank = 0;
  int size = 1;
};

// The TP group as the layers see it in a step.
//
// A row-parallel layer's output goes onto the residual stream h ([T, H], the same on every rank):
// rank 0 adds its partial sum to h (out += partial, what a single rank does), the other ranks
// write theirs in place of h (out = partial), and AllReduce(h) leaves h + the sum of all partials
// on every rank. No scratch and no extra add; with one rank it is exactly the unsharded step.
//
// Not thread-safe (the model's step thread). `comm` is not owned and must outlive the group.
class TpGroup {
 public:
  TpGroup() = default;  // one rank, no communicator
  TpGroup(int rank, int size, Communicator* comm) : rank_(rank), size_(size), comm_(comm) {}

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Whether this rank's row-parallel output adds onto the residual stream (rank 0) or replaces
  // it (the others), as described above.
  bool adds_residual() const { return rank_ == 0; }

  // In place: x = the sum over the group's ranks of x. x: [rows, cols] backend memory with
  // contiguous rows (ld == cols, as Workspace::Mat gives). No-op with one rank. The
  // communicator reduces x where it lives when it can take that memory: host memory on a host
  // backend (Backend::HostMemory: cpu, with Gloo), device memory with a device communicator
  // (Communicator::DeviceMemory: NcclCommunicator, enqueued on the backend's stream behind the
  // layer that wrote x, no host wait). A device backend with a host communicator (Gloo between
  // ranks that share a GPU or lack NCCL: engine/pipeline/tp_transport.h) stages x through a host
  // copy (CopyToHost, AllReduceSum, CopyToDevice). Decode steps run eagerly under TP either way
  // (no CUDA graphs: a staged all-reduce cannot be captured, and NCCL's would bind the graph to
  // the communicator of one group epoch).
  // A failure (a dead or stuck peer, a mismatched collective) is kept in status(), the first
  // one; the model returns it after the step. Every rank must call AllReduce the same number of
  // times with the same shapes (the same layers, the same batch).
  void AllReduce(Backend* backend, const MatView& x);
  // Ends the step's collectives before the host waits on the backend (its first CopyToHost of
  // the step's results): with a device communicator and an all-reduce enqueued since the last
  // call, waits for them through Communicator::Synchronize, which polls the stream and NCCL's
  // asynchronous error and gives up after its op_timeout, aborting the communicator, so a dead
  // or stuck peer fails the step instead of hanging the stream (a blocking copy behind a stuck
  // NCCL kernel would never return). Nothing otherwise. Returns status().
  const absl::Status& Finish();
  // The first AllReduce failure, OK if none. Sticky: the communicator is poisoned by then.
  const absl::Status& status() const { return status_; }

 private:
  int rank_ = 0, size_ = 1;
  Communicator* comm_ = nullptr;
  std::vector<float> staging_;  // host copy of x on device backends with a host communicator
  bool pending_ = false;        // device all-reduces enqueued since the last Finish()
  absl::Status status_;
};

}  // namespace glm::engine
