#include "engine/spec/mtp_drafter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/sample/sampler.h"

namespace glm::engine {
namespace {

std::vector<int32_t> TableFor(const std::vector<int32_t>& table, int64_t num_positions,
                              int block_size) {
  const size_t n = static_cast<size_t>((num_positions + block_size - 1) / block_size);
  return std::vector<int32_t>(table.begin(), table.begin() + std::min(n, table.size()));
}

}  // namespace

absl::Status RunMtpDrafts(Model& model, const std::vector<MtpDraftInput>& inputs,
                          std::vector<std::vector<int32_t>>* drafts) {
  drafts->assign(inputs.size(), {});
  if (inputs.empty()) return absl::OkStatus();
  const int64_t vocab = model.config().vocab_size;
  const int64_t hidden_size = model.config().hidden_size;
  const int block_size = model.kv_geometry().block_size;

  // Pass 1: every input's rows; logits of the last row give draft 1.
  ForwardBatch batch;
  std::vector<std::vector<float>> hidden;
  for (const MtpDraftInput& in : inputs) {
    const int64_t n = static_cast<int64_t>(in.next_tokens.size());
    if (static_cast<int64_t>(in.hidden.size()) != n * hidden_size) {
      return absl::InternalError(absl::StrCat("MTP input for seq ", in.seq_id, " has ",
                                              in.hidden.size(), " hidden values, want ",
                                              n * hidden_size));
    }
    SequenceSlice s;
    s.seq_id = in.seq_id;
    s.token_ids = in.next_tokens;
    s.start_pos = in.start_pos;
    s.block_table = TableFor(in.block_table, in.start_pos + n, block_size);
    s.all_logits = false;
    s.want_hidden = true;
    batch.seqs.push_back(std::move(s));
    hidden.push_back(in.hidden);
  }
  ForwardResult result;
  if (absl::Status st = model.ForwardMtp(batch, hidden, &result); !st.ok()) return st;
  if (result.seqs.size() != inputs.size()) {
    return absl::InternalError("ForwardMtp returned a result per slice count that differs");
  }
  // Chain state per input that still drafts: position of its next draft row and hidden row.
  std::vector<size_t> active;
  std::vector<std::vector<float>> last_hidden(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].num_drafts <= 0) continue;
    const SequenceOutput& out = result.seqs[i];
    if (static_cast<int64_t>(out.logits.size()) < vocab ||
        static_cast<int64_t>(out.hidden.size()) < hidden_size) {
      return absl::InternalError("ForwardMtp returned no logits/hidden row for a drafting slice");
    }
    (*drafts)[i].push_back(ArgMax(absl::MakeConstSpan(out.logits).last(vocab)));
    last_hidden[i].assign(out.hidden.end() - hidden_size, out.hidden.end());
    if (inputs[i].num_drafts > 1) active.push_back(i);
  }
  // Passes 2..k: one row per still-drafting input.
  for (int j = 2; !active.empty(); ++j) {
    ForwardBatch step;
    std::vector<std::vector<float>> step_hidden;
    for (size_t i : active) {
      const MtpDraftInput& in = inputs[i];
      const int32_t pos =
          in.start_pos + static_cast<int32_t>(in.next_tokens.size()) + j - 2;  // C + j - 2
      SequenceSlice s;
      s.seq_id = in.seq_id;
      s.token_ids = {(*drafts)[i].back()};
      s.start_pos = pos;
      s.block_table = TableFor(in.block_table, pos + 1, block_size);
      s.want_hidden = true;
      step.seqs.push_back(std::move(s));
      step_hidden.push_back(last_hidden[i]);
    }
    ForwardResult r;
    if (absl::Status st = model.ForwardMtp(step, step_hidden, &r); !st.ok()) return st;
    std::vector<size_t> still;
    for (size_t a = 0; a < active.size(); ++a) {
      const size_t i = active[a];
      const SequenceOutput& out = r.seqs[a];
      (*drafts)[i].push_back(ArgMax(absl::MakeConstSpan(out.logits).last(vocab)));
      last_hidden[i].assign(out.hidden.end() - hidden_size, out.hidden.end());
      if (static_cast<int>((*drafts)[i].size()) < inputs[i].num_drafts) still.push_back(i);
    }
    active = std::move(still);
  }
  return absl::OkStatus();
}

}  // namespace glm::engine
