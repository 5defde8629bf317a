#include "agent/shard/shard_host.h"

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "agent/shard/controller_rendezvous.h"
#include "agent/shard/progress.h"
#include "agent/shard/releasing_weights.h"
#include "common/human_bytes.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "engine/backend/backend.h"
#include "engine/backend/create_backend.h"
#include "engine/config/model_config.h"
#include "engine/model/glm_moe_dsa.h"
#include "engine/model/forward_batch.h"
#include "engine/weights/tensor_filter.h"
#include "engine/weights/weight_store.h"
#include "google/protobuf/util/message_differencer.h"

namespace glm::agent {
namespace {

constexpr int64_t kDefaultKvCacheBytes = int64_t{1} << 30;  // EngineOptions' default
constexpr int kDefaultKvBlockSize = 16;
constexpr int kMaxMtpDraftTokens = 16;  // the bound cluster.yaml allows (cluster_spec)
// Upper bounds on what a request may ask for. They keep hostile values away from the time and
// size arithmetic (a deadline of now + INT64_MAX ms overflows); real plans stay far below.
constexpr int64_t kMaxRequestTimeoutMs = int64_t{24} * 3600 * 1000;  // a day
constexpr int kMaxGroupSize = 1024;          // tp_size, pp_size
constexpr double kMaxPageCacheIntervalS = 86400;

// INVALID_ARGUMENT naming `field` when `value_ms` is negative or beyond a day; OK otherwise.
absl::Status CheckTimeoutMs(const std::string& prefix, const std::string& field,
                            int64_t value_ms) {
  if (value_ms >= 0 && value_ms <= kMaxRequestTimeoutMs) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      prefix, field, " = ", value_ms, " is outside [0, ", kMaxRequestTimeoutMs,
      "] ms (0 = the default); nothing was changed. Fix: start shards through glm-controller "
      "(glmctl up), which sends timeouts from cluster.yaml's lifecycle settings"));
}

int64_t Millis(Clock::Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// <proc_root>/meminfo MemAvailable in bytes.
absl::StatusOr<uint64_t> MemAvailableBytes(const std::string& proc_root) {
  const std::string path = proc_root + "/meminfo";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v(line);
    if (!absl::ConsumePrefix(&v, "MemAvailable:")) continue;
    v = absl::StripAsciiWhitespace(v);
    absl::ConsumeSuffix(&v, "kB");
    uint64_t kb = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &kb)) return kb * 1024;
  }
  return absl::NotFoundError(absl::StrCat(path, ": no MemAvailable line"));
}

// "layers [0, 3) of /models/x (pp0, tp 1/4)".
std::string Describe(const glm::v1::LoadShardRequest& r) {
  return absl::StrCat("layers [", r.layer_begin(), ", ", r.layer_end(), ") of ", r.model_dir(),
                      " (pp", r.shard().pp_rank(), ", tp ", r.shard().tp_rank(), "/",
                      std::max(1, r.tp_size()), ")");
}

// Runs PageCacheManager::Tick on a real-time timer until destroyed (the load loop ticks too;
// this catches a load stuck inside one read, the case the adaptive stall drop is for).
class PolicyTicker {
 public:
  PolicyTicker(pagecache::PageCacheManager* pages, Clock::Duration interval, bool start) {
    if (!start) return;
    thread_ = std::thread([this, pages, interval] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, interval, [this] { return stop_; })) {
        lock.unlock();
        pages->Tick();
        lock.lock();
      }
    });
  }
  ~PolicyTicker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

glm::v1::PageCacheStatus SummarizePageCache(const pagecache::PageCacheManager& pages,
                                            const std::string& policy) {
  glm::v1::PageCacheStatus s;
  s.set_policy(policy);
  for (const pagecache::Action& a : pages.actions()) {
    switch (a.kind) {
      case pagecache::Action::Kind::kFadvise:
        s.set_fadvise_ranges(s.fadvise_ranges() + 1);
        s.set_fadvise_bytes_freed(s.fadvise_bytes_freed() + static_cast<int64_t>(a.bytes_freed));
        break;
      case pagecache::Action::Kind::kDropCaches:
        s.set_drop_caches_count(s.drop_caches_count() + 1);
        s.set_drop_caches_bytes_freed(s.drop_caches_bytes_freed() +
                                      static_cast<int64_t>(a.bytes_freed));
        s.set_last_drop_reason(a.reason);
        break;
      case pagecache::Action::Kind::kNotPermitted:
        s.set_drop_not_permitted(true);
        s.set_drop_not_permitted_message(absl::StrCat(
            "drop_caches not permitted (", a.reason,
            "); continued with per-range fadvise only. Fix: run glm-agent as root with a "
            "writable /proc/sys, or set page_cache.policy: off"));
        break;
    }
  }
  return s;
}

}  // namespace

struct ShardHost::Loaded {
  std::unique_ptr<engine::Backend> backend;
  std::unique_ptr<engine::Model> model;  // destroyed before the backend it lives on
};

ShardHost::ShardHost(ShardHostOptions options) : options_(std::move(options)) {
  status_.set_state(glm::v1::SHARD_STATE_NONE);
}

ShardHost::ShardHost(std::string node) : ShardHost(ShardHostOptions{.node = std::move(node)}) {}

ShardHost::~ShardHost() {
  StopMonitor();
  std::shared_ptr<engine::Engine> eng;
  {
    std::lock_guard<std::mutex> lock(mu_);
    eng = std::move(engine_);
  }
  eng.reset();  // before loaded_ (a single-rank model's backend)
}

glm::v1::ShardState ShardHost::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_.state();
}

glm::v1::ShardStatus ShardHost::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

engine::Model* ShardHost::model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loaded_ ? loaded_->model.get() : nullptr;
}

void ShardHost::Publish() {
  if (!options_.on_status) return;
  glm::v1::ShardStatus copy = status();
  options_.on_status(copy);
}

absl::Status ShardHost::Fail(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_.set_state(glm::v1::SHARD_STATE_FAILED);
    status_.set_last_error(std::string(status.message()));
  }
  GLM_LOG_ERROR("shard load failed node={}: {}", options_.node, ToStd(status.message()));
  Publish();
  return status;
}

absl::Status ShardHost::Load(const glm::v1::LoadShardRequest& req, const ProgressFn& progress) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "LoadShard on node '", options_.node,
          "': another load or stop of this shard is running; nothing was changed. Fix: wait for "
          "it (glmctl status shows the shard state) and retry"));
    }
    if (status_.state() == glm::v1::SHARD_STATE_LOADED ||
        status_.state() == glm::v1::SHARD_STATE_RUNNING) {
      if (google::protobuf::util::MessageDifferencer::Equals(req, loaded_request_)) {
        if (progress) {
          glm::v1::Progress p = MakeProgress(
              "done", absl::StrCat("shard already loaded (", Describe(req), "); nothing to do"),
              status_.bytes_total(), status_.bytes_total(), true);
          *p.mutable_shard() = status_;
          progress(p);
        }
        return absl::OkStatus();
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "LoadShard on node '", options_.node, "': this node already hosts a loaded shard (",
          Describe(loaded_request_), ") and the request asks for ", Describe(req),
          "; nothing was changed. Fix: stop the loaded shard first (StopShard; `glmctl down` "
          "stops every shard), then load again"));
    }
    busy_ = true;
  }
  // A failed (or head-stopped) group's engine goes before the new load.
  StopMonitor();
  std::shared_ptr<engine::Engine> previous;
  std::unique_ptr<Loaded> previous_loaded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    previous = std::move(engine_);
    previous_loaded = std::move(loaded_);
  }
  previous.reset();
  previous_loaded.reset();
  absl::Status s = DoLoad(req, progress);
  std::lock_guard<std::mutex> lock(mu_);
  busy_ = false;
  return s;
}

absl::Status ShardHost::DoLoad(const glm::v1::LoadShardRequest& req, const ProgressFn& progress) {
  Clock* const clock = options_.clock;
  const Clock::TimePoint start = clock->Now();
  const std::string model_dir = options_.model_dir.empty() ? req.model_dir() : options_.model_dir;
  const int tp_size = std::max(1, req.tp_size());
  const int pp_size = std::max(1, req.pp_size());
  const bool distributed = int64_t{tp_size} * pp_size > 1;
  // The engine's layer range is inclusive; the wire's is half-open.
  const int first_layer = req.layer_begin();
  const int last_layer = req.layer_end() - 1;
  const std::string backend_kind =
      engine::ResolveBackendKind(req.backend().empty() ? "auto" : req.backend());
  const std::string weight_dtype =
      !req.weight_dtype().empty() ? req.weight_dtype() : (backend_kind == "cpu" ? "fp32" : "auto");
  const std::string kv_dtype = req.kv_dtype().empty() ? "fp32" : req.kv_dtype();
  const std::string prefix = absl::StrCat("LoadShard on node '", options_.node, "': ");
  auto error = [&](absl::StatusCode code, const std::string& what, const std::string& fix) {
    return Fail(absl::Status(code, absl::StrCat(prefix, what, fix.empty() ? "" : ". Fix: ", fix)));
  };
  auto emit = [&](const glm::v1::Progress& p) {
    if (progress) progress(p);
  };

  std::string policy_name = req.page_cache().policy().empty() ? "off" : req.page_cache().policy();
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = glm::v1::ShardStatus();
    status_.set_state(glm::v1::SHARD_STATE_LOADING);
    status_.set_model_dir(model_dir);
    status_.set_layer_begin(req.layer_begin());
    status_.set_layer_end(req.layer_end());
    status_.set_pp_rank(req.shard().pp_rank());
    status_.set_tp_rank(req.shard().tp_rank());
    status_.set_tp_size(tp_size);
    status_.set_pp_size(pp_size);
    status_.set_head(req.shard().pp_rank() == 0 && req.shard().tp_rank() == 0);
    status_.set_backend(backend_kind);
    status_.set_weight_dtype(weight_dtype);
    status_.set_kv_dtype(kv_dtype);
    status_.mutable_page_cache()->set_policy(policy_name);
    status_.set_mtp_draft_tokens(req.mtp_draft_tokens());
  }
  Publish();

  if (model_dir.empty()) {
    return error(absl::StatusCode::kInvalidArgument, "model_dir is empty",
                 "set model.path in cluster.yaml or start glm-agent with --model-dir");
  }
  if (req.layer_begin() < 0 || req.layer_end() <= req.layer_begin()) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("layer range [", req.layer_begin(), ", ", req.layer_end(),
                              ") is empty or negative"),
                 "re-run glmctl up so the plan assigns this node its PP stage's layers");
  }
  if (req.mtp_draft_tokens() < 0 || req.mtp_draft_tokens() > kMaxMtpDraftTokens) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("mtp_draft_tokens = ", req.mtp_draft_tokens(), " is outside [0, ",
                              kMaxMtpDraftTokens, "]"),
                 "set model.mtp_draft_tokens in cluster.yaml to 0 (off) .. 16");
  }
  if (req.tp_size() < 0 || req.tp_size() > kMaxGroupSize || req.pp_size() < 0 ||
      req.pp_size() > kMaxGroupSize) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("tp_size = ", req.tp_size(), ", pp_size = ", req.pp_size(),
                              ": each must be in [0, ", kMaxGroupSize, "] (0 = 1)"),
                 "re-run glmctl up so the plan sets parallel.tensor and parallel.pipeline");
  }
  // Ranks index the groups of a distributed load; a standalone one (tp_size x pp_size = 1) may
  // carry its stage's rank as a label, bounded only by kMaxGroupSize.
  const auto outside = [distributed](int rank, int size) {
    return rank < 0 || rank >= (distributed ? size : kMaxGroupSize);
  };
  if (req.shard().replica() < 0 || outside(req.shard().pp_rank(), pp_size) ||
      outside(req.shard().tp_rank(), tp_size)) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("shard replica ", req.shard().replica(), " pp_rank ",
                              req.shard().pp_rank(), " tp_rank ", req.shard().tp_rank(),
                              " is not a rank of a group of pp_size ", pp_size, " x tp_size ",
                              tp_size, " (ranks count from 0)"),
                 "re-run glmctl up so the plan assigns this node its rank");
  }
  // The CUDA device of this node's shard (nodes[].gpu): several agents on one multi-GPU host
  // each take their own.
  if (req.gpu() < 0) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("gpu = ", req.gpu(), " (LoadShardRequest.gpu, nodes[].gpu in "
                              "cluster.yaml) is not a CUDA device ordinal"),
                 absl::StrCat("set nodes[].gpu of node '", options_.node,
                              "' to 0 (the first GPU) or another ordinal nvidia-smi -L lists"));
  }
  if (backend_kind == "cuda") {
    absl::StatusOr<int> devices = engine::CudaDeviceCount();
    if (devices.ok() && req.gpu() >= *devices) {
      return error(absl::StatusCode::kInvalidArgument,
                   absl::StrCat("nodes[].gpu = ", req.gpu(), " (LoadShardRequest.gpu) is past "
                                "this machine's ", *devices, " CUDA device(s)"),
                   absl::StrCat("set nodes[].gpu of node '", options_.node, "' in cluster.yaml "
                                "to an ordinal in 0..", *devices - 1, " (nvidia-smi -L lists them)"));
    }
  }
  absl::StatusOr<pagecache::Policy> policy = pagecache::ParsePolicy(policy_name);
  if (!policy.ok()) {
    return error(absl::StatusCode::kInvalidArgument, std::string(policy.status().message()),
                 "set page_cache.policy in cluster.yaml to off, periodic or adaptive");
  }
  // NaN fails both comparisons, so it is refused too.
  if (!(req.page_cache().interval_s() >= 0 &&
        req.page_cache().interval_s() <= kMaxPageCacheIntervalS)) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("page_cache.interval_s = ", req.page_cache().interval_s(),
                              " is outside [0, ", kMaxPageCacheIntervalS, "] seconds"),
                 "set page_cache.interval_s in cluster.yaml to a number of seconds up to a day");
  }

  // model.backend / model.weight_dtype as the plan states them ("" = this agent's choice).
  if (const std::string& b = req.backend();
      !b.empty() && b != "auto" && b != "cpu" && b != "cuda") {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("model.backend: ", b, " is not a backend this agent knows"),
                 "set model.backend in cluster.yaml to auto, cpu or cuda");
  }
  if (backend_kind == "cuda") {
    // Asked for by name: a node without a usable GPU fails here instead of running on the cpu.
    if (absl::Status cuda = engine::CudaBackendAvailable(); !cuda.ok()) {
      return error(absl::StatusCode::kFailedPrecondition,
                   absl::StrCat("model.backend: cuda, but CUDA is not usable on this node: ",
                                cuda.message()),
                   "check the node's GPU (nvidia-smi sees it, the driver is loaded, glm-agent was "
                   "built with CUDA), or set model.backend to auto or cpu in cluster.yaml");
    }
  }
  if (!req.weight_dtype().empty() && weight_dtype != "auto" && weight_dtype != "bf16" &&
      weight_dtype != "fp32") {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("model.weight_dtype: ", weight_dtype,
                              " is not a weight storage this agent knows"),
                 "set model.weight_dtype in cluster.yaml to auto, bf16 or fp32");
  }

  absl::StatusOr<engine::ModelConfig> config = engine::LoadModelConfig(model_dir);
  if (!config.ok()) {
    return error(config.status().code(), std::string(config.status().message()),
                 absl::StrCat("stage the model into ", model_dir,
                              " (glmctl up stages and verifies it) or point glm-agent "
                              "--model-dir at a complete copy"));
  }
  const int num_layers = config->num_hidden_layers;
  if (req.layer_end() > num_layers) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("layers [", req.layer_begin(), ", ", req.layer_end(), ")",
                              " were asked for, but ", model_dir, "/config.json has ", num_layers,
                              " decoder layers"),
                 "the plan was made for another checkpoint; re-run glmctl up so it is made "
                 "from this model's config.json");
  }

  engine::ModelLoadOptions mo;
  mo.model_dir = model_dir;
  mo.first_layer = first_layer;
  mo.last_layer = last_layer;
  mo.load_mtp = req.load_mtp();
  mo.num_threads = options_.num_threads;
  mo.backend = backend_kind;
  mo.device = req.gpu();
  mo.weight_dtype = weight_dtype;
  mo.kv.block_size = req.kv_block_size() > 0 ? req.kv_block_size() : kDefaultKvBlockSize;
  if (absl::Status s = engine::ParseKvDType(kv_dtype, &mo.kv.dtype); !s.ok()) {
    return error(s.code(), std::string(s.message()),
                 "set model.kv_cache_dtype in cluster.yaml to fp8 or bf16");
  }
  if (req.mtp_draft_tokens() > 0 && config->num_nextn_predict_layers == 0) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("model.mtp_draft_tokens is ", req.mtp_draft_tokens(), " but ",
                              model_dir,
                              "/config.json has num_nextn_predict_layers = 0 (no MTP layer)"),
                 "set model.mtp_draft_tokens: 0 in cluster.yaml, or serve a checkpoint with "
                 "its MTP layer");
  }
  const bool is_last = last_layer == num_layers - 1;
  const bool has_mtp = mo.load_mtp && is_last && config->num_nextn_predict_layers > 0;

  // Same selection as engine LoadGlmMoeDsa: the MTP layer needs the embedding and the head.
  engine::LayerSelection sel;
  sel.first_layer = first_layer;
  sel.last_layer = last_layer;
  sel.embedding = first_layer == 0 || has_mtp;
  sel.head = is_last;
  sel.num_hidden_layers = num_layers;
  sel.mtp = mo.load_mtp;
  engine::WeightStoreOptions so;
  if (config->quantization.has_value()) {
    so.block = {config->quantization->block_rows, config->quantization->block_cols};
  }
  so.quantization = config->quantization;
  so.filter = engine::LayerRangeFilter(sel);
  so.verify_total_size = false;
  absl::StatusOr<std::unique_ptr<engine::WeightStore>> store =
      engine::WeightStore::Open(model_dir, std::move(so));
  if (!store.ok()) {
    return error(store.status().code(), std::string(store.status().message()),
                 absl::StrCat("re-stage this node's copy of the model (glmctl up verifies every "
                              "file in ", model_dir,
                              " against the source's hashes and fetches bad ones from peers)"));
  }
  const engine::WeightStore& weights_store = **store;
  const uint64_t bytes_total = weights_store.total_tensor_bytes();
  uint64_t fp32_estimate = 0;
  int32_t tensors_total = 0;
  for (const std::string& name : weights_store.TensorNames()) {
    if (absl::EndsWith(name, "_scale_inv")) continue;  // read with (and folded into) its weight
    ++tensors_total;
    if (auto view = weights_store.Get(name); view.ok()) {
      fp32_estimate += static_cast<uint64_t>(view->num_elements()) * sizeof(float);
    }
  }

  // KV: the plan's per-node bytes, in this backend's layout (fp32 latent + indexer keys).
  const int64_t kv_bytes = req.kv_cache_bytes() > 0 ? req.kv_cache_bytes() : kDefaultKvCacheBytes;
  const int64_t per_token = engine::KvCacheBytesPerToken(*config, mo);
  const int64_t per_block = per_token * mo.kv.block_size;
  if (per_block <= 0 || kv_bytes / per_block < 1) {
    return error(absl::StatusCode::kResourceExhausted,
                 absl::StrCat("KV cache of ", HumanBytes((kv_bytes)),
                              " holds no block of ", mo.kv.block_size, " tokens (",
                              HumanBytes((per_block)), " per block for layers [",
                              req.layer_begin(), ", ", req.layer_end(), "))"),
                 "raise model.kv_cache_bytes (or the node's memory_budget_bytes) in cluster.yaml");
  }
  mo.kv.num_blocks = static_cast<int>(std::min<int64_t>(kv_bytes / per_block, 1 << 30));
  const uint64_t kv_alloc = static_cast<uint64_t>(mo.kv.num_blocks) * per_block;

  // Memory the load will take (weights as fp32, this rank's TP share of them, + KV) against
  // what is free.
  fp32_estimate /= static_cast<uint64_t>(tp_size);
  if (absl::StatusOr<uint64_t> available = MemAvailableBytes(options_.proc_root); available.ok()) {
    const uint64_t need = fp32_estimate + kv_alloc;
    if (need > *available) {
      return error(
          absl::StatusCode::kResourceExhausted,
          absl::StrCat("not enough memory for the plan: layers [", req.layer_begin(), ", ",
                       req.layer_end(), ") need ", HumanBytes(need), " (weights ", HumanBytes(fp32_estimate),
                       " as fp32 on the ", mo.backend, " backend + KV cache ", HumanBytes(kv_alloc),
                       ") but MemAvailable is ", HumanBytes(*available), " (", options_.proc_root,
                       "/meminfo)"),
          "lower model.kv_cache_bytes, spread the layers over more PP stages "
          "(parallel.pipeline), or free memory on the node (page cache is dropped by "
          "page_cache.policy)");
    }
  } else {
    GLM_LOG_WARN("shard load node={}: memory check skipped ({})", options_.node,
                 ToStd(available.status().message()));
  }

  // What Start gives the engine.
  engine::EngineOptions eo;
  eo.model_dir = model_dir;
  eo.kv_block_size = mo.kv.block_size;
  eo.kv_cache_bytes = kv_bytes;
  eo.num_threads = options_.num_threads;
  // The request's (cluster.yaml parallel.micro_batches) wins over the agent's own default.
  eo.max_steps_in_flight = req.max_steps_in_flight() > 0 ? req.max_steps_in_flight()
                                                         : options_.max_steps_in_flight;
  eo.backend = backend_kind;
  eo.device = req.gpu();
  eo.weight_dtype = weight_dtype;
  eo.kv_dtype = kv_dtype;
  eo.mtp_draft_tokens = req.mtp_draft_tokens();
  if (req.max_num_seqs() > 0) eo.max_num_seqs = req.max_num_seqs();
  if (req.max_model_len() > 0) eo.max_model_len = req.max_model_len();
  eo.shard.pp_rank = req.shard().pp_rank();
  eo.shard.pp_size = pp_size;
  eo.shard.tp_rank = req.shard().tp_rank();
  eo.shard.tp_size = tp_size;
  eo.shard.first_layer = first_layer;
  eo.shard.last_layer = last_layer;
  eo.shard.host = options_.group_host;

  const std::string what =
      absl::StrCat("layers ", first_layer, "-", last_layer,
                   sel.embedding ? " + embedding" : "", sel.head ? " + norm/lm_head" : "",
                   has_mtp ? " + MTP" : "");
  if (distributed) {
    // The TP slice is read once the replica's groups exist (Start).
    std::string summary = absl::StrFormat(
        "prepared %s (pp %d/%d, tp %d/%d, %s backend, %s weights, %s KV): %d tensors, %s in "
        "%s verified; the engine reads this rank's slice when the group starts; KV cache %s "
        "(%d blocks)",
        what, req.shard().pp_rank(), pp_size, req.shard().tp_rank(), tp_size, backend_kind,
        weight_dtype, kv_dtype, tensors_total, HumanBytes(bytes_total), model_dir,
        HumanBytes(kv_alloc), mo.kv.num_blocks);
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_.set_state(glm::v1::SHARD_STATE_LOADED);
      status_.set_bytes_total(static_cast<int64_t>(bytes_total));
      status_.set_tensors_total(tensors_total);
      status_.set_kv_cache_bytes(static_cast<int64_t>(kv_alloc));
      status_.set_kv_capacity_tokens(static_cast<int64_t>(mo.kv.num_blocks) * mo.kv.block_size);
      status_.set_load_time_ms(Millis(clock->Now() - start));
      loaded_ = std::make_unique<Loaded>();
      loaded_request_ = req;
      engine_options_ = eo;
    }
    GLM_LOG_INFO("shard prepared node={} {}", options_.node, summary);
    Publish();
    glm::v1::Progress last = MakeProgress("done", summary, 0, 0, true);
    *last.mutable_shard() = status();
    emit(last);
    return absl::OkStatus();
  }

  // Page cache: the cluster's policy runs while loading; each range is released once loaded.
  pagecache::Options po;
  po.policy = *policy;
  if (req.page_cache().interval_s() > 0) {
    po.period = std::chrono::duration_cast<Clock::Duration>(
        std::chrono::duration<double>(req.page_cache().interval_s()));
  }
  if (req.page_cache().min_available_bytes() > 0) {
    po.min_available_bytes = static_cast<uint64_t>(req.page_cache().min_available_bytes());
  }
  po.stall_timeout = options_.stall_timeout;
  po.proc_root = options_.proc_root;
  pagecache::PageCacheManager pages(
      po, clock, options_.make_kernel_ops ? options_.make_kernel_ops() : nullptr);
  pages.BeginLoad();

  {
    std::lock_guard<std::mutex> lock(mu_);
    status_.set_bytes_total(static_cast<int64_t>(bytes_total));
    status_.set_tensors_total(tensors_total);
  }
  emit(MakeProgress("load",
                    absl::StrCat("load: ", what, " of ", model_dir, " (", tensors_total,
                                 " tensors, ", HumanBytes(bytes_total), "), page cache policy ",
                                 policy_name),
                    0, static_cast<int64_t>(bytes_total)));

  Clock::TimePoint last_tick = start;
  uint64_t last_reported = 0;
  // A progress line (and a published status) per 5 % of the bytes, plus the last tensor.
  const uint64_t report_step = std::max<uint64_t>(bytes_total / 20, 1);
  auto on_tensor = [&](const std::string& name, int64_t tensors_read, uint64_t bytes_read) {
    pages.ReportProgress(bytes_read);
    if (options_.on_tensor) options_.on_tensor(name);
    const Clock::TimePoint now = clock->Now();
    if (po.policy != pagecache::Policy::kOff && now - last_tick >= options_.tick_interval) {
      pages.Tick();
      last_tick = now;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_.set_tensors_loaded(static_cast<int32_t>(tensors_read));
      status_.set_bytes_loaded(static_cast<int64_t>(bytes_read));
      status_.set_load_time_ms(Millis(now - start));
    }
    if (bytes_read - last_reported >= report_step || bytes_read >= bytes_total) {
      last_reported = bytes_read;
      glm::v1::PageCacheStatus pc = SummarizePageCache(pages, policy_name);
      {
        std::lock_guard<std::mutex> lock(mu_);
        *status_.mutable_page_cache() = pc;
      }
      Publish();
      emit(MakeProgress("load",
                        absl::StrCat("load: ", name, " (", tensors_read, "/", tensors_total,
                                     " tensors, ", HumanBytes(bytes_read), " / ", HumanBytes(bytes_total),
                                     ")"),
                        static_cast<int64_t>(bytes_read), static_cast<int64_t>(bytes_total)));
    }
  };

  auto loaded = std::make_unique<Loaded>();
  absl::StatusOr<std::unique_ptr<engine::Model>> model;
  ReleasingWeights weights(&weights_store, &pages, on_tensor);
  {
    PolicyTicker ticker(&pages, options_.tick_interval,
                        options_.tick_thread && po.policy != pagecache::Policy::kOff);
    absl::StatusOr<std::unique_ptr<engine::Backend>> backend =
        engine::CreateBackend(mo.backend, options_.num_threads, mo.device);
    if (backend.ok()) {
      loaded->backend = *std::move(backend);
      model = engine::CreateGlmMoeDsa(*config, weights, loaded->backend.get(), mo);
    } else {
      model = backend.status();
    }
    if (absl::Status released = weights.Finish(); !released.ok()) {
      GLM_LOG_WARN("shard load node={}: page-cache release: {}", options_.node,
                   ToStd(released.message()));
    }
    pages.EndLoad();
  }
  glm::v1::PageCacheStatus pc = SummarizePageCache(pages, policy_name);
  const Clock::Duration took = clock->Now() - start;
  {
    std::lock_guard<std::mutex> lock(mu_);
    *status_.mutable_page_cache() = pc;
    status_.set_load_time_ms(Millis(took));
  }
  if (!model.ok()) {
    return error(model.status().code(),
                 absl::StrCat(model_dir, ": ", model.status().message()),
                 "re-stage this node's copy of the model (glmctl up verifies every file against "
                 "the source's hashes); if it verifies, config.json does not match the weights");
  }
  loaded->model = *std::move(model);

  std::string summary = absl::StrFormat(
      "loaded %s in %.2f s: %d tensors, %s read, %s as fp32; KV cache %s (%d blocks, "
      "%d tokens at %s/token); page cache: %s freed by fadvise over %d ranges, policy %s",
      what, std::chrono::duration<double>(took).count(), weights.tensors_read(),
      HumanBytes(weights.bytes_read()), HumanBytes(weights.fp32_bytes()), HumanBytes(kv_alloc),
      mo.kv.num_blocks, static_cast<int64_t>(mo.kv.num_blocks) * mo.kv.block_size,
      HumanBytes((per_token)), HumanBytes((pc.fadvise_bytes_freed())),
      pc.fadvise_ranges(), policy_name);
  if (pc.drop_caches_count() > 0) {
    absl::StrAppend(&summary, absl::StrFormat(", %d drop_caches (%s)", pc.drop_caches_count(),
                                              HumanBytes((pc.drop_caches_bytes_freed()))));
  }
  if (pc.drop_not_permitted()) absl::StrAppend(&summary, ", drop_caches not permitted");
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_.set_state(glm::v1::SHARD_STATE_LOADED);
    status_.set_tensors_loaded(static_cast<int32_t>(weights.tensors_read()));
    status_.set_bytes_loaded(static_cast<int64_t>(weights.bytes_read()));
    status_.set_weight_memory_bytes(static_cast<int64_t>(weights.fp32_bytes()));
    status_.set_kv_cache_bytes(static_cast<int64_t>(kv_alloc));
    status_.set_kv_capacity_tokens(static_cast<int64_t>(mo.kv.num_blocks) * mo.kv.block_size);
    loaded_ = std::move(loaded);
    loaded_request_ = req;
    engine_options_ = eo;
  }
  GLM_LOG_INFO("shard loaded node={} {}", options_.node, summary);
  Publish();
  glm::v1::Progress last = MakeProgress("done", summary, static_cast<int64_t>(weights.bytes_read()),
                                        static_cast<int64_t>(weights.bytes_read()), true);
  *last.mutable_shard() = status();
  emit(last);
  return absl::OkStatus();
}

absl::Status ShardHost::Start(const glm::v1::StartShardRequest& req, const ProgressFn& progress) {
  const std::string prefix = absl::StrCat("StartShard on node '", options_.node, "': ");
  auto emit = [&](const glm::v1::Progress& p) {
    if (progress) progress(p);
  };
  engine::EngineOptions eo;
  std::unique_ptr<Loaded> loaded;
  std::shared_ptr<engine::Engine> previous;
  std::shared_ptr<const nccl::FunctionTable> nccl;  // outlives the engine started here
  std::string policy_name;
  glm::v1::PageCachePolicy page_cache;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, "another operation on this shard is running; nothing was changed. Fix: wait "
          "for it (glmctl status) and retry"));
    }
    const std::string group_key =
        absl::StrCat("replica-", req.shard().replica(), "/epoch-", req.shard().epoch());
    if (status_.state() == glm::v1::SHARD_STATE_RUNNING && status_.group_key() == group_key) {
      glm::v1::Progress p = MakeProgress(
          "done", absl::StrCat("shard already running in group ", group_key, "; nothing to do"),
          0, 0, true);
      *p.mutable_shard() = status_;
      emit(p);
      return absl::OkStatus();
    }
    // A previous group of this shard (running, drained, failed or stopped by its head) is torn
    // down and the shard joins the new epoch's group; every rank of the replica gets the same
    // start, so the whole group is re-formed.
    const bool restart = engine_ != nullptr && !loaded_request_.model_dir().empty();
    if (!restart && (status_.state() != glm::v1::SHARD_STATE_LOADED || loaded_ == nullptr)) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, "the shard is ", glm::v1::ShardState_Name(status_.state()),
          ", not Loaded; nothing was changed. Fix: load it first (glmctl up loads and starts "
          "every shard; after a failure, glmctl down then up)"));
    }
    const glm::v1::ShardId& loaded_id = loaded_request_.shard();
    if (loaded_id.replica() != req.shard().replica() ||
        loaded_id.pp_rank() != req.shard().pp_rank() ||
        loaded_id.tp_rank() != req.shard().tp_rank()) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, "the request is for replica ", req.shard().replica(), " pp ",
          req.shard().pp_rank(), " tp ", req.shard().tp_rank(), " but this node loaded replica ",
          loaded_id.replica(), " pp ", loaded_id.pp_rank(), " tp ", loaded_id.tp_rank(),
          "; nothing was changed. Fix: re-run glmctl up so load and start follow one plan"));
    }
    for (const auto& [field, value] :
         {std::pair<const char*, int64_t>{"connect_timeout_ms", req.connect_timeout_ms()},
          {"op_timeout_ms", req.op_timeout_ms()}}) {
      if (absl::Status s = CheckTimeoutMs(prefix, field, value); !s.ok()) return s;
    }
    eo = engine_options_;
    eo.shard.group_key = group_key;
    if (req.connect_timeout_ms() > 0) {
      eo.shard.connect_timeout = std::chrono::milliseconds(req.connect_timeout_ms());
    }
    if (req.op_timeout_ms() > 0) eo.shard.op_timeout = std::chrono::milliseconds(req.op_timeout_ms());
    if (eo.shard.distributed() && req.rendezvous_address().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "rendezvous_address is empty but the replica has ", eo.shard.world_size(),
          " ranks; nothing was changed. Fix: start shards through glm-controller (glmctl up)"));
    }
    previous = std::move(engine_);
    nccl = nccl_;
    eo.shard.nccl = nccl.get();
    loaded = std::move(loaded_);
    if (loaded == nullptr) loaded = std::make_unique<Loaded>();
    policy_name = loaded_request_.page_cache().policy().empty()
                      ? "off"
                      : loaded_request_.page_cache().policy();
    page_cache = loaded_request_.page_cache();
    busy_ = true;
    status_.set_group_key(group_key);
    status_.clear_last_error();
  }
  StopMonitor();  // the previous group's, if any (it stops by itself once engine_ moved)
  if (previous != nullptr) {
    // The old engine (and a single-rank model inside it) goes before the backend it ran on.
    previous.reset();
    loaded->model.reset();
    loaded->backend.reset();
  }
  const std::string rank = engine::DescribeRank(eo.shard, eo.shard.world_rank());
  emit(MakeProgress("start", absl::StrCat("start: ", rank, " of group ", eo.shard.group_key,
                                          " (", eo.shard.world_size(), " ranks, group address ",
                                          eo.shard.host, ", ", eo.backend, " backend)"),
                    0, 0));
  const Clock::TimePoint start = options_.clock->Now();
  std::unique_ptr<ControllerRendezvous> rendezvous;
  if (eo.shard.distributed()) {
    rendezvous = std::make_unique<ControllerRendezvous>(
        req.rendezvous_address(), options_.rendezvous_credentials, eo.shard.group_key);
    eo.shard.rendezvous = rendezvous.get();
  }
  absl::StatusOr<std::unique_ptr<engine::Engine>> created;
  if (loaded->model != nullptr) {
    // A single-rank replica: the model Load read (with page-cache release) runs as is.
    created = engine::Engine::CreateWithModel(std::move(loaded->model), eo);
  } else {
    // This rank reads its TP slice now; the cluster's page-cache policy runs meanwhile.
    absl::StatusOr<pagecache::Policy> policy = pagecache::ParsePolicy(policy_name);
    pagecache::Options po;
    po.policy = policy.ok() ? *policy : pagecache::Policy::kOff;
    if (page_cache.interval_s() > 0) {
      po.period = std::chrono::duration_cast<Clock::Duration>(
          std::chrono::duration<double>(page_cache.interval_s()));
    }
    if (page_cache.min_available_bytes() > 0) {
      po.min_available_bytes = static_cast<uint64_t>(page_cache.min_available_bytes());
    }
    po.stall_timeout = options_.stall_timeout;
    po.proc_root = options_.proc_root;
    pagecache::PageCacheManager pages(
        po, options_.clock, options_.make_kernel_ops ? options_.make_kernel_ops() : nullptr);
    pages.BeginLoad();
    {
      PolicyTicker ticker(&pages, options_.tick_interval,
                          options_.tick_thread && po.policy != pagecache::Policy::kOff);
      created = engine::Engine::Create(eo);
    }
    pages.EndLoad();
    glm::v1::PageCacheStatus pc = SummarizePageCache(pages, policy_name);
    std::lock_guard<std::mutex> lock(mu_);
    *status_.mutable_page_cache() = pc;
  }
  const Clock::Duration took = options_.clock->Now() - start;
  if (!created.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    absl::Status failed(created.status().code(),
                        absl::StrCat(prefix, rank, " of group ", eo.shard.group_key,
                                     " could not start: ", created.status().message()));
    if (rendezvous != nullptr) rendezvous->DeleteNamespace();
    return Fail(failed);
  }
  // The engine keeps the NCCL library its TP group uses (a later SetNcclLibrary may replace the
  // host's).
  std::shared_ptr<engine::Engine> eng(std::move(*created).release(),
                                      [nccl](engine::Engine* e) { delete e; });
  if (!eng->tp_transport().empty()) {
    GLM_LOG_INFO("shard tp transport node={} {}: {}", options_.node, rank, eng->tp_transport());
  }
  const engine::EngineStats stats = eng->Stats();
  std::string summary = absl::StrFormat(
      "running: %s of group %s (%s) in %.2f s on the %s backend; KV cache %d blocks of %d tokens",
      rank, eo.shard.group_key, eng->is_head() ? "head: takes Generate" : "follows the head",
      std::chrono::duration<double>(took).count(), eo.backend, stats.kv_num_blocks,
      eo.kv_block_size);
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    engine_ = eng;
    loaded_ = std::move(loaded);  // the backend a single-rank model lives on
    status_.set_state(glm::v1::SHARD_STATE_RUNNING);
    status_.set_head(eng->is_head());
    status_.set_tp_transport(eng->tp_transport());
    // What this rank holds now (a distributed rank read only its slice in Create).
    const engine::MemoryPlan plan = eng->memory_plan();
    if (plan.weights_bytes > 0) status_.set_weight_memory_bytes(plan.weights_bytes);
    if (plan.kv_bytes > 0) status_.set_kv_cache_bytes(plan.kv_bytes);
    status_.set_load_time_ms(status_.load_time_ms() + Millis(took));
    monitor_stop_ = false;
  }
  monitor_ = std::thread([this] { Monitor(); });
  GLM_LOG_INFO("shard started node={} {}", options_.node, summary);
  Publish();
  glm::v1::Progress last = MakeProgress("done", summary, 0, 0, true);
  *last.mutable_shard() = status();
  emit(last);
  return absl::OkStatus();
}

void ShardHost::SetNcclLibrary(std::shared_ptr<const nccl::FunctionTable> table) {
  std::lock_guard<std::mutex> lock(mu_);
  nccl_ = std::move(table);
}

void ShardHost::Monitor() {
  std::unique_lock<std::mutex> lock(mu_);
  int64_t last_tokens = 0;
  double last_compute_s = 0.0;
  auto last_time = std::chrono::steady_clock::now();
  bool first = true;
  while (!monitor_stop_) {
    std::shared_ptr<engine::Engine> eng = engine_;
    if (eng == nullptr) break;
    lock.unlock();
    const engine::EngineStats st = eng->Stats();
    const absl::Status health = eng->status();
    const auto now = std::chrono::steady_clock::now();
    const double secs = std::chrono::duration<double>(now - last_time).count();
    const double tps = first || secs <= 0
                           ? 0.0
                           : static_cast<double>(st.num_generated_tokens - last_tokens) / secs;
    const double busy =
        first || secs <= 0
            ? 0.0
            : std::clamp((st.stage_compute_seconds - last_compute_s) / secs, 0.0, 1.0);
    first = false;
    last_tokens = st.num_generated_tokens;
    last_compute_s = st.stage_compute_seconds;
    last_time = now;
    bool changed = false;
    lock.lock();
    if (monitor_stop_ || engine_ != eng) break;
    status_.set_steps(st.num_steps);
    status_.set_group_messages(st.num_group_messages);
    status_.set_kv_cache_usage(
        st.kv_num_blocks > 0
            ? 1.0 - static_cast<double>(st.kv_num_free_blocks) / st.kv_num_blocks
            : 0.0);
    status_.set_tokens_per_second(tps);
    status_.set_requests_in_flight(st.num_running + st.num_waiting);
    status_.set_steps_in_flight(st.num_steps_in_flight);
    status_.set_max_steps_in_flight_observed(st.max_steps_in_flight_observed);
    status_.set_stage_busy_fraction(busy);
    status_.set_spec_drafts(st.num_drafts);
    status_.set_spec_draft_tokens(st.num_draft_tokens);
    status_.set_spec_accepted_tokens(st.num_accepted_draft_tokens);
    status_.mutable_spec_accepted_per_position()->Assign(st.num_accepted_per_position.begin(),
                                                          st.num_accepted_per_position.end());
    if (!health.ok() && status_.state() != glm::v1::SHARD_STATE_FAILED) {
      status_.set_state(glm::v1::SHARD_STATE_FAILED);
      status_.set_last_error(absl::StrCat("shard group ", status_.group_key(), " failed on node '",
                                          options_.node, "': ", health.message()));
      GLM_LOG_ERROR("shard group failed node={}: {}", options_.node, ToStd(health.message()));
      changed = true;
    } else if (health.ok() && st.group_done && status_.state() == glm::v1::SHARD_STATE_RUNNING) {
      status_.set_state(glm::v1::SHARD_STATE_STOPPED);
      status_.set_last_error(absl::StrCat("the head of group ", status_.group_key(),
                                          " stopped the group"));
      changed = true;
    }
    (void)changed;
    lock.unlock();
    Publish();  // the stats double as the progress heartbeat
    lock.lock();
    monitor_cv_.wait_for(lock, options_.monitor_interval, [this] { return monitor_stop_; });
  }
}

void ShardHost::StopMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    monitor_stop_ = true;
  }
  monitor_cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
}

absl::Status ShardHost::Generate(const glm::v1::GenerateRequest& req,
                                 const std::function<bool(const glm::v1::TokenEvent&)>& write,
                                 const std::function<bool()>& cancelled) {
  std::shared_ptr<engine::Engine> eng;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (engine_ == nullptr || status_.state() != glm::v1::SHARD_STATE_RUNNING) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Generate on node '", options_.node, "': its shard is ",
          glm::v1::ShardState_Name(status_.state()),
          status_.last_error().empty() ? "" : absl::StrCat(" (", status_.last_error(), ")"),
          ", not Running. Fix: send requests through glm-controller (glmctl generate), which "
          "picks a Ready replica"));
    }
    if (!engine_->is_head()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Generate on node '", options_.node, "': this node hosts pp ", status_.pp_rank(),
          ", tp ", status_.tp_rank(), " of group ", status_.group_key(),
          ", not its head; requests go to the head shard (pp 0, tp 0) of that replica. Fix: "
          "send them through glm-controller (glmctl generate)"));
    }
    eng = engine_;
  }
  if (req.top_logprobs() < 0 || req.top_logprobs() > engine::kMaxLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Generate on node '", options_.node, "': GenerateRequest.top_logprobs = ",
        req.top_logprobs(), " is outside [0, ", engine::kMaxLogprobs, "]"));
  }
  if (req.top_logprobs() > 0 && !req.return_logprobs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Generate on node '", options_.node, "': GenerateRequest.top_logprobs = ",
        req.top_logprobs(), " needs return_logprobs = true"));
  }
  engine::Request request;
  request.prompt_ids.assign(req.prompt_token_ids().begin(), req.prompt_token_ids().end());
  request.sampling.max_tokens = req.max_tokens() > 0 ? req.max_tokens() : 16;
  request.sampling.temperature = req.temperature();
  if (req.top_p() > 0) request.sampling.top_p = req.top_p();
  request.sampling.top_k = req.top_k();
  request.sampling.stop_token_ids.assign(req.stop_token_ids().begin(),
                                         req.stop_token_ids().end());
  if (req.seed() != 0) request.sampling.seed = static_cast<uint64_t>(req.seed());
  request.sampling.min_tokens = req.min_tokens();
  request.sampling.ignore_eos = req.ignore_eos();
  if (req.return_logprobs()) request.sampling.logprobs = req.top_logprobs();
  if (req.has_mtp_draft_tokens()) request.sampling.num_draft_tokens = req.mtp_draft_tokens();
  absl::StatusOr<engine::RequestHandle> handle = eng->Submit(std::move(request));
  if (!handle.ok()) {
    return absl::Status(handle.status().code(),
                        absl::StrCat("Generate on node '", options_.node, "' (head of group ",
                                     status().group_key(), "): ", handle.status().message()));
  }
  int completion_tokens = 0;
  engine::TokenEvent ev;
  while (true) {
    if (!handle->stream->TryNext(&ev)) {
      if (cancelled && cancelled()) {
        eng->Abort(handle->id);
        handle->stream->CollectTokens();  // drains up to the aborted event
        return absl::CancelledError("the client cancelled the request");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
      continue;
    }
    glm::v1::TokenEvent out;
    if (ev.token_id >= 0) {
      out.add_token_ids(ev.token_id);
      ++completion_tokens;
      if (req.return_logprobs()) {
        glm::v1::TokenLogprob* lp = out.add_logprobs();
        lp->set_logprob(ev.logprob);
        for (const auto& [id, logprob] : ev.top_logprobs) {
          lp->add_top_ids(id);
          lp->add_top_logprobs(logprob);
        }
      }
    }
    if (ev.finished) {
      if (ev.finish_reason == engine::FinishReason::kError) {
        return absl::Status(ev.error.code(),
                            absl::StrCat("Generate on node '", options_.node, "' (head of group ",
                                         status().group_key(), "): ", ev.error.message()));
      }
      out.set_finished(true);
      switch (ev.finish_reason) {
        case engine::FinishReason::kStop: out.set_finish_reason("stop"); break;
        case engine::FinishReason::kLength: out.set_finish_reason("length"); break;
        default: out.set_finish_reason("abort"); break;
      }
      out.set_prompt_tokens(req.prompt_token_ids_size());
      out.set_completion_tokens(completion_tokens);
    }
    if (!write(out)) {
      if (!ev.finished) {
        eng->Abort(handle->id);
        handle->stream->CollectTokens();
      }
      return absl::CancelledError("the client went away");
    }
    if (ev.finished) return absl::OkStatus();
  }
}

absl::Status ShardHost::Drain(const glm::v1::DrainShardRequest& req, const ProgressFn& progress) {
  const std::string prefix = absl::StrCat("DrainShard on node '", options_.node, "': ");
  if (absl::Status s = CheckTimeoutMs(prefix, "timeout_ms", req.timeout_ms()); !s.ok()) return s;
  std::shared_ptr<engine::Engine> eng;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (engine_ == nullptr || (status_.state() != glm::v1::SHARD_STATE_RUNNING &&
                               status_.state() != glm::v1::SHARD_STATE_DRAINING)) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, "the shard is ", glm::v1::ShardState_Name(status_.state()),
          ", not Running; nothing to drain"));
    }
    eng = engine_;
    status_.set_state(glm::v1::SHARD_STATE_DRAINING);
  }
  Publish();
  const engine::EngineStats before = eng->Stats();
  const int in_flight = before.num_running + before.num_waiting;
  if (progress) {
    progress(MakeProgress("drain", absl::StrCat("drain: admitting nothing; ", in_flight,
                                               " request(s) in flight"), 0, 0));
  }
  // Engine::Drain blocks until nothing is in flight; the wait here is bounded, the drain itself
  // goes on in the background (it holds the engine) when the bound is hit.
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = done->get_future();
  std::thread([eng, done] { done->set_value(eng->Drain()); }).detach();
  const auto timeout = std::chrono::milliseconds(req.timeout_ms() > 0 ? req.timeout_ms() : 30'000);
  if (result.wait_for(timeout) != std::future_status::ready) {
    const engine::EngineStats now = eng->Stats();
    return absl::DeadlineExceededError(absl::StrCat(
        prefix, now.num_running + now.num_waiting, " request(s) still in flight after ",
        timeout.count(), " ms; the shard admits nothing and they go on. Fix: wait longer "
        "(timeout_ms) or stop the shard, which aborts them"));
  }
  absl::Status drained = result.get();
  if (!drained.ok()) return Fail(drained);
  const std::string line = absl::StrCat("drained: ", in_flight,
                                        " request(s) finished; the shard admits nothing");
  GLM_LOG_INFO("shard drain node={}: {}", options_.node, line);
  if (progress) {
    glm::v1::Progress p = MakeProgress("done", line, 0, 0, true);
    *p.mutable_shard() = status();
    progress(p);
  }
  return absl::OkStatus();
}

absl::Status ShardHost::Stop(const glm::v1::StopShardRequest&, const ProgressFn& progress) {
  StopMonitor();
  std::shared_ptr<engine::Engine> eng;
  std::unique_ptr<Loaded> freed;
  std::string line;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "StopShard on node '", options_.node,
          "': a load of this shard is running; nothing was changed. Fix: wait for it to end "
          "(glmctl status), then stop"));
    }
    switch (status_.state()) {
      case glm::v1::SHARD_STATE_LOADED:
      case glm::v1::SHARD_STATE_RUNNING:
      case glm::v1::SHARD_STATE_DRAINING:
        eng = std::move(engine_);
        freed = std::move(loaded_);
        loaded_request_.Clear();
        line = absl::StrCat("stopped: freed layers [", status_.layer_begin(), ", ",
                            status_.layer_end(), ") (",
                            HumanBytes((status_.weight_memory_bytes())),
                            " of weights, ", HumanBytes((status_.kv_cache_bytes())),
                            " of KV cache)");
        status_.set_state(glm::v1::SHARD_STATE_STOPPED);
        status_.set_weight_memory_bytes(0);
        status_.set_kv_cache_bytes(0);
        status_.set_kv_capacity_tokens(0);
        break;
      case glm::v1::SHARD_STATE_FAILED:
      case glm::v1::SHARD_STATE_STOPPED:
        eng = std::move(engine_);
        freed = std::move(loaded_);
        loaded_request_.Clear();
        line = status_.state() == glm::v1::SHARD_STATE_FAILED
                   ? "stopped: the failed shard's engine and memory were freed; state cleared"
                   : "no shard loaded (state SHARD_STATE_STOPPED); nothing to stop";
        status_.set_state(glm::v1::SHARD_STATE_STOPPED);
        break;
      default:
        line = absl::StrCat("no shard loaded (state ", glm::v1::ShardState_Name(status_.state()),
                            "); nothing to stop");
        break;
    }
  }
  // Destroying the head's engine aborts its requests and stops the followers; a request still
  // streaming holds the engine until its stream ends. The model goes before its backend.
  eng.reset();
  freed.reset();  // model, KV cache and backend memory go here, outside the lock
  GLM_LOG_INFO("shard stop node={}: {}", options_.node, line);
  Publish();
  if (progress) {
    glm::v1::Progress p = MakeProgress("done", line, 0, 0, true);
    *p.mutable_shard() = status();
    progress(p);
  }
  return absl::OkStatus();
}

}  // namespace glm::agent
