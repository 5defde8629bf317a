#include "engine/engine.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "engine/config/model_config.h"
#include "engine/pipeline/pipelined_model.h"
#include "engine/pipeline/stage_follower.h"
#include "engine/pipeline/stage_group.h"
#if GLM_ENGINE_HAVE_MODEL
#include "engine/backend/backend.h"
#include "engine/backend/create_backend.h"
#include "engine/model/glm_moe_dsa.h"
#endif

namespace glm::engine {

// ---- TokenStream ------------------------------------------------------------------------------

void TokenStream::Push(TokenEvent event) {
  {
    std::lock_guard<std::mutex> l(mu_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

bool TokenStream::Next(TokenEvent* event) {
  std::unique_lock<std::mutex> l(mu_);
  if (done_) return false;
  cv_.wait(l, [&] { return !events_.empty(); });
  *event = std::move(events_.front());
  events_.pop_front();
  if (event->finished) done_ = true;
  return true;
}

bool TokenStream::TryNext(TokenEvent* event) {
  std::lock_guard<std::mutex> l(mu_);
  if (done_ || events_.empty()) return false;
  *event = std::move(events_.front());
  events_.pop_front();
  if (event->finished) done_ = true;
  return true;
}

std::vector<int32_t> TokenStream::CollectTokens(TokenEvent* final_event) {
  std::vector<int32_t> tokens;
  TokenEvent ev;
  while (Next(&ev)) {
    if (ev.token_id >= 0) tokens.push_back(ev.token_id);
    if (ev.finished) {
      if (final_event != nullptr) *final_event = std::move(ev);
      break;
    }
  }
  return tokens;
}

// ---- Engine -----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
#if GLM_ENGINE_HAVE_MODEL
  GLM_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
  const bool mtp = options.mtp_draft_tokens > 0;
  if (mtp && config.num_mtp_layers() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MTP speculative decoding (mtp_draft_tokens=", options.mtp_draft_tokens,
        ") needs an MTP layer but ", options.model_dir,
        "/config.json has num_nextn_predict_layers=0: drop --mtp or use a checkpoint with one"));
  }
  if (options.kv_block_size < 1) {
    return absl::InvalidArgumentError("kv_block_size must be >= 1");
  }
  const ShardTopology& shard = options.shard;
  GLM_RETURN_IF_ERROR(ValidateShardTopology(shard, config));
  ModelLoadOptions load;
  load.model_dir = options.model_dir;
  load.first_layer = shard.first_layer;
  load.last_layer = shard.last_layer;
  load.kv.block_size = options.kv_block_size;
  GLM_RETURN_IF_ERROR(ParseKvDType(options.kv_dtype, &load.kv.dtype));
  load.load_mtp = mtp;
  int64_t num_blocks = options.kv_num_blocks;
  if (num_blocks <= 0 && options.gpu_memory_fraction > 0) {
    num_blocks = 0;  // the model sizes the KV cache from the fraction after a warm-up
  } else if (num_blocks <= 0) {
    // The model owns the KV storage, so it says how many bytes one block takes (of this
    // shard's layers).
    const int64_t per_block = KvCacheBytesPerToken(config, load) * options.kv_block_size;
    num_blocks = per_block > 0 ? options.kv_cache_bytes / per_block : 0;
    if (num_blocks < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_cache_bytes=", options.kv_cache_bytes, " holds no KV block of ", per_block,
          " bytes for this model: raise the KV budget"));
    }
  }
  load.kv.num_blocks = static_cast<int>(std::min<int64_t>(num_blocks, 1 << 30));
  load.num_threads = options.num_threads;
  load.backend = options.backend;
  load.device = options.device;
  load.cuda_graphs = options.cuda_graphs;
  load.gpu_memory_fraction = options.gpu_memory_fraction;
  load.plan_max_num_seqs = options.max_num_seqs;
  load.plan_max_batched_tokens = options.max_num_batched_tokens;
  load.plan_max_model_len = options.max_model_len;
  load.weight_dtype = options.weight_dtype;
  if (!shard.distributed()) {
    GLM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, LoadGlmMoeDsa(load));
    return CreateWithModel(std::move(model), options);
  }

  // A rank of a distributed replica: the backend first (a TP group over NCCL enqueues on its
  // stream, so it must exist before the group forms), then the groups (the model's layers need
  // the TP group), then this rank's layers on that backend, then the KV block count every rank
  // can hold.
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(load.backend, load.num_threads, load.device, load.kernel_policy);
  if (!backend.ok()) {
    // The other ranks are forming the groups: tell them why this one never joins.
    pipeline::StageGroup::PostLoadFailure(shard, backend.status());
    return backend.status();
  }
  pipeline::StageDevice device;
  device.backend = (*backend)->name();
  device.stream = (*backend)->device_stream();
  GLM_ASSIGN_OR_RETURN(std::unique_ptr<pipeline::StageGroup> group,
                       pipeline::StageGroup::Create(shard, config, device));
  const std::string tp_transport =
      shard.tp_size > 1 ? group->tp_transport().Describe() : std::string();
  // The TP communicator outlives the model: the group is destroyed after it (PipelinedModel,
  // StageFollower), and a closed group never runs the model again.
  load.tp_rank = shard.tp_rank;
  load.tp_size = shard.tp_size;
  load.tp_comm = group->tp_comm();
  absl::StatusOr<std::unique_ptr<Model>> model = LoadGlmMoeDsa(load, *std::move(backend));
  // Publishes this rank's block count, or its load failure so the other ranks fail at once.
  absl::StatusOr<int> local_blocks =
      model.ok() ? absl::StatusOr<int>((*model)->kv_geometry().num_blocks) : model.status();
  GLM_ASSIGN_OR_RETURN(const int agreed_blocks, group->AgreeKvBlocks(local_blocks));
  std::unique_ptr<Engine> engine;
  if (!shard.is_head()) {
    engine.reset(new Engine(*std::move(model), std::move(group), options));
  } else {
    auto pipelined = std::make_unique<pipeline::PipelinedModel>(
        *std::move(model), std::move(group), agreed_blocks, options.max_steps_in_flight);
    pipeline::PipelinedModel* raw = pipelined.get();
    GLM_RETURN_IF_ERROR(ValidateModelAndOptions(*pipelined, options));
    engine.reset(new Engine(std::move(pipelined), options, raw));
  }
  engine->tp_transport_ = tp_transport;  // before any other thread sees the engine
  return engine;
#else
  (void)options;
  return absl::UnimplementedError(
      "this build has no model library (glm_model); only Engine::CreateWithModel works");
#endif
}

absl::Status Engine::ValidateModelAndOptions(const Model& model, const EngineOptions& options) {
  if (options.max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_seqs=", options.max_num_seqs, " must be >= 1"));
  }
  if (options.max_steps_in_flight < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_steps_in_flight=", options.max_steps_in_flight,
        " must be >= 0 (0 = the replica's pp_size, 1 = one step at a time)"));
  }
  if (options.max_num_batched_tokens < 1 + std::max(options.mtp_draft_tokens, 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_num_batched_tokens=", options.max_num_batched_tokens,
        " must be >= 1 + mtp_draft_tokens (", options.mtp_draft_tokens, ")"));
  }
  if (options.mtp_draft_tokens > 0 && model.config().num_mtp_layers() == 0) {
    return absl::InvalidArgumentError(
        "mtp_draft_tokens > 0 but the model has no MTP layer (num_nextn_predict_layers=0)");
  }
  if (model.kv_geometry().num_blocks < 1 || model.kv_geometry().block_size < 1) {
    return absl::InvalidArgumentError("the model's KV geometry has no blocks");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::CreateWithModel(std::unique_ptr<Model> model,
                                                                 const EngineOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("CreateWithModel: model is null");
  GLM_RETURN_IF_ERROR(ValidateModelAndOptions(*model, options));
  return std::unique_ptr<Engine>(new Engine(std::move(model), options, nullptr));
}

Engine::Engine(std::unique_ptr<Model> model, const EngineOptions& options,
               pipeline::PipelinedModel* pipeline)
    : options_(options), model_(std::move(model)), pipeline_(pipeline) {
  SchedulerOptions so;
  so.max_num_seqs = options_.max_num_seqs;
  so.max_num_batched_tokens = options_.max_num_batched_tokens;
  so.enable_chunked_prefill = options_.enable_chunked_prefill;
  so.enable_prefix_caching = options_.enable_prefix_caching;
  so.num_draft_tokens = std::max(options_.mtp_draft_tokens, 0);
  so.max_model_len = options_.max_model_len;
  so.max_steps_in_flight = options_.max_steps_in_flight;
  scheduler_ = std::make_unique<Scheduler>(
      model_.get(), so, [this](int64_t id, TokenEvent ev) { Deliver(id, std::move(ev)); });
  seed_state_ = options_.seed != 0 ? options_.seed : std::random_device{}();
  stats_.kv_num_blocks = model_->kv_geometry().num_blocks;
  stats_.kv_num_free_blocks = stats_.kv_num_blocks;
  GLM_LOG_INFO(
      "engine started kv_blocks={} block_size={} max_num_seqs={} budget={} mtp={} "
      "steps_in_flight={}",
      model_->kv_geometry().num_blocks, model_->kv_geometry().block_size, options_.max_num_seqs,
      options_.max_num_batched_tokens, options_.mtp_draft_tokens,
      scheduler_->max_steps_in_flight());
  loop_ = std::thread([this] { Loop(); });
}

Engine::Engine(std::unique_ptr<Model> model, std::unique_ptr<pipeline::StageGroup> group,
               const EngineOptions& options)
    : options_(options), model_(std::move(model)) {
  const ShardTopology& t = options_.shard;
  GLM_LOG_INFO("engine follower started pp_rank={} tp_rank={} layers={}-{} kv_blocks={}",
               t.pp_rank, t.tp_rank, t.first_layer, t.last_layer,
               model_->kv_geometry().num_blocks);
  follower_ = std::make_unique<pipeline::StageFollower>(model_.get(), std::move(group));
}

Engine::~Engine() {
  if (follower_ != nullptr) {
    follower_.reset();  // joins its loop before the model goes
    return;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  loop_.join();
}

absl::StatusOr<RequestHandle> Engine::Submit(Request request) {
  if (follower_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "not the head shard: pp ", options_.shard.pp_rank, ", tp ", options_.shard.tp_rank,
        " follows the head (pp 0, tp 0), which takes the requests"));
  }
  if (absl::Status s = scheduler_->Validate(request); !s.ok()) return s;
  RequestHandle handle;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!failure_.ok()) return failure_;
    if (draining_ || stop_) {
      return absl::UnavailableError("engine is draining: not admitting new requests");
    }
    if (in_flight_ >= options_.max_queued_requests) {
      return absl::UnavailableError(absl::StrCat("engine has ", in_flight_,
                                                 " requests in flight (max_queued_requests): retry later"));
    }
    handle.id = next_id_++;
    handle.stream = std::make_shared<TokenStream>(handle.id);
    streams_[handle.id] = handle.stream;
    // SplitMix-style per-request default seed; a request's own seed wins in the scheduler.
    seed_state_ += 0x9e3779b97f4a7c15ULL;
    pending_.push_back(Pending{handle.id, std::move(request), seed_state_});
    ++in_flight_;
    ++stats_.num_requests_submitted;
  }
  work_cv_.notify_all();
  return handle;
}

void Engine::Abort(int64_t request_id) {
  if (follower_ != nullptr) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    aborts_.push_back(request_id);
  }
  work_cv_.notify_all();
}

absl::Status Engine::Drain() {
  if (follower_ != nullptr) return follower_->status();
  std::unique_lock<std::mutex> l(mu_);
  draining_ = true;
  idle_cv_.wait(l, [&] { return in_flight_ == 0; });
  return failure_;
}

absl::Status Engine::status() const {
  if (follower_ != nullptr) return follower_->status();
  std::lock_guard<std::mutex> l(mu_);
  return failure_;
}

EngineStats Engine::Stats() const {
  if (follower_ != nullptr) {
    // Requests and KV use are the head's to report; a follower reports its progress.
    EngineStats s;
    s.num_steps = follower_->num_steps();
    s.num_group_messages = follower_->num_messages();
    s.group_done = follower_->done();
    s.stage_compute_seconds = static_cast<double>(follower_->compute_nanos()) * 1e-9;
    s.failed = !follower_->status().ok();
    return s;
  }
  std::lock_guard<std::mutex> l(mu_);
  EngineStats s = stats_;
  s.num_waiting += static_cast<int>(pending_.size());
  s.failed = !failure_.ok();
  return s;
}

void Engine::Deliver(int64_t request_id, TokenEvent event) {
  std::shared_ptr<TokenStream> stream;
  const bool finished = event.finished;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = streams_.find(request_id);
    if (it == streams_.end()) return;
    stream = it->second;
    if (finished) streams_.erase(it);
  }
  stream->Push(std::move(event));
  // in_flight_ drops when the loop publishes its stats (PublishStats), so that Drain returning
  // implies Stats() already reflects every finished request.
  if (finished) ++finished_unpublished_;
}

void Engine::PublishStats() {
  const SchedulerStats ss = scheduler_->Stats();
  {
    std::lock_guard<std::mutex> l(mu_);
    in_flight_ -= finished_unpublished_;
    stats_.num_requests_finished += finished_unpublished_;
    finished_unpublished_ = 0;
    stats_.num_running = ss.num_running;
    stats_.num_waiting = ss.num_waiting;
    stats_.kv_num_blocks = ss.kv.num_blocks;
    stats_.kv_num_free_blocks = ss.kv.num_free_blocks;
    stats_.kv_num_cached_blocks = ss.kv.num_cached_blocks;
    stats_.num_steps = ss.num_steps;
    stats_.num_steps_completed = ss.num_steps_completed;
    stats_.num_steps_in_flight = ss.num_steps_in_flight;
    stats_.max_steps_in_flight_observed = ss.max_steps_in_flight_observed;
    stats_.num_preemptions = ss.num_preemptions;
    stats_.num_failed_steps = ss.num_failed_steps;
    stats_.num_prompt_tokens = ss.num_prompt_tokens;
    stats_.num_cached_prompt_tokens = ss.num_cached_prompt_tokens;
    stats_.num_computed_tokens = ss.num_computed_tokens;
    stats_.num_generated_tokens = ss.num_generated_tokens;
    stats_.num_drafts = ss.num_drafts;
    stats_.num_draft_tokens = ss.num_draft_tokens;
    stats_.num_accepted_per_position = ss.num_accepted_per_position;
    stats_.num_accepted_draft_tokens = ss.num_accepted_draft_tokens;
    stats_.draft_acceptance_rate = ss.draft_acceptance_rate();
    if (pipeline_ != nullptr) {
      stats_.num_group_messages = pipeline_->num_messages();
      stats_.stage_compute_seconds = static_cast<double>(pipeline_->compute_nanos()) * 1e-9;
    }
  }
  idle_cv_.notify_all();
}

void Engine::Loop() {
  while (true) {
    std::deque<Pending> pending;
    std::vector<int64_t> aborts;
    bool stop = false;
    absl::Status failure;
    const bool busy = scheduler_->HasWork();
    {
      std::unique_lock<std::mutex> l(mu_);
      auto ready = [&] { return stop_ || busy || !pending_.empty() || !aborts_.empty(); };
      if (pipeline_ != nullptr && failure_.ok()) {
        // Idle in a distributed replica: wake for the followers' heartbeat.
        work_cv_.wait_until(l, pipeline_->next_heartbeat(), ready);
      } else {
        work_cv_.wait(l, ready);
      }
      stop = stop_;
      failure = failure_;
      pending.swap(pending_);
      aborts.swap(aborts_);
    }
    for (Pending& p : pending) {
      absl::Status s = failure;
      if (s.ok() && !stop) s = scheduler_->Add(p.id, std::move(p.request), p.seed);
      if (!s.ok() || stop) {
        TokenEvent ev;
        ev.finished = true;
        ev.finish_reason = s.ok() ? FinishReason::kAborted : FinishReason::kError;
        ev.error = s;
        Deliver(p.id, std::move(ev));
      }
    }
    for (int64_t id : aborts) scheduler_->Abort(id);
    if (stop) {
      scheduler_->AbortAll();
      if (pipeline_ != nullptr) pipeline_->Stop();  // the followers leave their loops
      PublishStats();
      return;
    }
    absl::Status s;
    if (scheduler_->HasWork()) {
      s = scheduler_->Step();
    } else if (pipeline_ != nullptr && failure.ok()) {
      s = pipeline_->HeartbeatIfDue();
    }
    if (!s.ok()) {
      GLM_LOG_ERROR("engine step failed, failing all requests: {}", s.ToString());
      {
        std::lock_guard<std::mutex> l(mu_);
        failure_ = s;
      }
      scheduler_->FailAll(s);
    }
    PublishStats();
  }
}

}  // namespace glm::engine
