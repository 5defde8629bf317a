// Test-only deterministic Model whose outputs depend on everything a cache or scheduling bug could
// get wrong. It keeps a paged "KV cache" of its own (the token at each position, read back only
// through the block table), and the logits at position p are a hash of the whole prefix as read
// from that cache, plus p. A wrong block table, a shared block written twice, a stale or missing
// position, or a preempted sequence not recomputed all change the logits and hence the tokens.
//
// MTP: the draft layer keeps its own per-position value in the same blocks and, for rows fed by
// the main model, checks that every earlier position's MTP entry equals what (h_q, t_{q+1}) gives
// (mtp_kv_mismatches()). Its draft is the main model's greedy next-next token, deliberately wrong
// for ~`mtp_miss_percent`% of contexts, so acceptance rates are measurable.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/forward_batch.h"

namespace glm::engine {

class FakeModel : public Model {
 public:
  struct Options {
    int vocab_size = 97;
    int block_size = 4;
    int num_blocks = 64;
    bool has_mtp = true;
    int mtp_miss_percent = 30;
    std::vector<int64_t> eos_token_ids;
    int64_t max_position_embeddings = 4096;
    // Forward call number fail_forward_at (1-based; 0: never) returns ResourceExhausted before
    // touching anything. failure_contained: AfterFailedStep calls every failure contained (the
    // model goes on); else fatal (Model's default).
    int fail_forward_at = 0;
    bool failure_contained = false;
    // > 1: Submit only queues the batch and Collect runs it (a pipeline's deferred execution),
    // up to this many outstanding. Breaches of Model::Submit's contract are counted
    // (contract_violations()): a sequence in two outstanding steps, a release of a sequence
    // whose step is outstanding, too many steps outstanding.
    int max_steps_in_flight = 1;
  };
  static constexpr int kHiddenSize = 8;

  explicit FakeModel(const Options& o) : opt_(o) {
    config_.vocab_size = o.vocab_size;
    config_.hidden_size = kHiddenSize;
    config_.num_hidden_layers = 1;
    config_.num_nextn_predict_layers = o.has_mtp ? 1 : 0;
    config_.eos_token_ids = o.eos_token_ids;
    config_.max_position_embeddings = o.max_position_embeddings;
    geometry_.block_size = o.block_size;
    geometry_.num_blocks = o.num_blocks;
    const size_t slots = static_cast<size_t>(o.block_size) * o.num_blocks;
    main_kv_.assign(slots, -1);
    mtp_kv_.assign(slots, 0);
  }

  const ModelConfig& config() const override { return config_; }
  const KvCacheGeometry& kv_geometry() const override { return geometry_; }

  absl::Status Forward(const ForwardBatch& batch, ForwardResult* result) override {
    ++num_forward_calls_;
    if (num_forward_calls_ == opt_.fail_forward_at) {
      for (const SequenceSlice& s : batch.seqs) failed_batch_.push_back(s.seq_id);
      return absl::ResourceExhaustedError("fake: the key-slot table could not grow");
    }
    result->seqs.clear();
    int64_t batch_tokens = 0;
    for (const SequenceSlice& s : batch.seqs) batch_tokens += static_cast<int64_t>(s.token_ids.size());
    max_batch_tokens_ = std::max(max_batch_tokens_, batch_tokens);
    for (const SequenceSlice& s : batch.seqs) {
      const int n = static_cast<int>(s.token_ids.size());
      if (n == 0) return absl::InvalidArgumentError("empty slice");
      if (absl::Status st = CheckTable(s, n); !st.ok()) return st;
      num_tokens_computed_ += n;
      for (int i = 0; i < n; ++i) main_kv_[Slot(s, s.start_pos + i)] = s.token_ids[i];
      SequenceOutput out;
      uint64_t state = kSeed;
      for (int32_t q = 0; q < s.start_pos + n; ++q) {
        const int64_t tok = main_kv_[Slot(s, q)];
        if (tok < 0) ++unwritten_reads_;
        state = Next(state, tok, q);
        const int row = q - s.start_pos;
        if (row >= 0 && (s.all_logits || row == n - 1)) {
          AppendLogits(state, &out.logits);
          if (s.want_hidden) AppendHidden(state, 0.0f, &out.hidden);
        }
      }
      result->seqs.push_back(std::move(out));
    }
    return absl::OkStatus();
  }

  absl::Status ForwardMtp(const ForwardBatch& batch, const std::vector<std::vector<float>>& hidden,
                          ForwardResult* result) override {
    if (!opt_.has_mtp) return absl::UnimplementedError("fake model has no MTP layer");
    ++num_mtp_calls_;
    result->seqs.clear();
    for (size_t k = 0; k < batch.seqs.size(); ++k) {
      const SequenceSlice& s = batch.seqs[k];
      const int n = static_cast<int>(s.token_ids.size());
      if (absl::Status st = CheckTable(s, n); !st.ok()) return st;
      if (hidden[k].size() != static_cast<size_t>(n) * kHiddenSize) {
        return absl::InvalidArgumentError(absl::StrCat("MTP hidden rows ", hidden[k].size(),
                                                       " for ", n, " tokens"));
      }
      SequenceOutput out;
      for (int i = 0; i < n; ++i) {
        const int32_t p = s.start_pos + i;
        float flag = 0;
        const uint64_t h = DecodeHidden(&hidden[k][i * kHiddenSize], &flag);
        if (flag == 0.0f) {
          // Main-model row: earlier MTP entries must equal (main state q, main token q+1).
          uint64_t state = kSeed;
          for (int32_t q = 0; q < p; ++q) {
            state = Next(state, main_kv_[Slot(s, q)], q);
            if (mtp_kv_[Slot(s, q)] != MtpEntry(state, main_kv_[Slot(s, q + 1)])) {
              ++mtp_kv_mismatches_;
            }
          }
        }
        const int32_t tok = s.token_ids[i];
        mtp_kv_[Slot(s, p)] = MtpEntry(h, tok);
        const uint64_t next = Next(h, tok, p + 1);  // state at p + 1
        if (s.all_logits || i == n - 1) {
          std::vector<float> main_logits;
          AppendLogits(next, &main_logits);
          int32_t guess = 0;
          for (int v = 1; v < opt_.vocab_size; ++v) {
            if (main_logits[v] > main_logits[guess]) guess = v;
          }
          if (static_cast<int>(Mix(next ^ 0x55) % 100) < opt_.mtp_miss_percent) {
            guess = (guess + 1) % opt_.vocab_size;
          }
          for (int v = 0; v < opt_.vocab_size; ++v) out.logits.push_back(v == guess ? 1.0f : 0.0f);
          if (s.want_hidden) AppendHidden(next, 1.0f, &out.hidden);
        }
      }
      result->seqs.push_back(std::move(out));
    }
    return absl::OkStatus();
  }

  // Reference: greedy continuation of `prompt` computed directly (no cache), for tests.
  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n) const {
    std::vector<int32_t> toks = prompt, out;
    for (int i = 0; i < n; ++i) {
      uint64_t state = kSeed;
      for (size_t q = 0; q < toks.size(); ++q) state = Next(state, toks[q], static_cast<int>(q));
      std::vector<float> l;
      AppendLogits(state, &l);
      int32_t best = 0;
      for (int v = 1; v < opt_.vocab_size; ++v) if (l[v] > l[best]) best = v;
      out.push_back(best);
      toks.push_back(best);
    }
    return out;
  }

  // Reference: the logits row the model gives for the position after `tokens` (prompt +
  // generated so far), computed directly, for tests.
  std::vector<float> LogitsAfter(const std::vector<int32_t>& tokens) const {
    uint64_t state = kSeed;
    for (size_t q = 0; q < tokens.size(); ++q) state = Next(state, tokens[q], static_cast<int>(q));
    std::vector<float> l;
    AppendLogits(state, &l);
    return l;
  }

  // Model::ReleaseSequence: the ids in call order (the scheduler releases on finish, abort and
  // preemption).
  void ReleaseSequence(int64_t seq_id) override {
    if (Outstanding(seq_id)) ++contract_violations_;
    released_.push_back(seq_id);
  }

  int max_steps_in_flight() const override { return opt_.max_steps_in_flight; }
  absl::StatusOr<int64_t> Submit(const ForwardBatch& batch) override {
    if (opt_.max_steps_in_flight <= 1) return Model::Submit(batch);
    if (static_cast<int>(queued_.size()) >= opt_.max_steps_in_flight) ++contract_violations_;
    for (const SequenceSlice& s : batch.seqs) {
      if (Outstanding(s.seq_id)) ++contract_violations_;
    }
    queued_.emplace_back(++last_ticket_, batch);
    max_outstanding_ = std::max(max_outstanding_, static_cast<int>(queued_.size()));
    return last_ticket_;
  }
  absl::Status Collect(int64_t ticket, ForwardResult* result) override {
    if (opt_.max_steps_in_flight <= 1) return Model::Collect(ticket, result);
    if (queued_.empty() || queued_.front().first != ticket) {
      return absl::FailedPreconditionError("fake: collected out of submission order");
    }
    const ForwardBatch batch = std::move(queued_.front().second);
    queued_.pop_front();
    return Forward(batch, result);
  }
  int contract_violations() const { return contract_violations_; }
  // The most steps outstanding at once (deferred mode).
  int max_outstanding() const { return max_outstanding_; }
  absl::Status AfterFailedStep(const absl::Status& failure) const override {
    return opt_.failure_contained ? absl::OkStatus() : failure;
  }
  // The sequences of the Forward call that failed (Options::fail_forward_at).
  const std::vector<int64_t>& failed_batch() const { return failed_batch_; }
  const std::vector<int64_t>& released() const { return released_; }

  int64_t num_forward_calls() const { return num_forward_calls_; }
  int64_t num_mtp_calls() const { return num_mtp_calls_; }
  int64_t num_tokens_computed() const { return num_tokens_computed_; }
  int64_t max_batch_tokens() const { return max_batch_tokens_; }
  int64_t unwritten_reads() const { return unwritten_reads_; }
  int64_t mtp_kv_mismatches() const { return mtp_kv_mismatches_; }

 private:
  static constexpr uint64_t kSeed = 0x1234567887654321ULL;
  static uint64_t Mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
  }
  static uint64_t Next(uint64_t state, int64_t token, int32_t pos) {
    return Mix(state ^ Mix(static_cast<uint64_t>(token) * 1000003ULL + static_cast<uint64_t>(pos)));
  }
  static int64_t MtpEntry(uint64_t state, int64_t next_token) {
    return static_cast<int64_t>(Mix(state + 77) ^ static_cast<uint64_t>(next_token));
  }
  void AppendLogits(uint64_t state, std::vector<float>* out) const {
    for (int v = 0; v < opt_.vocab_size; ++v) {
      out->push_back(static_cast<float>(Mix(state + v) % 10007) / 1000.0f - 5.0f);
    }
  }
  static void AppendHidden(uint64_t state, float flag, std::vector<float>* out) {
    for (int i = 0; i < 4; ++i) out->push_back(static_cast<float>((state >> (16 * i)) & 0xffff));
    out->push_back(flag);
    for (int i = 5; i < kHiddenSize; ++i) out->push_back(0.0f);
  }
  static uint64_t DecodeHidden(const float* h, float* flag) {
    uint64_t state = 0;
    for (int i = 0; i < 4; ++i) state |= static_cast<uint64_t>(h[i]) << (16 * i);
    *flag = h[4];
    return state;
  }
  size_t Slot(const SequenceSlice& s, int32_t pos) const {
    return static_cast<size_t>(s.block_table[pos / opt_.block_size]) * opt_.block_size +
           pos % opt_.block_size;
  }
  absl::Status CheckTable(const SequenceSlice& s, int n) const {
    const int64_t need = (static_cast<int64_t>(s.start_pos) + n + opt_.block_size - 1) /
                         opt_.block_size;
    if (static_cast<int64_t>(s.block_table.size()) < need) {
      return absl::InvalidArgumentError(absl::StrCat("seq ", s.seq_id, " block table has ",
                                                     s.block_table.size(), " blocks, needs ", need));
    }
    for (int32_t b : s.block_table) {
      if (b < 0 || b >= opt_.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("block id ", b, " out of range"));
      }
    }
    if (s.start_pos + n > config_.max_position_embeddings) {
      return absl::InvalidArgumentError("position beyond max_position_embeddings");
    }
    return absl::OkStatus();
  }

  bool Outstanding(int64_t seq_id) const {
    for (const auto& [ticket, batch] : queued_) {
      for (const SequenceSlice& s : batch.seqs) {
        if (s.seq_id == seq_id) return true;
      }
    }
    return false;
  }

  Options opt_;
  ModelConfig config_;
  std::deque<std::pair<int64_t, ForwardBatch>> queued_;  // deferred mode: submission order
  int64_t last_ticket_ = 0;
  int max_outstanding_ = 0;
  int contract_violations_ = 0;
  KvCacheGeometry geometry_;
  std::vector<int64_t> main_kv_;  // [num_blocks * block_size] token at each slot, -1 = unwritten
  std::vector<int64_t> mtp_kv_;   // [num_blocks * block_size] MTP entry at each slot
  std::vector<int64_t> released_;
  std::vector<int64_t> failed_batch_;
  int64_t num_forward_calls_ = 0;
  int64_t num_mtp_calls_ = 0;
  int64_t num_tokens_computed_ = 0;
  int64_t max_batch_tokens_ = 0;
  int64_t unwritten_reads_ = 0;
  int64_t mtp_kv_mismatches_ = 0;
};

}  // namespace glm::engine
