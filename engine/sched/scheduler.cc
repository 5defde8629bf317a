#include "engine/sched/scheduler.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "engine/sample/logprobs.h"
#include "engine/sample/sampler.h"
#include "engine/spec/mtp_drafter.h"

namespace glm::engine {

struct Scheduler::Sequence {
  int64_t id = 0;
  SamplingParams sampling;
  bool return_prompt_logits = false;
  uint64_t seed = 0;
  std::vector<int32_t> tokens;  // prompt + generated
  int num_prompt = 0;
  int64_t num_computed = 0;     // positions [0, num_computed) have final KV (main and MTP)
  std::vector<int32_t> drafts;  // MTP drafts for the positions after tokens.back()
  std::vector<float> prompt_logits;
  bool sent_first = false;
  bool in_flight = false;  // in an outstanding step
  bool aborted = false;    // aborted while in flight: finished when its step is collected
  int num_generated() const { return static_cast<int>(tokens.size()) - num_prompt; }
};

namespace {
enum class Fit { kOk, kNoBudget, kNoBlocks };
}  // namespace

Scheduler::Scheduler(Model* model, const SchedulerOptions& options, EventSink sink)
    : model_(model), options_(options), sink_(std::move(sink)) {
  const KvCacheGeometry& geo = model_->kv_geometry();
  blocks_ = std::make_unique<BlockManager>(geo.num_blocks, geo.block_size,
                                           options_.enable_prefix_caching);
  vocab_size_ = model_->config().vocab_size;
  hidden_size_ = model_->config().hidden_size;
  for (int64_t e : model_->config().eos_token_ids) eos_ids_.push_back(static_cast<int32_t>(e));
  if (options_.max_model_len <= 0) {
    const int64_t m = model_->config().max_position_embeddings;
    options_.max_model_len =
        m > 0 ? static_cast<int>(std::min<int64_t>(m, std::numeric_limits<int>::max()))
              : std::numeric_limits<int>::max();
  }
  options_.num_draft_tokens = std::max(options_.num_draft_tokens, 0);
  stats_.num_accepted_per_position.assign(options_.num_draft_tokens, 0);
  max_in_flight_ = std::max(1, model_->max_steps_in_flight());
  if (options_.max_steps_in_flight > 0) {
    max_in_flight_ = std::min(max_in_flight_, options_.max_steps_in_flight);
  }
  if (options_.num_draft_tokens > 0) max_in_flight_ = 1;
}

Scheduler::~Scheduler() = default;

absl::Status Scheduler::Validate(const Request& r) const {
  const int64_t len = static_cast<int64_t>(r.prompt_ids.size());
  if (len == 0) return absl::InvalidArgumentError("request has an empty prompt: give >= 1 token id");
  for (size_t i = 0; i < r.prompt_ids.size(); ++i) {
    if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", r.prompt_ids[i],
                                                     ", outside [0, ", vocab_size_,
                                                     ") (the model's vocab_size)"));
    }
  }
  if (len >= options_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt has ", len, " tokens; the model length limit is ", options_.max_model_len,
        " (prompt + generated): shorten the prompt"));
  }
  if (!options_.enable_chunked_prefill && len > options_.max_num_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt has ", len, " tokens but max_num_batched_tokens is ",
        options_.max_num_batched_tokens, " and chunked prefill is off: enable it or raise the budget"));
  }
  if (absl::Status s = ValidateSamplingParams(r.sampling, vocab_size_); !s.ok()) return s;
  const int k = options_.num_draft_tokens;
  if (r.sampling.num_draft_tokens.has_value() &&
      (*r.sampling.num_draft_tokens < 0 || *r.sampling.num_draft_tokens > k)) {
    return absl::InvalidArgumentError(
        k == 0 ? absl::StrCat("mtp_draft_tokens=", *r.sampling.num_draft_tokens,
                              " was asked for, but speculative decoding is off here "
                              "(model.mtp_draft_tokens is 0): drop it or turn MTP on")
               : absl::StrCat("mtp_draft_tokens=", *r.sampling.num_draft_tokens,
                              " is outside [0, ", k,
                              "] (model.mtp_draft_tokens caps the drafts per step): ask for at "
                              "most ", k));
  }
  const int64_t max_len =
      std::min<int64_t>(len + r.sampling.max_tokens, options_.max_model_len) + 2 * k;
  const int need = blocks_->NumBlocksForTokens(max_len);
  if (need > blocks_->num_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request needs up to ", need, " KV blocks (", len, " prompt + ", r.sampling.max_tokens,
        " max tokens) but the cache has ", blocks_->num_blocks(),
        ": raise the KV cache size or lower max_tokens"));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Add(int64_t request_id, Request request, uint64_t seed) {
  if (seqs_.count(request_id) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("request id ", request_id, " is in flight"));
  }
  auto seq = std::make_unique<Sequence>();
  seq->id = request_id;
  seq->sampling = std::move(request.sampling);
  seq->return_prompt_logits = request.return_prompt_logits;
  seq->seed = seq->sampling.seed.value_or(seed);
  seq->num_prompt = static_cast<int>(request.prompt_ids.size());
  seq->tokens = std::move(request.prompt_ids);
  if (seq->return_prompt_logits) {
    seq->prompt_logits.assign(static_cast<size_t>(seq->num_prompt) * vocab_size_, 0.0f);
  }
  stats_.num_prompt_tokens += seq->num_prompt;
  waiting_.push_back(seq.get());
  seqs_[request_id] = std::move(seq);
  return absl::OkStatus();
}

bool Scheduler::Abort(int64_t request_id) {
  auto it = seqs_.find(request_id);
  if (it == seqs_.end()) return false;
  Sequence* seq = it->second.get();
  if (seq->aborted) return true;  // its event went out; it finishes when its step comes back
  TokenEvent ev;
  ev.finished = true;
  ev.finish_reason = FinishReason::kAborted;
  sink_(request_id, std::move(ev));
  if (seq->in_flight) {
    // A queued step still uses its blocks (on every rank): keep them until it is collected.
    seq->aborted = true;
    running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
    return true;
  }
  Finish(seq, FinishReason::kAborted);
  return true;
}

void Scheduler::FailAll(const absl::Status& error) {
  // The model failed: nothing outstanding will be collected.
  in_flight_.clear();
  std::vector<int64_t> ids;
  for (auto& [id, seq] : seqs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (int64_t id : ids) {
    Sequence* seq = seqs_.at(id).get();
    if (!seq->aborted) {
      TokenEvent ev;
      ev.finished = true;
      ev.finish_reason = FinishReason::kError;
      ev.error = error;
      sink_(id, std::move(ev));
    }
    Finish(seq, FinishReason::kError);
  }
}

void Scheduler::DropInFlight() {
  while (!in_flight_.empty()) {
    InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    ForwardResult ignored;
    const absl::Status st = model_->Collect(f.ticket, &ignored);
    for (const Scheduled& sc : f.sched) sc.seq->in_flight = false;
    if (!st.ok()) {
      // A failed model collects nothing more; the blocks go with the sequences below.
      in_flight_.clear();
      for (auto& [id, seq] : seqs_) seq->in_flight = false;
    }
  }
  for (auto& [id, seq] : seqs_) {
    if (seq->aborted) seq->in_flight = false;
  }
}

void Scheduler::AbortAll() {
  DropInFlight();
  std::vector<int64_t> ids;
  for (auto& [id, seq] : seqs_) {
    if (seq->aborted) ids.push_back(id);
  }
  for (int64_t id : ids) Finish(seqs_.at(id).get(), FinishReason::kAborted);
  ids.clear();
  for (auto& [id, seq] : seqs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (int64_t id : ids) Abort(id);
}

void Scheduler::Finish(Sequence* seq, FinishReason /*reason*/) {
  blocks_->FreeSequence(seq->id);
  model_->ReleaseSequence(seq->id);
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
  seqs_.erase(seq->id);  // destroys *seq
}

void Scheduler::Preempt(Sequence* seq) {
  blocks_->FreeSequence(seq->id);
  model_->ReleaseSequence(seq->id);
  seq->num_computed = 0;
  seq->drafts.clear();
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  waiting_.push_front(seq);
  ++stats_.num_preemptions;
}

int64_t Scheduler::PositionsToReserve(const Sequence& seq, int num_new, int num_drafts) const {
  // This step's forward writes [num_computed, num_computed + num_new + num_drafts); MTP drafting
  // after it writes up to position C + k - 2 with C <= that end.
  const int k = options_.num_draft_tokens;
  const int64_t need = seq.num_computed + num_new + num_drafts + (k > 0 ? k - 1 : 0);
  return std::min<int64_t>(need, std::max<int64_t>(options_.max_model_len,
                                                   seq.num_computed + num_new + num_drafts));
}

bool Scheduler::AppendToken(Sequence* seq, int32_t token, TokenLogprobs* logprobs) {
  const int generated_before = seq->num_generated();
  seq->tokens.push_back(token);
  ++stats_.num_generated_tokens;
  FinishReason reason = FinishReason::kNone;
  if (generated_before >= seq->sampling.min_tokens) {
    const auto& stop = seq->sampling.stop_token_ids;
    if (std::find(stop.begin(), stop.end(), token) != stop.end() ||
        (!seq->sampling.ignore_eos &&
         std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end())) {
      reason = FinishReason::kStop;
    }
  }
  if (reason == FinishReason::kNone &&
      (seq->num_generated() >= seq->sampling.max_tokens ||
       static_cast<int64_t>(seq->tokens.size()) >= options_.max_model_len)) {
    reason = FinishReason::kLength;
  }
  TokenEvent ev;
  ev.token_id = token;
  ev.finished = reason != FinishReason::kNone;
  ev.finish_reason = reason;
  if (logprobs != nullptr) {
    ev.logprob = logprobs->logprob;
    ev.top_logprobs = std::move(logprobs->top);
  }
  if (!seq->sent_first) {
    seq->sent_first = true;
    ev.prompt_logits = std::move(seq->prompt_logits);
  }
  sink_(seq->id, std::move(ev));
  if (reason != FinishReason::kNone) {
    Finish(seq, reason);
    return true;
  }
  return false;
}

absl::Status Scheduler::Step() {
  if (static_cast<int>(in_flight_.size()) < max_in_flight_) {
    bool submitted = false;
    GLM_RETURN_IF_ERROR(ScheduleAndSubmit(&submitted));
    // A slot is still free: the next Step may fill it with the sequences left.
    if (submitted && static_cast<int>(in_flight_.size()) < max_in_flight_) {
      return absl::OkStatus();
    }
  }
  if (in_flight_.empty()) return absl::OkStatus();
  return CollectOldest();
}

absl::Status Scheduler::ScheduleAndSubmit(bool* submitted) {
  *submitted = false;
  const int k = options_.num_draft_tokens;
  const int bs = blocks_->block_size();
  int budget = options_.max_num_batched_tokens;
  std::vector<Scheduled> sched;

  // Micro-batches: with F slots free this one takes about 1/F of the tokens ready to run.
  const int free_slots = max_in_flight_ - static_cast<int>(in_flight_.size());
  if (free_slots > 1) {
    int64_t ready = 0;
    for (const Sequence* s : running_) {
      if (s->in_flight) continue;
      ready += static_cast<int64_t>(s->tokens.size()) - s->num_computed +
               static_cast<int64_t>(s->drafts.size());
    }
    for (const Sequence* s : waiting_) ready += static_cast<int64_t>(s->tokens.size());
    const int64_t share = (ready + free_slots - 1) / free_slots;
    budget = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(budget, share)));
  }

  auto try_fit = [&](Sequence* s, Scheduled* out) {
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->num_computed;
    const int num_new = static_cast<int>(std::min<int64_t>(remaining, budget));
    if (num_new <= 0) return Fit::kNoBudget;
    if (!options_.enable_chunked_prefill && num_new < remaining) return Fit::kNoBudget;
    int num_drafts = 0;
    if (num_new == remaining) {
      num_drafts = std::min<int>(static_cast<int>(s->drafts.size()), budget - num_new);
    }
    if (!blocks_->Reserve(s->id, PositionsToReserve(*s, num_new, num_drafts))) {
      return Fit::kNoBlocks;
    }
    *out = Scheduled{s, num_new, num_drafts};
    return Fit::kOk;
  };

  // 1. Running sequences, preempting from the back when blocks run out.
  bool preempted = false;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* s = running_[i];
    if (s->in_flight) {
      ++i;
      continue;
    }
    Scheduled sc{};
    const Fit fit = try_fit(s, &sc);
    if (fit == Fit::kOk) {
      sched.push_back(sc);
      budget -= sc.num_new + sc.num_drafts;
      ++i;
      continue;
    }
    if (fit == Fit::kNoBudget) {
      ++i;
      continue;
    }
    Sequence* victim = running_.back();
    if (victim->in_flight) {
      // The sequence to preempt first is in a queued step: stop here; the next steps collect it.
      break;
    }
    if (victim == s && i == 0) {
      // Alone and still no room: cannot happen for a validated request; fail it, don't spin.
      TokenEvent ev;
      ev.finished = true;
      ev.finish_reason = FinishReason::kError;
      ev.error = absl::ResourceExhaustedError(absl::StrCat(
          "request ", s->id, " outgrew the KV cache (", blocks_->num_blocks(), " blocks)"));
      sink_(s->id, std::move(ev));
      Finish(s, FinishReason::kError);
      continue;
    }
    Preempt(victim);
    preempted = true;
    if (victim == s) break;
  }

  // 2. Admit waiting sequences.
  while (!preempted && !waiting_.empty() &&
         static_cast<int>(running_.size()) < options_.max_num_seqs && budget > 0) {
    Sequence* s = waiting_.front();
    const int len = static_cast<int>(s->tokens.size());
    const int max_cached = s->return_prompt_logits ? 0 : len - 1;
    // With MTP a cached block is used only if the token after it matches ours (its last
    // position's MTP entry depends on that token).
    const int cached = blocks_->StartSequence(s->id, s->tokens, max_cached, /*match_next_token=*/k > 0);
    s->num_computed = cached;
    Scheduled sc{};
    if (try_fit(s, &sc) != Fit::kOk) {
      blocks_->FreeSequence(s->id);
      s->num_computed = 0;
      break;
    }
    stats_.num_cached_prompt_tokens += cached;
    waiting_.pop_front();
    running_.push_back(s);
    sched.push_back(sc);
    budget -= sc.num_new + sc.num_drafts;
  }
  if (sched.empty()) return absl::OkStatus();

  // 3. Submit.
  ForwardBatch batch;
  batch.seqs.reserve(sched.size());
  for (const Scheduled& sc : sched) {
    Sequence* s = sc.seq;
    SequenceSlice slice;
    slice.seq_id = s->id;
    slice.start_pos = static_cast<int32_t>(s->num_computed);
    slice.token_ids.assign(s->tokens.begin() + s->num_computed,
                           s->tokens.begin() + s->num_computed + sc.num_new);
    slice.token_ids.insert(slice.token_ids.end(), s->drafts.begin(),
                           s->drafts.begin() + sc.num_drafts);
    const int64_t end = s->num_computed + sc.num_new + sc.num_drafts;
    const auto& table = blocks_->BlockTable(s->id);
    slice.block_table.assign(table.begin(), table.begin() + (end + bs - 1) / bs);
    slice.all_logits = sc.num_drafts > 0 || k > 0 ||
                       (s->return_prompt_logits && s->num_computed < s->num_prompt);
    slice.want_hidden = k > 0;
    // The next token is drawn in this step and nothing needs its logits on the host (no MTP
    // verification, no prompt logits, no banned tokens): let the model sample on its backend.
    // A request with logprobs draws on the host (the row's log_softmax is needed), or on a
    // pipeline's remote last stage, which returns the token with its logprobs (forward_batch.h).
    if (!slice.all_logits && sc.num_drafts == 0 &&
        end == static_cast<int64_t>(s->tokens.size()) &&
        s->num_generated() >= s->sampling.min_tokens) {
      slice.sample.enabled = !s->sampling.logprobs.has_value();
      slice.sample.logprobs = s->sampling.logprobs.value_or(-1);
      slice.sample.temperature = s->sampling.temperature;
      slice.sample.top_k = s->sampling.top_k;
      slice.sample.top_p = s->sampling.top_p;
      slice.sample.seed = s->seed;
      slice.sample.index = s->num_generated();
    }
    batch.seqs.push_back(std::move(slice));
  }
  InFlight f;
  GLM_ASSIGN_OR_RETURN(f.ticket, model_->Submit(batch));
  for (const Scheduled& sc : sched) sc.seq->in_flight = true;
  f.sched = std::move(sched);
  f.batch = std::move(batch);
  in_flight_.push_back(std::move(f));
  ++stats_.num_steps;
  stats_.max_steps_in_flight_observed =
      std::max(stats_.max_steps_in_flight_observed, static_cast<int>(in_flight_.size()));
  *submitted = true;
  return absl::OkStatus();
}

absl::Status Scheduler::CollectOldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  const std::vector<Scheduled>& sched = f.sched;
  const ForwardBatch& batch = f.batch;
  ForwardResult result;
  absl::Status collected = model_->Collect(f.ticket, &result);
  ++stats_.num_steps_completed;
  for (const Scheduled& sc : sched) sc.seq->in_flight = false;
  // Sequences aborted while in flight finish now that no queued step uses their blocks.
  std::vector<Scheduled> live;
  std::vector<size_t> live_index;
  for (size_t j = 0; j < sched.size(); ++j) {
    if (sched[j].seq->aborted) {
      Finish(sched[j].seq, FinishReason::kAborted);
    } else {
      live.push_back(sched[j]);
      live_index.push_back(j);
    }
  }
  if (absl::Status st = collected; !st.ok()) {
    st = glm::Annotate(st, "Model::Forward");
    if (!model_->AfterFailedStep(st).ok()) return st;  // the model cannot go on: fatal
    // Nothing ran (e.g. the key-slot table could not grow): this step's sequences fail with the
    // error, the waiting ones and later requests are served.
    GLM_LOG_ERROR("engine step failed, failing its {} sequences (the engine goes on): {}",
                  live.size(), st.ToString());
    ++stats_.num_failed_steps;
    for (const Scheduled& sc : live) {
      TokenEvent ev;
      ev.finished = true;
      ev.finish_reason = FinishReason::kError;
      ev.error = st;
      const int64_t id = sc.seq->id;
      sink_(id, std::move(ev));
      Finish(sc.seq, FinishReason::kError);
    }
    return absl::OkStatus();
  }
  if (result.seqs.size() != batch.seqs.size()) {
    return absl::InternalError(absl::StrCat("Model::Forward returned ", result.seqs.size(),
                                            " outputs for ", batch.seqs.size(), " slices"));
  }
  if (live.size() == sched.size()) return ApplyResult(sched, batch, result);
  ForwardBatch live_batch;
  ForwardResult live_result;
  for (size_t j : live_index) {
    live_batch.seqs.push_back(batch.seqs[j]);
    live_result.seqs.push_back(std::move(result.seqs[j]));
  }
  return ApplyResult(live, live_batch, live_result);
}

absl::Status Scheduler::ApplyResult(const std::vector<Scheduled>& sched, const ForwardBatch& batch,
                                    ForwardResult& result) {
  const int k = options_.num_draft_tokens;
  // 4. Sample, verify drafts, and collect MTP inputs.
  std::vector<MtpDraftInput> mtp_inputs;
  std::vector<int64_t> mtp_ids;
  for (size_t j = 0; j < sched.size(); ++j) {
    const Scheduled& sc = sched[j];
    Sequence* s = sc.seq;
    const SequenceSlice& slice = batch.seqs[j];
    SequenceOutput& out = result.seqs[j];
    const int rows = slice.all_logits ? static_cast<int>(slice.token_ids.size()) : 1;
    const bool sampled = (slice.sample.enabled || slice.sample.logprobs >= 0) &&
                         out.sampled_token >= 0 && out.logits.empty();
    const std::optional<int> want_logprobs = s->sampling.logprobs;
    if ((!sampled && static_cast<int64_t>(out.logits.size()) != rows * vocab_size_) ||
        (k > 0 && static_cast<int64_t>(out.hidden.size()) != rows * hidden_size_)) {
      return absl::InternalError(absl::StrCat("Model::Forward output for seq ", s->id, " has ",
                                              out.logits.size(), " logits / ", out.hidden.size(),
                                              " hidden values for ", rows, " rows"));
    }
    if (sampled && want_logprobs.has_value() &&
        static_cast<int64_t>(out.top_logprobs.size()) !=
            std::min<int64_t>(*want_logprobs, vocab_size_)) {
      return absl::InternalError(absl::StrCat(
          "Model::Forward sampled seq ", s->id, " with ", out.top_logprobs.size(),
          " top logprobs; the request asked for ", *want_logprobs));
    }
    const int64_t start = s->num_computed;
    stats_.num_computed_tokens += sc.num_new + sc.num_drafts;
    if (s->return_prompt_logits && !s->sent_first && slice.all_logits) {
      for (int r = 0; r < sc.num_new; ++r) {
        const int64_t p = start + r;
        if (p >= s->num_prompt) break;
        std::copy(out.logits.begin() + r * vocab_size_, out.logits.begin() + (r + 1) * vocab_size_,
                  s->prompt_logits.begin() + p * vocab_size_);
      }
    }
    const int64_t end = start + sc.num_new;
    int mtp_rows = sc.num_new;
    bool drafting = false;
    if (end < static_cast<int64_t>(s->tokens.size())) {
      s->num_computed = end;  // a prefill chunk; the next token is already known
    } else {
      const int base = slice.all_logits ? sc.num_new - 1 : 0;
      const std::vector<int32_t> drafts = std::move(s->drafts);
      s->drafts.clear();
      int accepted = 0;
      bool finished = false;
      for (int d = 0; d <= sc.num_drafts; ++d) {
        std::vector<int32_t> banned;
        if (s->num_generated() < s->sampling.min_tokens) {
          banned = s->sampling.stop_token_ids;
          if (!s->sampling.ignore_eos) banned.insert(banned.end(), eos_ids_.begin(), eos_ids_.end());
        }
        int32_t token = out.sampled_token;
        TokenLogprobs logprobs;
        if (!sampled) {
          auto row = absl::MakeConstSpan(out.logits).subspan((base + d) * vocab_size_, vocab_size_);
          token = SampleToken(row, s->sampling, s->seed, s->num_generated(), banned);
          // Raw logprobs: the row as the model gave it, before any masking.
          if (want_logprobs.has_value()) logprobs = ComputeLogprobs(row, token, *want_logprobs);
        } else if (want_logprobs.has_value()) {
          logprobs.logprob = out.sampled_logprob;
          logprobs.top = std::move(out.top_logprobs);
        }
        // May destroy *s.
        finished = AppendToken(s, token, want_logprobs.has_value() ? &logprobs : nullptr);
        if (finished) break;
        if (d < sc.num_drafts && drafts[d] == token) {
          ++accepted;
          continue;
        }
        break;
      }
      if (sc.num_drafts > 0) ++stats_.num_drafts;
      stats_.num_draft_tokens += sc.num_drafts;
      stats_.num_accepted_draft_tokens += accepted;
      for (int a = 0; a < accepted; ++a) ++stats_.num_accepted_per_position[a];
      if (finished) continue;
      s->num_computed = end + accepted;
      mtp_rows = sc.num_new + accepted;
      drafting = true;
    }
    blocks_->MarkComputed(s->id, s->tokens, s->num_computed);
    if (k > 0) {
      MtpDraftInput in;
      in.seq_id = s->id;
      in.start_pos = static_cast<int32_t>(start);
      in.next_tokens.assign(s->tokens.begin() + start + 1, s->tokens.begin() + start + 1 + mtp_rows);
      in.hidden.assign(out.hidden.begin(), out.hidden.begin() + mtp_rows * hidden_size_);
      in.block_table = blocks_->BlockTable(s->id);
      if (drafting) {
        const int64_t left_tokens = s->sampling.max_tokens - s->num_generated() - 1;
        const int64_t left_positions = options_.max_model_len - 1 - s->num_computed;
        const int64_t seq_k = s->sampling.num_draft_tokens.value_or(k);
        in.num_drafts = static_cast<int>(
            std::max<int64_t>(0, std::min<int64_t>({seq_k, left_tokens, left_positions})));
      }
      mtp_inputs.push_back(std::move(in));
      mtp_ids.push_back(s->id);
    }
  }

  // 5. MTP: write the draft layer's KV for the rows just computed and propose drafts.
  if (!mtp_inputs.empty()) {
    std::vector<std::vector<int32_t>> drafts;
    if (absl::Status st = RunMtpDrafts(*model_, mtp_inputs, &drafts); !st.ok()) {
      return glm::Annotate(st, "MTP drafting");
    }
    for (size_t i = 0; i < mtp_ids.size(); ++i) seqs_.at(mtp_ids[i])->drafts = std::move(drafts[i]);
  }
  return absl::OkStatus();
}

SchedulerStats Scheduler::Stats() const {
  SchedulerStats s = stats_;
  s.num_running = static_cast<int>(running_.size());
  s.num_waiting = static_cast<int>(waiting_.size());
  s.num_steps_in_flight = static_cast<int>(in_flight_.size());
  s.kv = blocks_->Stats();
  return s;
}

}  // namespace glm::engine
