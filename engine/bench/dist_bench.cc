// glm-bench-dist: what one engine step costs when a replica spans TP and PP ranks, against the
// single-process model, split into compute and communication.
//
//   glm-bench-dist [--golden DIR] [--fixture NAME] [--no-golden] [--no-synthetic]
//                  [--layouts 1,tp2,pp2,tp2pp2] [--steps N] [--repeats R] [--batch B]
//                  [--context C] [--prefill P] [--threads N] [--hidden H] [--layers L]
//                  [--weight-dtype fp32|bf16] [--floor-iters N]
//
// Models: (a) a golden fixture (default tiny-sparse: 5 layers with IndexShare "shared" layers, so
// a PP boundary falls before one), (b) a synthetic model at GLM-5's hidden width (6144), head
// dims and index_topk (2048), with --layers layers (default 2: dense + MoE, indexers full then
// shared; 4 for PP 4), 8 heads, 4 experts top-2 of width 256 and a 4K vocab, random weights
// (random_weights.h): about 0.6 GB in fp32 at 2 layers (SyntheticConfig). The defaults finish in
// about a minute on 2 cores, most of it generating and loading weights.
//
// Layouts: "1" (one process, no communicator), "tpT", "ppP", "tpTppP". Every rank of a layout is
// a thread of this process: StageGroup over an InProcessRendezvous and Gloo on 127.0.0.1 (the
// production transport), the head a PipelinedModel, the others StageFollowers, exactly as
// Engine::Create wires them. CPU threads per rank = max(1, --threads / tp): the TP ranks of a
// stage run at once; stages run one after another (one step in flight), so each may use them all.
//
// Phases: decode batch 1 and batch B (one token per sequence per step over a C-token context)
// and a prefill chunk (P new tokens of one sequence per step). Each phase: one warm-up step, then
// R windows of N measured steps, each a Forward (one step in flight); the window of median step
// time is reported, with the range over the R windows. Printed per layout:
//   step ms        the head's wall time per Forward (mean over the window's N steps), its range,
//                  and the ratio to "1"
//   per rank       compute ms: wall time inside the rank's model (its layers) minus its TP
//                  all-reduces; comm ms = step ms - compute ms (all-reduces, hand-offs, waiting
//                  for the other stages: where the pipeline bubble shows). Then the time inside
//                  communicator calls per channel (MeteredCommunicator via
//                  ShardTopology::comm_meter): allred (tp), handoff (world: activations between
//                  stages; a Recv returns once the previous stage has computed), control (the
//                  step messages) and result (the last stage's result to the head).
//   PP boundary    bytes per token sent by one TP rank to the next stage, measured, and the
//                  formula hidden * 4 + (index_topk * 4 when the next stage starts on a "shared"
//                  layer); every TP rank of a stage sends its own copy.
//   TP all-reduce  bytes per token per layer, measured, and the formula 2 * hidden * 4 (the
//                  attention output and the MLP output), with calls per layer and time per call.
// Then per model the loopback floor: the same all-reduce and hand-off of one token's hidden row
// with no model around them (--floor-iters each, 0 = skip), next to what
// controller/plan/decode_projection.h projects for them with its default fabric.
// No figure is asserted; docs/benchmarks.md records a run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_util.h"
#include "engine/backend/backend.h"
#include "engine/config/model_config.h"
#include "engine/dist/gloo_communicator.h"
#include "engine/dist/in_process_rendezvous.h"
#include "engine/dist/metered_communicator.h"
#include "engine/model/glm_moe_dsa.h"
#include "engine/model/random_weights.h"
#include "engine/pipeline/pipelined_model.h"
#include "engine/pipeline/shard_topology.h"
#include "engine/pipeline/stage_follower.h"
#include "engine/pipeline/stage_group.h"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

struct Args {
  std::string golden;
  std::string fixture = "tiny-sparse";
  bool run_golden = true;
  bool run_synthetic = true;
  std::string layouts = "1,tp2,pp2,tp2pp2";
  int steps = 3;
  int repeats = 3;
  int floor_iters = 200;
  int batch = 8;
  int context = 32;
  int prefill = 16;
  int threads = 0;
  int64_t hidden = 6144;
  int layers = 2;
  std::string weight_dtype = "fp32";
};

struct Layout {
  int tp = 1, pp = 1;
  std::string name;
  int world() const { return tp * pp; }
};

// "1", "tp2", "pp4", "tp2pp2" (either order).
std::optional<Layout> ParseLayout(const std::string& s) {
  Layout l;
  l.name = s;
  if (s == "1") return l;
  size_t i = 0;
  bool any = false;
  while (i < s.size()) {
    int* field = nullptr;
    if (s.compare(i, 2, "tp") == 0) field = &l.tp;
    if (s.compare(i, 2, "pp") == 0) field = &l.pp;
    if (field == nullptr) return std::nullopt;
    i += 2;
    size_t j = i;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j == i || !absl::SimpleAtoi(s.substr(i, j - i), field) || *field < 1) return std::nullopt;
    i = j;
    any = true;
  }
  if (!any) return std::nullopt;
  return l;
}

// What the replica runs: a checkpoint directory, or a config with in-memory weights.
struct BenchModel {
  std::string name;
  ModelConfig config;
  std::string dir;                          // non-empty: LoadGlmMoeDsa from here
  std::unique_ptr<InMemoryWeights> weights;  // otherwise: CreateGlmMoeDsa over these
};

// Even split of the decoder layers over the stages: stage s holds [first, last].
std::pair<int, int> StageLayers(int num_layers, int pp_size, int pp_rank) {
  return {num_layers * pp_rank / pp_size, num_layers * (pp_rank + 1) / pp_size - 1};
}

absl::StatusOr<std::unique_ptr<Model>> LoadShard(const BenchModel& m, ModelLoadOptions o,
                                                 int threads,
                                                 std::unique_ptr<Backend>* backend) {
  o.num_threads = threads;
  o.load_mtp = false;
  if (!m.dir.empty()) {
    o.model_dir = m.dir;
    return LoadGlmMoeDsa(o);
  }
  *backend = CreateCpuBackend(threads);
  // The ranks read the same tensors at once: InMemoryWeights::ReadFloat only copies them out.
  return CreateGlmMoeDsa(m.config, *m.weights, backend->get(), o);
}

// A rank's own model, timed: the wall time inside Forward is the rank's compute, plus the TP
// all-reduces its layers issue (the meter's tp channel, subtracted by the report).
class TimedModel : public Model {
 public:
  explicit TimedModel(std::unique_ptr<Model> inner) : inner_(std::move(inner)) {}

  const ModelConfig& config() const override { return inner_->config(); }
  const KvCacheGeometry& kv_geometry() const override { return inner_->kv_geometry(); }
  absl::Status Forward(const ForwardBatch& batch, ForwardResult* result) override {
    const SteadyClock::time_point t0 = SteadyClock::now();
    absl::Status s = inner_->Forward(batch, result);
    nanos_.fetch_add((SteadyClock::now() - t0).count(), std::memory_order_relaxed);
    return s;
  }
  absl::Status ForwardMtp(const ForwardBatch& batch, const std::vector<std::vector<float>>& hidden,
                          ForwardResult* result) override {
    return inner_->ForwardMtp(batch, hidden, result);
  }
  MemoryPlan memory_plan() const override { return inner_->memory_plan(); }
  DecodeGraphStats decode_graph_stats() const override { return inner_->decode_graph_stats(); }
  absl::Status AfterFailedStep(const absl::Status& failure) const override {
    return inner_->AfterFailedStep(failure);
  }
  void ReleaseSequence(int64_t seq_id) override { inner_->ReleaseSequence(seq_id); }

  // Wall time inside Forward so far; any thread.
  int64_t nanos() const { return nanos_.load(std::memory_order_relaxed); }

 private:
  std::unique_ptr<Model> inner_;
  std::atomic<int64_t> nanos_{0};
};

// One rank's figures at one moment: its meter and the time inside its model.
struct RankSnapshot {
  CommSnapshot comm;
  int64_t model_nanos = 0;
};

// One replica of a layout, ready to step: the head's Model (PipelinedModel, or the plain model
// for layout "1"), the followers' loops and a meter per rank (world-rank order).
class Replica {
 public:
  ~Replica() {
    if (head_ != nullptr) head_->Stop();
    followers_.clear();  // joins their loops
    follower_models_.clear();
    head_.reset();
    single_.reset();
    backends_.clear();
  }

  static absl::StatusOr<std::unique_ptr<Replica>> Create(const BenchModel& m, const Layout& l,
                                                         const KvCacheGeometry& kv,
                                                         int total_threads,
                                                         const std::string& weight_dtype) {
    static std::atomic<int> next_group{0};
    auto r = std::unique_ptr<Replica>(new Replica());
    r->layout_ = l;
    const int world = l.world();
    r->backends_.resize(world);
    ModelLoadOptions base;
    base.kv = kv;
    base.weight_dtype = weight_dtype;
    if (world == 1) {
      GLM_ASSIGN_OR_RETURN(r->single_, LoadShard(m, base, total_threads, &r->backends_[0]));
      return r;
    }
    const int threads = std::max(1, total_threads / l.tp);
    const std::string key = absl::StrCat("bench/replica", next_group++, "/epoch1");
    r->meters_.resize(world);
    for (auto& meter : r->meters_) meter = std::make_unique<CommMeter>();
    r->timed_.resize(world, nullptr);
    std::vector<std::unique_ptr<pipeline::StageGroup>> groups(world);
    std::vector<std::unique_ptr<Model>> models(world);
    std::vector<absl::Status> status(world);
    std::vector<int> blocks(world, 0);
    std::vector<std::thread> threads_of_ranks;
    for (int w = 0; w < world; ++w) {
      threads_of_ranks.emplace_back([&, w] {
        ShardTopology t;
        t.pp_rank = w / l.tp;
        t.pp_size = l.pp;
        t.tp_rank = w % l.tp;
        t.tp_size = l.tp;
        std::tie(t.first_layer, t.last_layer) =
            StageLayers(m.config.num_hidden_layers, l.pp, t.pp_rank);
        t.rendezvous = &r->rendezvous_;
        t.group_key = key;
        t.connect_timeout = std::chrono::seconds(120);
        // The head waits a whole step for the last stage: well above the longest step here.
        t.op_timeout = std::chrono::seconds(300);
        t.comm_meter = r->meters_[w].get();
        auto group = pipeline::StageGroup::Create(t, m.config);
        if (!group.ok()) {
          status[w] = group.status();
          return;
        }
        ModelLoadOptions o = base;
        o.first_layer = t.first_layer;
        o.last_layer = t.last_layer;
        o.tp_rank = t.tp_rank;
        o.tp_size = t.tp_size;
        o.tp_comm = (*group)->tp_comm();
        absl::StatusOr<std::unique_ptr<Model>> model = LoadShard(m, o, threads, &r->backends_[w]);
        absl::StatusOr<int> local =
            model.ok() ? absl::StatusOr<int>((*model)->kv_geometry().num_blocks) : model.status();
        absl::StatusOr<int> agreed = (*group)->AgreeKvBlocks(local);
        if (!agreed.ok()) {
          status[w] = agreed.status();
          return;
        }
        blocks[w] = *agreed;
        auto timed = std::make_unique<TimedModel>(*std::move(model));
        r->timed_[w] = timed.get();
        models[w] = std::move(timed);
        groups[w] = *std::move(group);
      });
    }
    for (std::thread& t : threads_of_ranks) t.join();
    for (int w = 0; w < world; ++w) {
      if (!status[w].ok()) {
        return Annotate(status[w], absl::StrCat("forming layout ", l.name, ", world rank ", w));
      }
    }
    r->follower_models_.resize(world);
    for (int w = 1; w < world; ++w) {
      r->follower_models_[w] = std::move(models[w]);
      r->followers_.push_back(std::make_unique<pipeline::StageFollower>(
          r->follower_models_[w].get(), std::move(groups[w])));
    }
    r->head_ = std::make_unique<pipeline::PipelinedModel>(std::move(models[0]),
                                                          std::move(groups[0]), blocks[0]);
    return r;
  }

  Model& model() { return head_ != nullptr ? static_cast<Model&>(*head_) : *single_; }
  const Layout& layout() const { return layout_; }
  bool metered() const { return !meters_.empty(); }

  absl::Status Forward(const ForwardBatch& batch, ForwardResult* result) {
    ++num_forwards_;
    return model().Forward(batch, result);
  }

  // Waits until every follower has served every step the head ran (a follower counts a step
  // once its last operation of it has returned, so its meter holds all of them), up to 60 s.
  absl::Status SettleFollowers() {
    const auto deadline = SteadyClock::now() + std::chrono::seconds(60);
    for (const auto& f : followers_) {
      while (f->num_steps() < num_forwards_) {
        if (!f->status().ok()) return f->status();
        if (SteadyClock::now() > deadline) {
          return absl::DeadlineExceededError("a follower did not finish its step within 60 s");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    return absl::OkStatus();
  }

  std::vector<RankSnapshot> Snapshots() const {
    std::vector<RankSnapshot> s(meters_.size());
    for (size_t w = 0; w < meters_.size(); ++w) {
      s[w].comm = meters_[w]->Snapshot();
      s[w].model_nanos = timed_[w]->nanos();
    }
    return s;
  }

 private:
  Replica() = default;

  Layout layout_;
  InProcessRendezvous rendezvous_;
  std::vector<std::unique_ptr<CommMeter>> meters_;
  std::vector<TimedModel*> timed_;  // per world rank; owned by head_ / follower_models_
  std::vector<std::unique_ptr<Backend>> backends_;  // per world rank (synthetic model)
  std::vector<std::unique_ptr<Model>> follower_models_;
  std::vector<std::unique_ptr<pipeline::StageFollower>> followers_;
  std::unique_ptr<pipeline::PipelinedModel> head_;
  std::unique_ptr<Model> single_;
  int64_t num_forwards_ = 0;
};

struct Phase {
  std::string name;
  int batch = 1;           // sequences per step
  int tokens_per_seq = 1;  // new tokens per sequence per step (1 = decode)
};

// One window of measured steps, or a phase's median window with the spread of all of them.
struct PhaseResult {
  bool ok = false;
  double step_ms = 0;
  double min_step_ms = 0, max_step_ms = 0;  // over the phase's windows
  int steps = 0;
  int64_t tokens = 0;                // new tokens over the window's steps
  std::vector<CommSnapshot> comm;    // per world rank, over the window
  std::vector<int64_t> model_nanos;  // per world rank: time inside its model's Forward
};

std::vector<int32_t> Tokens(int n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(n);
  uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (int i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t[i] = static_cast<int32_t>(x % static_cast<uint64_t>(vocab));
  }
  return t;
}

SequenceSlice Slice(int64_t seq_id, std::vector<int32_t> tokens, int start_pos,
                    int blocks_per_seq, int block_slot) {
  SequenceSlice s;
  s.seq_id = seq_id;
  s.token_ids = std::move(tokens);
  s.start_pos = start_pos;
  for (int b = 0; b < blocks_per_seq; ++b) s.block_table.push_back(block_slot * blocks_per_seq + b);
  s.sample.enabled = true;  // greedy on the last stage, as the scheduler asks: ids cross, not rows
  return s;
}

// Runs one phase: its context (decode) and a warm-up step, then --repeats windows of --steps
// measured steps each; returns the window of median step time, with the spread of all of them.
PhaseResult RunPhase(Replica& r, const Phase& p, const Args& a, int blocks_per_seq) {
  PhaseResult failed;
  const int64_t vocab = r.model().config().vocab_size;
  ForwardResult res;
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "%s, %s: %s\n", r.layout().name.c_str(), p.name.c_str(),
                 s.ToString().c_str());
    return failed;
  };
  int pos = 0;
  if (p.tokens_per_seq == 1 && a.context > 0) {  // decode: fill the context first
    ForwardBatch ctx;
    for (int s = 0; s < p.batch; ++s) {
      ctx.seqs.push_back(Slice(s + 1, Tokens(a.context, vocab, 10 + s), 0, blocks_per_seq, s));
    }
    if (absl::Status s = r.Forward(ctx, &res); !s.ok()) return fail(s);
    pos = a.context;
  }
  int step_index = 0;
  auto step = [&]() {
    ForwardBatch b;
    for (int s = 0; s < p.batch; ++s) {
      b.seqs.push_back(Slice(s + 1,
                             Tokens(p.tokens_per_seq, vocab, 1000 + 31 * step_index + s), pos,
                             blocks_per_seq, s));
    }
    pos += p.tokens_per_seq;
    ++step_index;
    return r.Forward(b, &res);
  };
  if (absl::Status s = step(); !s.ok()) return fail(s);  // warm-up
  std::vector<PhaseResult> windows;
  for (int rep = 0; rep < a.repeats; ++rep) {
    PhaseResult w;
    if (absl::Status s = r.SettleFollowers(); !s.ok()) return fail(s);
    const std::vector<RankSnapshot> before = r.Snapshots();
    const SteadyClock::time_point t0 = SteadyClock::now();
    for (int i = 0; i < a.steps; ++i) {
      if (absl::Status s = step(); !s.ok()) return fail(s);
    }
    const double seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    if (absl::Status s = r.SettleFollowers(); !s.ok()) return fail(s);
    const std::vector<RankSnapshot> after = r.Snapshots();
    for (size_t k = 0; k < after.size(); ++k) {
      w.comm.push_back(after[k].comm.Since(before[k].comm));
      w.model_nanos.push_back(after[k].model_nanos - before[k].model_nanos);
    }
    w.ok = true;
    w.steps = a.steps;
    w.step_ms = seconds * 1e3 / a.steps;
    w.tokens = static_cast<int64_t>(a.steps) * p.batch * p.tokens_per_seq;
    windows.push_back(std::move(w));
  }
  for (int s = 0; s < p.batch; ++s) r.model().ReleaseSequence(s + 1);
  std::sort(windows.begin(), windows.end(),
            [](const PhaseResult& x, const PhaseResult& y) { return x.step_ms < y.step_ms; });
  PhaseResult out = windows[windows.size() / 2];
  out.min_step_ms = windows.front().step_ms;
  out.max_step_ms = windows.back().step_ms;
  return out;
}

double Ms(int64_t nanos, int steps) { return nanos / 1e6 / steps; }

void PrintLayout(const BenchModel& m, const Layout& l, const PhaseResult& r,
                 std::optional<double> single_ms) {
  if (!r.ok) {
    std::printf("  %-8s failed (see stderr)\n", l.name.c_str());
    return;
  }
  std::printf("  %-8s step %9.2f ms (windows %.2f-%.2f)", l.name.c_str(), r.step_ms,
              r.min_step_ms, r.max_step_ms);
  if (single_ms.has_value()) std::printf("   x%.2f of single", r.step_ms / *single_ms);
  std::printf("\n");
  if (r.comm.empty()) return;
  // compute: in the rank's layers, all-reduces excluded; comm = step - compute. The columns
  // after it are time inside communicator calls per channel (waits for peers included); the
  // head's control and result calls run on threads of their own, beside its step thread.
  std::printf("    %-10s %10s %9s %9s %10s %9s %9s\n", "rank pp/tp", "compute ms", "comm ms",
              "allred", "handoff", "control", "result");
  for (size_t w = 0; w < r.comm.size(); ++w) {
    const CommSnapshot& c = r.comm[w];
    const int64_t allreduce = c.Total(CommChannel::kTp).nanos;
    const double compute = Ms(r.model_nanos[w] - allreduce, r.steps);
    std::printf("    %-4zu %2zu/%-3zu %10.2f %9.2f %9.2f %10.2f %9.2f %9.2f\n", w, w / l.tp,
                w % l.tp, compute, r.step_ms - compute, Ms(allreduce, r.steps),
                Ms(c.Total(CommChannel::kWorld).nanos, r.steps),
                Ms(c.Total(CommChannel::kControl).nanos, r.steps),
                Ms(c.Total(CommChannel::kResult).nanos, r.steps));
  }
  const ModelConfig& cfg = m.config;
  const double tokens = static_cast<double>(r.tokens);
  for (int s = 0; s + 1 < l.pp; ++s) {
    const CommOpTotals& sent = r.comm[s * l.tp].At(CommChannel::kWorld, CommOp::kSend);
    const int next_first = StageLayers(cfg.num_hidden_layers, l.pp, s + 1).first;
    const bool shared = cfg.indexer_types[next_first] == IndexerType::kShared;
    const int64_t formula = cfg.hidden_size * 4 + (shared ? cfg.index_topk * 4 : 0);
    std::printf("    PP boundary %d->%d (next starts on layer %d, %s): %.0f B/token measured, "
                "formula %lld = hidden*4%s; %.1f sends/step, %.2f ms each\n",
                s, s + 1, next_first, shared ? "shared" : "full", sent.bytes() / tokens,
                static_cast<long long>(formula), shared ? " + index_topk*4" : "",
                sent.calls / static_cast<double>(r.steps),
                sent.calls > 0 ? sent.nanos / 1e6 / sent.calls : 0.0);
  }
  const CommOpTotals msg = r.comm[0].Total(CommChannel::kControl);
  std::printf("    head per step: step messages %.0f B to %d ranks", msg.bytes() / double(r.steps),
              l.world() - 1);
  if (l.pp > 1) {
    const CommOpTotals res = r.comm[0].Total(CommChannel::kResult);
    std::printf(", result %.0f B", res.bytes() / static_cast<double>(r.steps));
  }
  std::printf("\n");
  if (l.tp > 1) {
    for (int s = 0; s < l.pp; ++s) {
      const auto [first, last] = StageLayers(cfg.num_hidden_layers, l.pp, s);
      const CommOpTotals& ar = r.comm[s * l.tp].At(CommChannel::kTp, CommOp::kAllReduce);
      std::printf("    TP all-reduce, stage %d (%d layers): %.0f B/token/layer measured, formula "
                  "%lld = 2*hidden*4; %.1f calls/layer/step, %.2f ms each\n",
                  s, last - first + 1, ar.bytes() / tokens / (last - first + 1),
                  static_cast<long long>(2 * cfg.hidden_size * 4),
                  ar.calls / static_cast<double>(r.steps) / (last - first + 1),
                  ar.calls > 0 ? ar.nanos / 1e6 / ar.calls : 0.0);
    }
  }
  std::fflush(stdout);
}

// GLM-5's hidden width (configs/models/glm-5/config.json), which sets the traffic, and its MLA
// head dims, kv_lora_rank, indexer head dim and index_topk; fewer layers, heads, experts and
// narrower projections and vocab, so the model fits in about 1 GB and a step runs in tens of
// milliseconds on a CPU. Layer 0 is dense, the rest MoE; the indexers alternate full / shared so
// that layer num_layers / 2 (where two stages split) is "shared" and its top-k crosses.
ModelConfig SyntheticConfig(int64_t hidden, int num_layers) {
  ModelConfig c = SmallTestConfig(num_layers, 1, /*index_share=*/false);
  for (int l = 1; l < num_layers; ++l) {
    if ((l - num_layers / 2) % 2 == 0) c.indexer_types[l] = IndexerType::kShared;
  }
  c.hidden_size = hidden;
  c.vocab_size = 4096;
  c.intermediate_size = 1024;
  c.moe_intermediate_size = 256;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 8;
  c.q_lora_rank = 1024;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 192;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 256;
  c.index_n_heads = 8;
  c.index_head_dim = 128;
  c.index_topk = 2048;
  c.n_routed_experts = 4;
  c.num_experts_per_tok = 2;
  c.n_shared_experts = 1;
  c.num_nextn_predict_layers = 0;
  return c;
}

// The loopback floor: the collectives of a step with no model around them, so no rank waits for
// another's compute. `ranks` threads, each with a GlooCommunicator on 127.0.0.1; rank 0 times
// `iters` all-reduces of `floats` and (2 ranks and more) `iters` ping-pongs of `floats` between
// ranks 0 and 1 (a hand-off = half a round trip). Medians and minima in microseconds.
struct CommFloor {
  bool ok = false;
  double allreduce_p50_us = 0, allreduce_min_us = 0;
  double handoff_p50_us = 0, handoff_min_us = 0;
};

CommFloor MeasureCommFloor(int ranks, size_t floats, int iters) {
  static std::atomic<int> next_group{0};
  InProcessRendezvous rendezvous;
  const std::string prefix = absl::StrCat("bench/floor", next_group++);
  std::vector<double> allreduce_us, handoff_us;
  std::vector<absl::Status> status(ranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      GlooCommunicatorOptions o;
      o.rank = rank;
      o.size = ranks;
      o.key_prefix = prefix;
      o.connect_timeout = std::chrono::seconds(60);
      o.op_timeout = std::chrono::seconds(60);
      auto comm = GlooCommunicator::Create(&rendezvous, o);
      if (!comm.ok()) {
        status[rank] = comm.status();
        return;
      }
      Communicator& c = **comm;
      std::vector<float> data(floats, 1.0f);  // [floats]
      auto run = [&]() -> absl::Status {
        GLM_RETURN_IF_ERROR(c.Barrier());
        for (int i = 0; i < iters; ++i) {
          const SteadyClock::time_point t0 = SteadyClock::now();
          GLM_RETURN_IF_ERROR(c.AllReduceSum(data.data(), floats));
          if (rank == 0) {
            allreduce_us.push_back(
                std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
          }
        }
        GLM_RETURN_IF_ERROR(c.Barrier());
        for (int i = 0; i < iters && rank < 2; ++i) {
          const SteadyClock::time_point t0 = SteadyClock::now();
          if (rank == 0) {
            GLM_RETURN_IF_ERROR(c.Send(data.data(), floats, 1));
            GLM_RETURN_IF_ERROR(c.Recv(data.data(), floats, 1));
            handoff_us.push_back(
                std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count() / 2);
          } else {
            GLM_RETURN_IF_ERROR(c.Recv(data.data(), floats, 0));
            GLM_RETURN_IF_ERROR(c.Send(data.data(), floats, 0));
          }
        }
        return c.Barrier();
      };
      status[rank] = run();
    });
  }
  for (std::thread& t : threads) t.join();
  CommFloor f;
  for (const absl::Status& st : status) {
    if (!st.ok()) {
      std::fprintf(stderr, "loopback floor, %d ranks: %s\n", ranks, st.ToString().c_str());
      return f;
    }
  }
  std::sort(allreduce_us.begin(), allreduce_us.end());
  std::sort(handoff_us.begin(), handoff_us.end());
  f.ok = !allreduce_us.empty() && !handoff_us.empty();
  if (!f.ok) return f;
  f.allreduce_p50_us = allreduce_us[allreduce_us.size() / 2];
  f.allreduce_min_us = allreduce_us.front();
  f.handoff_p50_us = handoff_us[handoff_us.size() / 2];
  f.handoff_min_us = handoff_us.front();
  return f;
}

// The floor for one decode token at this model's width, next to what the planner projects per
// all-reduce and per hand-off (controller/plan/decode_projection.h, its default fabric: 10 us
// per hop, 25 GB/s).
void PrintCommFloor(const ModelConfig& c, const std::vector<Layout>& layouts, int iters) {
  constexpr double kHopUs = 10.0, kLinkBytesPerUs = 25e9 / 1e6;
  std::vector<int> sizes;  // the TP sizes of the layouts; 2 for a layout of PP only
  for (const Layout& l : layouts) {
    if (l.world() > 1) sizes.push_back(std::max(l.tp, 2));
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const double bytes = static_cast<double>(c.hidden_size) * 4;
  for (int n : sizes) {
    const CommFloor f = MeasureCommFloor(n, static_cast<size_t>(c.hidden_size), iters);
    if (!f.ok) continue;
    std::printf(" loopback floor, no model, %d ranks, one token (%lld floats): all-reduce p50 %.0f "
                "us (min %.0f), projected %.1f; hand-off p50 %.0f us (min %.0f), projected %.1f\n",
                n, static_cast<long long>(c.hidden_size), f.allreduce_p50_us, f.allreduce_min_us,
                2.0 * (n - 1) * (kHopUs + bytes / n / kLinkBytesPerUs), f.handoff_p50_us,
                f.handoff_min_us, kHopUs + bytes / kLinkBytesPerUs);
  }
  std::fflush(stdout);
}

int RunModel(const BenchModel& m, const std::vector<Layout>& layouts, const Args& a,
             int threads) {
  const ModelConfig& c = m.config;
  std::printf("\nmodel %s: hidden %lld, %d layers, %d heads, %d experts top-%d, index_topk %lld, "
              "vocab %lld\n",
              m.name.c_str(), static_cast<long long>(c.hidden_size), c.num_hidden_layers,
              c.num_attention_heads, c.n_routed_experts, c.num_experts_per_tok,
              static_cast<long long>(c.index_topk), static_cast<long long>(c.vocab_size));
  const std::vector<Phase> phases = {
      {"decode batch 1", 1, 1},
      {absl::StrCat("decode batch ", a.batch), a.batch, 1},
      {absl::StrCat("prefill chunk of ", a.prefill), 1, a.prefill},
  };
  const int block_size = 16;
  const int measured = a.repeats * a.steps;
  const int max_len = std::max(a.context + measured + 1, a.prefill * (measured + 1));
  const int blocks_per_seq = max_len / block_size + 1;
  const KvCacheGeometry kv{block_size, blocks_per_seq * std::max(a.batch, 1)};
  // results[phase][layout]
  std::vector<std::vector<PhaseResult>> results(phases.size(),
                                                std::vector<PhaseResult>(layouts.size()));
  int failures = 0;
  std::vector<bool> skipped(layouts.size(), false);
  for (size_t li = 0; li < layouts.size(); ++li) {
    const Layout& l = layouts[li];
    if (c.num_hidden_layers < l.pp) {
      std::printf("  %s: skipped (%d layers < %d stages)\n", l.name.c_str(), c.num_hidden_layers,
                  l.pp);
      skipped[li] = true;
      continue;
    }
    const SteadyClock::time_point t0 = SteadyClock::now();
    auto replica = Replica::Create(m, l, kv, threads, a.weight_dtype);
    if (!replica.ok()) {
      std::fprintf(stderr, "%s %s: %s\n", m.name.c_str(), l.name.c_str(),
                   replica.status().ToString().c_str());
      ++failures;
      continue;
    }
    for (size_t pi = 0; pi < phases.size(); ++pi) {
      results[pi][li] = RunPhase(**replica, phases[pi], a, blocks_per_seq);
      if (!results[pi][li].ok) ++failures;
    }
    replica->reset();
    std::fprintf(stderr, "[%s %s: %.1f s with setup]\n", m.name.c_str(), l.name.c_str(),
                 std::chrono::duration<double>(SteadyClock::now() - t0).count());
  }
  for (size_t pi = 0; pi < phases.size(); ++pi) {
    if (phases[pi].tokens_per_seq == 1) {
      std::printf(" %s (median of %d windows of %d steps, after a %d-token context):\n",
                  phases[pi].name.c_str(), a.repeats, a.steps, a.context);
    } else {
      std::printf(" %s (median of %d windows of %d steps: consecutive chunks of one sequence):\n",
                  phases[pi].name.c_str(), a.repeats, a.steps);
    }
    std::optional<double> single;
    for (size_t li = 0; li < layouts.size(); ++li) {
      if (layouts[li].world() == 1 && results[pi][li].ok) single = results[pi][li].step_ms;
    }
    for (size_t li = 0; li < layouts.size(); ++li) {
      if (!skipped[li]) PrintLayout(m, layouts[li], results[pi][li], single);
    }
  }
  if (a.floor_iters > 0) PrintCommFloor(c, layouts, a.floor_iters);
  return failures;
}

int Main(int argc, char** argv) {
  Args a;
  if (const char* src = std::getenv("GLM_SOURCE_DIR"); src != nullptr) {
    a.golden = std::string(src) + "/tests/golden";
  } else {
    a.golden = "tests/golden";
  }
  const char* kUsage =
      "usage: glm-bench-dist [--golden DIR] [--fixture NAME] [--no-golden] [--no-synthetic] "
      "[--layouts 1,tp2,pp2,tp2pp2] [--steps N] [--repeats R] [--batch B] [--context C] "
      "[--prefill P] [--threads N] [--hidden H] [--layers L] [--weight-dtype fp32|bf16] "
      "[--floor-iters N]\n";
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n%s", k.c_str(), kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    auto next_int = [&](int lo) {
      const std::string v = next();
      int n = 0;
      if (!absl::SimpleAtoi(v, &n) || n < lo) {
        std::fprintf(stderr, "%s %s: want an integer >= %d\n", k.c_str(), v.c_str(), lo);
        std::exit(2);
      }
      return n;
    };
    if (k == "--golden") a.golden = next();
    else if (k == "--fixture") a.fixture = next();
    else if (k == "--no-golden") a.run_golden = false;
    else if (k == "--no-synthetic") a.run_synthetic = false;
    else if (k == "--layouts") a.layouts = next();
    else if (k == "--steps") a.steps = next_int(1);
    else if (k == "--repeats") a.repeats = next_int(1);
    else if (k == "--floor-iters") a.floor_iters = next_int(0);
    else if (k == "--batch") a.batch = next_int(1);
    else if (k == "--context") a.context = next_int(0);
    else if (k == "--prefill") a.prefill = next_int(1);
    else if (k == "--threads") a.threads = next_int(1);
    else if (k == "--hidden") a.hidden = next_int(64);
    else if (k == "--layers") a.layers = next_int(2);
    else if (k == "--weight-dtype") a.weight_dtype = next();
    else {
      std::fprintf(stderr, "%s", kUsage);
      return 2;
    }
  }
  std::vector<Layout> layouts;
  const std::vector<std::string> names = absl::StrSplit(a.layouts, ',', absl::SkipEmpty());
  for (const std::string& s : names) {
    std::optional<Layout> l = ParseLayout(s);
    if (!l.has_value()) {
      std::fprintf(stderr, "--layouts: '%s' is not 1, tpN, ppN or tpNppN\n", s.c_str());
      return 2;
    }
    layouts.push_back(*l);
  }
  const int threads = a.threads > 0 ? a.threads
                                    : std::max(1u, std::thread::hardware_concurrency());
  std::printf("glm-bench-dist: layouts %s, %d windows of %d steps per phase, batch %d, "
              "context %d, prefill chunk %d, %d CPU threads (per rank: threads / tp), weights "
              "%s, Gloo on 127.0.0.1\n",
              a.layouts.c_str(), a.repeats, a.steps, a.batch, a.context, a.prefill, threads,
              a.weight_dtype.c_str());
  int failures = 0;
  if (a.run_golden) {
    BenchModel m;
    m.name = a.fixture;
    m.dir = (fs::path(a.golden) / a.fixture).string();
    absl::StatusOr<ModelConfig> c = LoadModelConfig(m.dir);
    if (!c.ok()) {
      std::fprintf(stderr, "%s: %s (--golden DIR names tests/golden)\n", m.dir.c_str(),
                   c.status().ToString().c_str());
      return 1;
    }
    m.config = *c;
    failures += RunModel(m, layouts, a, threads);
  }
  if (a.run_synthetic) {
    BenchModel m;
    m.name = absl::StrCat("synthetic-", a.hidden);
    m.config = SyntheticConfig(a.hidden, a.layers);
    m.weights = std::make_unique<InMemoryWeights>();
    const SteadyClock::time_point t0 = SteadyClock::now();
    MakeRandomWeights(m.config, 7, m.weights.get());
    std::fprintf(stderr, "[synthetic weights: %.1f s]\n",
                 std::chrono::duration<double>(SteadyClock::now() - t0).count());
    failures += RunModel(m, layouts, a, threads);
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace glm::engine

int main(int argc, char** argv) { return glm::engine::Main(argc, argv); }
