#include "engine/pipeline/stage_group.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "engine/dist/device_stream.h"
#include "engine/dist/gloo_communicator.h"
#include "engine/dist/metered_communicator.h"
#include "engine/dist/nccl_communicator.h"
#include "engine/dist/rendezvous.h"
#include "engine/sample/logprobs.h"
#include "engine/sample/sampler.h"

namespace glm::engine::pipeline {
namespace {

std::string LayersKey(const ShardTopology& t, int world_rank) {
  return absl::StrCat(t.group_key, "/pipeline/layers/", world_rank);
}
std::string KvBlocksKey(const ShardTopology& t, int world_rank) {
  return absl::StrCat(t.group_key, "/pipeline/kv_blocks/", world_rank);
}
std::string TpPrefix(const ShardTopology& t) {
  return absl::StrCat(t.group_key, "/pipeline/tp", t.pp_rank);
}
std::string TpDeviceKey(const ShardTopology& t, int tp_rank) {
  return absl::StrCat(TpPrefix(t), "/device/", tp_rank);
}

// What this rank publishes for the TP transport choice.
TpRankDevice LocalDevice(const ShardTopology& t, const StageDevice& device) {
  TpRankDevice d;
  d.backend = device.backend;
  if (device.stream != nullptr) d.device_uuid = device.stream->device_uuid();
  if (t.nccl != nullptr && t.nccl->GetVersion != nullptr) {
    int version = 0;
    if (t.nccl->GetVersion(&version) == 0 && version > 0) d.nccl_version = version;
  }
  return d;
}

absl::StatusOr<std::pair<int, int>> GetLayers(const ShardTopology& t, int world_rank) {
  GLM_ASSIGN_OR_RETURN(std::string v,
                       t.rendezvous->Get(LayersKey(t, world_rank), t.connect_timeout));
  std::pair<std::string, std::string> parts = absl::StrSplit(v, ',');
  std::pair<int, int> range;
  if (!absl::SimpleAtoi(parts.first, &range.first) ||
      !absl::SimpleAtoi(parts.second, &range.second)) {
    return absl::DataLossError(absl::StrCat("rendezvous key ", LayersKey(t, world_rank),
                                            " holds '", v, "', not 'first,last'"));
  }
  return range;
}

// int32 / uint32 values carried as float bit patterns.
float Bits(uint32_t v) {
  float f;
  std::memcpy(&f, &v, sizeof(f));
  return f;
}
uint32_t Unbits(float f) {
  uint32_t v;
  std::memcpy(&v, &f, sizeof(v));
  return v;
}

// The last stage's result descriptor per slice: sampled_token, logits, hidden and logprob floats.
constexpr size_t kResultDescFloats = 4;

size_t NumTokens(const ForwardBatch& batch) {
  size_t n = 0;
  for (const SequenceSlice& s : batch.seqs) n += s.token_ids.size();
  return n;
}

}  // namespace

StageGroup::StageGroup(const ShardTopology& topology, const ModelConfig& config)
    : topology_(topology), config_(config) {
  if (topology_.last_layer < 0) topology_.last_layer = config_.num_hidden_layers - 1;
}

StageGroup::~StageGroup() = default;

absl::StatusOr<std::unique_ptr<StageGroup>> StageGroup::Create(const ShardTopology& topology,
                                                              const ModelConfig& config,
                                                              const StageDevice& device) {
  GLM_RETURN_IF_ERROR(ValidateShardTopology(topology, config));
  std::unique_ptr<StageGroup> g(new StageGroup(topology, config));
  const ShardTopology& t = g->topology_;
  const std::string me = DescribeRank(t, t.world_rank());
  GLM_RETURN_IF_ERROR(Annotate(
      t.rendezvous->Put(LayersKey(t, t.world_rank()),
                        absl::StrCat(t.first_layer, ",", t.last_layer)),
      absl::StrCat("publishing the layer range of ", me)));
  if (t.tp_size > 1) {
    GLM_RETURN_IF_ERROR(Annotate(
        t.rendezvous->Put(TpDeviceKey(t, t.tp_rank), LocalDevice(t, device).Encode()),
        absl::StrCat("publishing the TP device of ", me)));
  }

  GlooCommunicatorOptions wo;
  wo.rank = t.world_rank();
  wo.size = t.world_size();
  wo.key_prefix = absl::StrCat(t.group_key, "/pipeline/world");
  wo.host = t.host;
  wo.connect_timeout = t.connect_timeout;
  wo.op_timeout = t.op_timeout;
  auto world = GlooCommunicator::Create(t.rendezvous, wo);
  if (!world.ok()) {
    return g->PeerFailureOr(
        Annotate(world.status(), absl::StrCat("forming the replica's world group on ", me)));
  }
  g->world_ = *std::move(world);
  if (t.comm_meter != nullptr) {
    g->world_ = std::make_unique<MeteredCommunicator>(std::move(g->world_), t.comm_meter,
                                                      CommChannel::kWorld);
  }
  if (t.tp_size > 1) {
    if (absl::Status st = g->FormTpGroup(device); !st.ok()) {
      return g->PeerFailureOr(Annotate(
          st, absl::StrCat("forming the TP group of pp stage ", t.pp_rank, " on ", me)));
    }
  } else {
    g->tp_transport_.reason = "one rank: nothing to all-reduce";
  }

  // The head's messages and the last stage's results travel on communicators of their own: on
  // the head, other threads use them (stage_group.h).
  GlooCommunicatorOptions co = wo;
  co.key_prefix = absl::StrCat(t.group_key, "/pipeline/control");
  auto control = GlooCommunicator::Create(t.rendezvous, co);
  if (!control.ok()) {
    return g->PeerFailureOr(
        Annotate(control.status(), absl::StrCat("forming the replica's control group on ", me)));
  }
  g->control_ = *std::move(control);
  if (t.comm_meter != nullptr) {
    g->control_ = std::make_unique<MeteredCommunicator>(std::move(g->control_), t.comm_meter,
                                                        CommChannel::kControl);
  }
  if (t.pp_size > 1 && (t.is_head() || t.world_rank() == g->last_tp0())) {
    GlooCommunicatorOptions ro = wo;
    ro.rank = t.is_head() ? 0 : 1;
    ro.size = 2;
    ro.key_prefix = absl::StrCat(t.group_key, "/pipeline/result");
    auto result = GlooCommunicator::Create(t.rendezvous, ro);
    if (!result.ok()) {
      return g->PeerFailureOr(Annotate(
          result.status(), absl::StrCat("forming the head's result link on ", me)));
    }
    g->result_ = *std::move(result);
    if (t.comm_meter != nullptr) {
      g->result_ = std::make_unique<MeteredCommunicator>(std::move(g->result_), t.comm_meter,
                                                         CommChannel::kResult);
    }
  }

  if (absl::Status s = g->CheckNeighbours(); !s.ok()) {
    // The ranks that passed wait for this one in AgreeKvBlocks: tell them.
    (void)g->AgreeKvBlocks(s);
    return s;
  }
  return g;
}

absl::Status StageGroup::FormTpGroup(const StageDevice& device) {
  const ShardTopology& t = topology_;
  std::vector<TpRankDevice> ranks;
  for (int r = 0; r < t.tp_size; ++r) {
    GLM_ASSIGN_OR_RETURN(std::string v, t.rendezvous->Get(TpDeviceKey(t, r), t.connect_timeout));
    GLM_ASSIGN_OR_RETURN(TpRankDevice d, TpRankDevice::Decode(v));
    ranks.push_back(std::move(d));
  }
  tp_transport_ = ChooseTpTransport(ranks);
  GLM_LOG_INFO("tp transport group={} pp_rank={} tp_rank={} tp_size={} transport={}",
               t.group_key, t.pp_rank, t.tp_rank, t.tp_size, tp_transport_.Describe());
  if (tp_transport_.nccl()) {
    if (device.stream == nullptr || t.nccl == nullptr) {  // the choice rules this out
      return absl::InternalError("TP over NCCL chosen without a device stream or NCCL table");
    }
    NcclCommunicatorOptions no;
    no.rank = t.tp_rank;
    no.size = t.tp_size;
    no.key_prefix = absl::StrCat(TpPrefix(t), "/nccl");
    no.rendezvous_timeout = t.connect_timeout;
    no.init_timeout = t.connect_timeout;  // a TP peer that never joins NCCL's bootstrap
    no.op_timeout = t.op_timeout;
    GLM_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> nccl,
                         NcclCommunicator::Create(*t.nccl, device.stream, t.rendezvous, no));
    nccl_tp_ = nccl.get();
    tp_ = std::move(nccl);
  } else {
    GlooCommunicatorOptions to;
    to.rank = t.tp_rank;
    to.size = t.tp_size;
    to.key_prefix = TpPrefix(t);
    to.host = t.host;
    to.connect_timeout = t.connect_timeout;
    to.op_timeout = t.op_timeout;
    GLM_ASSIGN_OR_RETURN(tp_, GlooCommunicator::Create(t.rendezvous, to));
  }
  if (t.comm_meter != nullptr) {
    tp_ = std::make_unique<MeteredCommunicator>(std::move(tp_), t.comm_meter, CommChannel::kTp);
  }
  return absl::OkStatus();
}

absl::Status StageGroup::PeerFailureOr(const absl::Status& symptom) const {
  // A rank that fails its checks posts why (AgreeKvBlocks) and closes its connections, which the
  // others may see first as a broken group formation: the posted reason is the one to report.
  // The failing rank posts right after it closes, so wait a moment for the first peer only.
  const ShardTopology& t = topology_;
  const std::string kFailed = "failed: ";
  std::chrono::milliseconds wait(std::min<int64_t>(1000, t.connect_timeout.count()));
  for (int r = 0; r < t.world_size(); ++r) {
    if (r == t.world_rank()) continue;
    absl::StatusOr<std::string> v = t.rendezvous->Get(KvBlocksKey(t, r), wait);
    wait = std::chrono::milliseconds(0);
    if (v.ok() && absl::StartsWith(*v, kFailed)) {
      return absl::AbortedError(absl::StrCat(DescribeRank(t, r), " failed to load: ",
                                             v->substr(kFailed.size()), " (seen as: ",
                                             symptom.message(), ")"));
    }
  }
  return symptom;
}

absl::Status StageGroup::CheckNeighbours() const {
  const ShardTopology& t = topology_;
  const std::string me = DescribeRank(t, t.world_rank());
  // Every rank has published its range before joining the world group, so these are there.
  const int stage_tp0 = t.WorldRank(t.pp_rank, 0);
  if (t.tp_rank != 0) {
    GLM_ASSIGN_OR_RETURN(auto lead, GetLayers(t, stage_tp0));
    if (lead.first != t.first_layer || lead.second != t.last_layer) {
      return absl::InvalidArgumentError(absl::StrCat(
          me, " holds layers [", t.first_layer, ", ", t.last_layer, "] but ",
          DescribeRank(t, stage_tp0), " of the same stage holds [", lead.first, ", ",
          lead.second, "]: every TP rank of a stage must hold the same layers"));
    }
  }
  if (!t.first_stage()) {
    const int prev = t.WorldRank(t.pp_rank - 1, t.tp_rank);
    GLM_ASSIGN_OR_RETURN(auto before, GetLayers(t, prev));
    if (before.second + 1 != t.first_layer) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pp stage ", t.pp_rank, " starts at layer ", t.first_layer, " but stage ",
          t.pp_rank - 1, " (", DescribeRank(t, prev), ") ends at layer ", before.second,
          ": stages must tile the layers without gap or overlap (inclusive ranges)"));
    }
  }
  return absl::OkStatus();
}

void StageGroup::PostLoadFailure(const ShardTopology& topology, const absl::Status& failure) {
  if (topology.rendezvous == nullptr || !topology.distributed()) return;
  (void)topology.rendezvous->Put(KvBlocksKey(topology, topology.world_rank()),
                                 absl::StrCat("failed: ", failure.ToString()));
}

absl::StatusOr<int> StageGroup::AgreeKvBlocks(const absl::StatusOr<int>& local_blocks) {
  const ShardTopology& t = topology_;
  const std::string kFailed = "failed: ";
  GLM_RETURN_IF_ERROR(t.rendezvous->Put(
      KvBlocksKey(t, t.world_rank()),
      local_blocks.ok() ? std::to_string(*local_blocks)
                        : absl::StrCat(kFailed, local_blocks.status().ToString())));
  if (!local_blocks.ok()) {
    Close();
    return local_blocks.status();
  }
  int agreed = *local_blocks;
  for (int r = 0; r < t.world_size(); ++r) {
    if (r == t.world_rank()) continue;
    absl::StatusOr<std::string> v = t.rendezvous->Get(KvBlocksKey(t, r), t.connect_timeout);
    if (!v.ok()) {
      Close();
      return Annotate(v.status(), absl::StrCat("waiting for ", DescribeRank(t, r),
                                               " to load its layers"));
    }
    int n = 0;
    if (absl::StartsWith(*v, kFailed)) {
      Close();
      return absl::AbortedError(absl::StrCat(DescribeRank(t, r), " failed to load: ",
                                             v->substr(kFailed.size())));
    }
    if (!absl::SimpleAtoi(*v, &n)) {
      Close();
      return absl::DataLossError(absl::StrCat("rendezvous key ", KvBlocksKey(t, r), " holds '",
                                              *v, "', not a block count"));
    }
    agreed = std::min(agreed, n);
  }
  return agreed;
}

absl::Status StageGroup::failure() const {
  std::lock_guard<std::mutex> l(failure_mu_);
  return failure_;
}

void StageGroup::CloseOwned(Owned owned) {
  // A follower's one thread owns everything; the head's threads each own theirs.
  if (!topology_.is_head()) owned = kAll;
  if (owned & kStepComms) {
    world_.reset();
    // A failed group's NCCL peers may be gone or stuck: abort (ncclCommAbort) rather than let
    // ncclCommDestroy wait for them.
    if (nccl_tp_ != nullptr && !failure().ok()) nccl_tp_->Abort();
    nccl_tp_ = nullptr;
    tp_.reset();
  }
  if (owned & kControl) control_.reset();
  if (owned & kResult) result_.reset();
}

absl::Status StageGroup::Usable(Owned owned) {
  if (absl::Status f = failure(); !f.ok()) {
    CloseOwned(owned);
    return f;
  }
  const bool gone = ((owned & kStepComms) && world_ == nullptr) ||
                    ((owned & kControl) && control_ == nullptr) ||
                    ((owned & kResult) && result_ == nullptr && topology_.pp_size > 1);
  if (gone) return absl::FailedPreconditionError("the pipeline group is closed");
  return absl::OkStatus();
}

absl::Status StageGroup::Fail(const absl::Status& status, const std::string& what, Owned owned) {
  absl::Status first;
  {
    std::lock_guard<std::mutex> l(failure_mu_);
    if (failure_.ok()) {
      failure_ = Annotate(status, absl::StrCat(what, " on ",
                                               DescribeRank(topology_, topology_.world_rank())));
    }
    first = failure_;
  }
  CloseOwned(owned);
  return first;
}

absl::Status StageGroup::Barrier() {
  GLM_RETURN_IF_ERROR(Usable());
  if (absl::Status s = world_->Barrier(); !s.ok()) return Fail(s, "the replica's barrier");
  return absl::OkStatus();
}

void StageGroup::Close() { CloseOwned(kAll); }

absl::Status StageGroup::Send(const StepMessage& message) {
  GLM_RETURN_IF_ERROR(Usable(kControl));
  StepMessage m = message;
  m.sequence = ++sequence_;
  const std::string payload = EncodePayload(m);
  float header[kHeaderFloats];
  EncodeHeader(Header{m.kind, payload.size()}, header);
  const std::vector<float> body = BytesToFloats(payload);
  // World-rank order: the head's own stage's TP ranks first, then stage by stage, each send
  // waiting only for its receiver to take it.
  for (int r = 1; r < topology_.world_size(); ++r) {
    absl::Status s = control_->Send(header, kHeaderFloats, r);
    if (s.ok() && !body.empty()) s = control_->Send(body.data(), body.size(), r);
    if (!s.ok()) {
      return Fail(s,
                  absl::StrCat("sending the ", MessageKindName(m.kind), " message to ",
                               DescribeRank(topology_, r)),
                  kControl);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepMessage> StageGroup::Receive() {
  GLM_RETURN_IF_ERROR(Usable());
  float header[kHeaderFloats] = {};
  if (absl::Status s = control_->Recv(header, kHeaderFloats, 0); !s.ok()) {
    return Fail(s, "waiting for the head's next message");
  }
  absl::StatusOr<Header> h = DecodeHeader(header);
  if (!h.ok()) return Fail(h.status(), "decoding the head's message");
  std::vector<float> body(FloatsForBytes(h->payload_bytes));
  if (!body.empty()) {
    if (absl::Status s = control_->Recv(body.data(), body.size(), 0); !s.ok()) {
      return Fail(s, "receiving the head's message");
    }
  }
  absl::StatusOr<StepMessage> m = DecodePayload(h->kind, FloatsToBytes(body, h->payload_bytes));
  if (!m.ok()) return Fail(m.status(), "decoding the head's message");
  if (m->sequence != sequence_ + 1) {
    return Fail(absl::DataLossError(absl::StrCat("message ", m->sequence, " arrived after ",
                                                 sequence_, ": the ranks are out of step")),
                "receiving the head's message");
  }
  sequence_ = m->sequence;
  return m;
}

absl::Status StageGroup::RecvActivations(ForwardBatch& batch) {
  const ShardTopology& t = topology_;
  const size_t num_tokens = NumTokens(batch);
  const size_t H = config_.hidden_size, K = config_.index_topk;
  const bool with_topk = !config_.HasIndexer(t.first_layer);
  std::vector<float> buf(num_tokens * (H + (with_topk ? K : 0)));  // [T, H] then [T, K]
  const int prev = t.WorldRank(t.pp_rank - 1, t.tp_rank);
  if (absl::Status s = world_->Recv(buf.data(), buf.size(), prev); !s.ok()) {
    return Fail(s, absl::StrCat("receiving activations from pp stage ", t.pp_rank - 1, " (",
                                DescribeRank(t, prev), ")"));
  }
  size_t row = 0;
  for (SequenceSlice& s : batch.seqs) {
    const size_t n = s.token_ids.size();
    s.input_residual.assign(buf.begin() + row * H, buf.begin() + (row + n) * H);
    if (with_topk) {
      s.input_topk.resize(n * K);
      std::memcpy(s.input_topk.data(), buf.data() + num_tokens * H + row * K,
                  n * K * sizeof(int32_t));
    }
    row += n;
  }
  return absl::OkStatus();
}

absl::Status StageGroup::SendActivations(const ForwardBatch& batch, const ForwardResult& local) {
  const ShardTopology& t = topology_;
  const size_t num_tokens = NumTokens(batch);
  const size_t H = config_.hidden_size, K = config_.index_topk;
  const bool with_topk = !config_.HasIndexer(t.last_layer + 1);
  std::vector<float> buf(num_tokens * (H + (with_topk ? K : 0)));
  size_t row = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const size_t n = batch.seqs[i].token_ids.size();
    const SequenceOutput& out = local.seqs[i];
    if (out.residual.size() != n * H || (with_topk && out.topk.size() != n * K)) {
      return Fail(absl::InternalError(absl::StrCat(
                      "sequence ", batch.seqs[i].seq_id, ": the stage returned ",
                      out.residual.size(), " residual and ", out.topk.size(),
                      " top-k values for ", n, " tokens (hidden ", H, ", index_topk ", K, ")")),
                  "handing activations on");
    }
    std::copy(out.residual.begin(), out.residual.end(), buf.begin() + row * H);
    if (with_topk) {
      std::memcpy(buf.data() + num_tokens * H + row * K, out.topk.data(),
                  n * K * sizeof(int32_t));
    }
    row += n;
  }
  const int next = t.WorldRank(t.pp_rank + 1, t.tp_rank);
  if (absl::Status s = world_->Send(buf.data(), buf.size(), next); !s.ok()) {
    return Fail(s, absl::StrCat("sending activations to pp stage ", t.pp_rank + 1, " (",
                                DescribeRank(t, next), ")"));
  }
  return absl::OkStatus();
}

absl::Status StageGroup::SendResult(const ForwardBatch& batch, const ForwardResult& local) {
  if (local.seqs.size() != batch.seqs.size()) {
    return Fail(absl::InternalError(absl::StrCat("the last stage returned ", local.seqs.size(),
                                                 " outputs for ", batch.seqs.size(), " slices")),
                "sending the result");
  }
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  std::vector<float> desc;  // [num_seqs, kResultDescFloats]
  desc.reserve(batch.seqs.size() * kResultDescFloats);
  std::vector<float> data;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SequenceSlice& slice = batch.seqs[i];
    const SequenceOutput& out = local.seqs[i];
    int32_t token = out.sampled_token;
    size_t num_logits = out.logits.size();
    std::vector<float> logprobs;  // logprob, then (id bits, logprob) per alternative
    if (slice.sample.logprobs >= 0 && !slice.sample.enabled && !slice.all_logits &&
        token < 0 && num_logits == vocab) {
      // The head would draw this row on its host and compute its logprobs: do both here with
      // the same rule and send the pairs instead of the vocab row.
      SamplingParams p;
      p.temperature = slice.sample.temperature;
      p.top_k = slice.sample.top_k;
      p.top_p = slice.sample.top_p;
      const absl::Span<const float> row(out.logits);
      token = SampleToken(row, p, slice.sample.seed, slice.sample.index);
      const TokenLogprobs lp = ComputeLogprobs(row, token, slice.sample.logprobs);
      logprobs.push_back(lp.logprob);
      for (const auto& [id, value] : lp.top) {
        logprobs.push_back(Bits(static_cast<uint32_t>(id)));
        logprobs.push_back(value);
      }
      num_logits = 0;
    }
    desc.push_back(Bits(static_cast<uint32_t>(token)));
    desc.push_back(Bits(static_cast<uint32_t>(num_logits)));
    desc.push_back(Bits(static_cast<uint32_t>(out.hidden.size())));
    desc.push_back(Bits(static_cast<uint32_t>(logprobs.size())));
    data.insert(data.end(), out.logits.begin(), out.logits.begin() + num_logits);
    data.insert(data.end(), out.hidden.begin(), out.hidden.end());
    data.insert(data.end(), logprobs.begin(), logprobs.end());
  }
  absl::Status s = result_->Send(desc.data(), desc.size(), 0);
  if (s.ok() && !data.empty()) s = result_->Send(data.data(), data.size(), 0);
  if (!s.ok()) return Fail(s, "sending the last stage's result to the head (world rank 0)");
  return absl::OkStatus();
}

absl::Status StageGroup::RecvResult(const ForwardBatch& batch, ForwardResult* result) {
  GLM_RETURN_IF_ERROR(Usable(kResult));
  if (result_ == nullptr) {
    return absl::FailedPreconditionError("RecvResult: this rank receives no stage's result");
  }
  const int from = last_tp0();
  const std::string what = absl::StrCat("receiving the result from the last pp stage (",
                                        DescribeRank(topology_, from), ")");
  constexpr size_t D = kResultDescFloats;
  std::vector<float> desc(batch.seqs.size() * D);
  if (absl::Status s = result_->Recv(desc.data(), desc.size(), 1); !s.ok()) {
    return Fail(s, what, kResult);
  }
  size_t total = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const size_t num_logprobs = Unbits(desc[i * D + 3]);
    if (num_logprobs > 0 && num_logprobs % 2 != 1) {
      return Fail(absl::DataLossError(absl::StrCat("sequence ", batch.seqs[i].seq_id, ": ",
                                                   num_logprobs, " logprob values (not 1 + 2k)")),
                  what, kResult);
    }
    total += Unbits(desc[i * D + 1]) + Unbits(desc[i * D + 2]) + num_logprobs;
  }
  std::vector<float> data(total);
  if (total > 0) {
    if (absl::Status s = result_->Recv(data.data(), data.size(), 1); !s.ok()) {
      return Fail(s, what, kResult);
    }
  }
  result->seqs.assign(batch.seqs.size(), SequenceOutput{});
  size_t off = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    SequenceOutput& out = result->seqs[i];
    out.sampled_token = static_cast<int32_t>(Unbits(desc[i * D]));
    const size_t num_logits = Unbits(desc[i * D + 1]), num_hidden = Unbits(desc[i * D + 2]);
    const size_t num_logprobs = Unbits(desc[i * D + 3]);
    out.logits.assign(data.begin() + off, data.begin() + off + num_logits);
    off += num_logits;
    out.hidden.assign(data.begin() + off, data.begin() + off + num_hidden);
    off += num_hidden;
    if (num_logprobs > 0) {
      out.sampled_logprob = data[off];
      for (size_t j = 1; j + 1 < num_logprobs; j += 2) {
        out.top_logprobs.emplace_back(static_cast<int32_t>(Unbits(data[off + j])),
                                      data[off + j + 1]);
      }
      off += num_logprobs;
    }
  }
  return absl::OkStatus();
}

absl::Status StageGroup::RunStep(Model& model, ForwardBatch& batch, ForwardResult* result) {
  GLM_RETURN_IF_ERROR(Usable());
  const ShardTopology& t = topology_;
  if (!t.first_stage()) GLM_RETURN_IF_ERROR(RecvActivations(batch));
  ForwardResult local;
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status forward = model.Forward(batch, &local);
  compute_nanos_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - t0)
                        .count();
  if (absl::Status s = forward; !s.ok()) {
    return Fail(s, absl::StrCat("running pp stage ", t.pp_rank, " (layers ", t.first_layer, "-",
                                t.last_layer, ")"));
  }
  if (!t.last_stage()) {
    GLM_RETURN_IF_ERROR(SendActivations(batch, local));
  } else if (t.tp_rank == 0 && !t.is_head()) {
    GLM_RETURN_IF_ERROR(SendResult(batch, local));
  }
  *result = std::move(local);
  return absl::OkStatus();
}

absl::Status StageGroup::RunMtpStep(Model& model, const ForwardBatch& batch,
                                    const std::vector<std::vector<float>>& hidden,
                                    ForwardResult* result) {
  GLM_RETURN_IF_ERROR(Usable());
  const ShardTopology& t = topology_;
  if (t.last_stage()) {
    ForwardResult local;
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status forward = model.ForwardMtp(batch, hidden, &local);
    compute_nanos_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
    if (absl::Status s = forward; !s.ok()) {
      return Fail(s, "running the MTP layer");
    }
    if (t.tp_rank == 0 && !t.is_head()) GLM_RETURN_IF_ERROR(SendResult(batch, local));
    *result = std::move(local);
    return absl::OkStatus();
  }
  result->seqs.clear();
  return absl::OkStatus();
}

}  // namespace glm::engine::pipeline
