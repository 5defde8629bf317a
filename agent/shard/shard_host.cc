#include "agent/shard/shard_host.h"

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "agent/shard/progress.h"
#include "agent/shard/releasing_weights.h"
#include "common/human_bytes.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "engine/backend/backend.h"
#include "engine/backend/create_backend.h"
#include "engine/config/model_config.h"
#include "engine/model/glm_moe_dsa.h"
#include "engine/weights/tensor_filter.h"
#include "engine/weights/weight_store.h"
#include "google/protobuf/util/message_differencer.h"

namespace glm::agent {
namespace {

constexpr int64_t kDefaultKvCacheBytes = int64_t{1} << 30;  // EngineOptions' default
constexpr int kDefaultKvBlockSize = 16;

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

// "layers 0-2 of /models/x (pp0, tp 1/4)".
std::string Describe(const glm::v1::LoadShardRequest& r) {
  return absl::StrCat("layers ", r.first_layer(), "-", r.last_layer(), " of ", r.model_dir(),
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

ShardHost::~ShardHost() = default;

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
    status_.set_first_layer(req.first_layer());
    status_.set_last_layer(req.last_layer());
    status_.set_pp_rank(req.shard().pp_rank());
    status_.set_tp_rank(req.shard().tp_rank());
    status_.set_tp_size(tp_size);
    status_.set_backend(engine::ModelLoadOptions().backend);
    status_.mutable_page_cache()->set_policy(policy_name);
    if (tp_size > 1) {
      status_.set_tp_replicated(true);
      status_.set_tp_note(absl::StrCat(
          "not TP-sharded: the engine has no tensor-parallel sharding yet, so TP rank ",
          req.shard().tp_rank(), " of ", tp_size,
          " holds its stage's full layers (", tp_size, " identical copies in the TP group)"));
    }
  }
  Publish();

  if (model_dir.empty()) {
    return error(absl::StatusCode::kInvalidArgument, "model_dir is empty",
                 "set model.path in cluster.yaml or start glm-agent with --model-dir");
  }
  if (req.first_layer() < 0 || req.last_layer() < req.first_layer()) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("layer range ", req.first_layer(), "-", req.last_layer(),
                              " is empty or negative"),
                 "re-run glmctl up so the plan assigns this node its PP stage's layers");
  }
  absl::StatusOr<pagecache::Policy> policy = pagecache::ParsePolicy(policy_name);
  if (!policy.ok()) {
    return error(absl::StatusCode::kInvalidArgument, std::string(policy.status().message()),
                 "set page_cache.policy in cluster.yaml to off, periodic or adaptive");
  }

  absl::StatusOr<engine::ModelConfig> config = engine::LoadModelConfig(model_dir);
  if (!config.ok()) {
    return error(config.status().code(), std::string(config.status().message()),
                 absl::StrCat("stage the model into ", model_dir,
                              " (glmctl up stages and verifies it) or point glm-agent "
                              "--model-dir at a complete copy"));
  }
  const int num_layers = config->num_hidden_layers;
  if (req.last_layer() >= num_layers) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("layers ", req.first_layer(), "-", req.last_layer(),
                              " were asked for, but ", model_dir, "/config.json has ", num_layers,
                              " decoder layers"),
                 "the plan was made for another checkpoint; re-run glmctl up so it is made "
                 "from this model's config.json");
  }

  engine::ModelLoadOptions mo;
  mo.model_dir = model_dir;
  mo.first_layer = req.first_layer();
  mo.last_layer = req.last_layer();
  mo.load_mtp = req.load_mtp();
  mo.num_threads = options_.num_threads;
  mo.kv.block_size = req.kv_block_size() > 0 ? req.kv_block_size() : kDefaultKvBlockSize;
  const bool is_last = req.last_layer() == num_layers - 1;
  const bool has_mtp = mo.load_mtp && is_last && config->num_nextn_predict_layers > 0;

  // Same selection as engine LoadGlmMoeDsa: the MTP layer needs the embedding and the head.
  engine::LayerSelection sel;
  sel.first_layer = req.first_layer();
  sel.last_layer = req.last_layer();
  sel.embedding = req.first_layer() == 0 || has_mtp;
  sel.head = is_last;
  sel.num_hidden_layers = num_layers;
  sel.mtp = mo.load_mtp;
  engine::WeightStoreOptions so;
  if (config->quantization.has_value()) {
    so.block = {config->quantization->block_rows, config->quantization->block_cols};
  }
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
                              HumanBytes((per_block)), " per block for layers ",
                              req.first_layer(), "-", req.last_layer(), ")"),
                 "raise model.kv_cache_bytes (or the node's memory_budget_bytes) in cluster.yaml");
  }
  mo.kv.num_blocks = static_cast<int>(std::min<int64_t>(kv_bytes / per_block, 1 << 30));
  const uint64_t kv_alloc = static_cast<uint64_t>(mo.kv.num_blocks) * per_block;

  // Memory the load will take (weights as fp32 on the CPU backend + KV) against what is free.
  if (absl::StatusOr<uint64_t> available = MemAvailableBytes(options_.proc_root); available.ok()) {
    const uint64_t need = fp32_estimate + kv_alloc;
    if (need > *available) {
      return error(
          absl::StatusCode::kResourceExhausted,
          absl::StrCat("not enough memory for the plan: layers ", req.first_layer(), "-",
                       req.last_layer(), " need ", HumanBytes(need), " (weights ", HumanBytes(fp32_estimate),
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
  const std::string what =
      absl::StrCat("layers ", req.first_layer(), "-", req.last_layer(),
                   sel.embedding ? " + embedding" : "", sel.head ? " + norm/lm_head" : "",
                   has_mtp ? " + MTP" : "");
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
    // The engine's default backend kind (ModelLoadOptions::backend: "cpu" today).
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
      "loaded %s in %.2f s: %d tensors, %s read, %s of fp32 weights; KV cache %s (%d blocks, "
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
  std::string tp_note;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_.set_state(glm::v1::SHARD_STATE_LOADED);
    status_.set_tensors_loaded(static_cast<int32_t>(weights.tensors_read()));
    status_.set_bytes_loaded(static_cast<int64_t>(weights.bytes_read()));
    status_.set_weight_memory_bytes(static_cast<int64_t>(weights.fp32_bytes()));
    status_.set_kv_cache_bytes(static_cast<int64_t>(kv_alloc));
    status_.set_kv_capacity_tokens(static_cast<int64_t>(mo.kv.num_blocks) * mo.kv.block_size);
    tp_note = status_.tp_note();
    loaded_ = std::move(loaded);
    loaded_request_ = req;
  }
  if (!tp_note.empty()) absl::StrAppend(&summary, "; ", tp_note);
  GLM_LOG_INFO("shard loaded node={} {}", options_.node, summary);
  Publish();
  glm::v1::Progress last = MakeProgress("done", summary, static_cast<int64_t>(weights.bytes_read()),
                                        static_cast<int64_t>(weights.bytes_read()), true);
  *last.mutable_shard() = status();
  emit(last);
  return absl::OkStatus();
}

absl::Status ShardHost::Start(const glm::v1::StartShardRequest&, const ProgressFn&) {
  return absl::UnimplementedError(absl::StrCat(
      "StartShard on node '", options_.node, "': serving is not implemented in this glm-agent "
      "yet (joining the shard group through the rendezvous, the engine step loop and Generate "
      "are missing); the shard stays ", glm::v1::ShardState_Name(state()),
      " and nothing was changed"));
}

absl::Status ShardHost::Drain(const glm::v1::DrainShardRequest&, const ProgressFn&) {
  return absl::UnimplementedError(absl::StrCat(
      "DrainShard on node '", options_.node, "': serving is not implemented in this glm-agent "
      "yet, so there is nothing in flight to drain; nothing was changed"));
}

absl::Status ShardHost::Stop(const glm::v1::StopShardRequest&, const ProgressFn& progress) {
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
        freed = std::move(loaded_);
        loaded_request_.Clear();
        line = absl::StrCat("stopped: freed layers ", status_.first_layer(), "-",
                            status_.last_layer(), " (",
                            HumanBytes((status_.weight_memory_bytes())),
                            " of weights, ", HumanBytes((status_.kv_cache_bytes())),
                            " of KV cache)");
        status_.set_state(glm::v1::SHARD_STATE_STOPPED);
        status_.set_weight_memory_bytes(0);
        status_.set_kv_cache_bytes(0);
        status_.set_kv_capacity_tokens(0);
        break;
      case glm::v1::SHARD_STATE_FAILED:
        line = "stopped: the failed load left nothing loaded; state cleared";
        status_.set_state(glm::v1::SHARD_STATE_STOPPED);
        break;
      default:
        line = absl::StrCat("no shard loaded (state ", glm::v1::ShardState_Name(status_.state()),
                            "); nothing to stop");
        break;
    }
  }
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
