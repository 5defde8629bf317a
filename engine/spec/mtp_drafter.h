// MTP speculative decoding, draft side: keeps the MTP layer's KV in step with the main model and
// proposes k draft tokens per decoding sequence (../shared/specs/glm5-architecture.md §3.5).
//
// Position convention: the MTP KV at position p is computed from (h_p, t_{p+1}) where h_p is the
// main model's post-norm hidden state at p; its output predicts t_{p+2}. After a main step that
// leaves positions [0, C) computed and the next token t_C sampled, the scheduler hands the rows
// [start, C) of the step (hidden rows and tokens t_{start+1}..t_C) to Run(), which writes MTP KV
// for them and, from the last row, drafts d_1 (a guess of t_{C+1}); each further draft runs one
// MTP row at position C + j - 2 on (MTP hidden of the previous row, d_{j-1}). Those draft rows
// write MTP KV at positions >= C, which the next step overwrites (rollback = ignore).
//
// Drafts are the MTP's greedy choice. The scheduler verifies them: it samples the target's token
// at each verified row (greedy or seeded draw, exactly as without drafts) and accepts a draft only
// if it equals that token, so output never depends on drafting.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/forward_batch.h"

namespace glm::engine {

struct MtpDraftInput {
  int64_t seq_id = 0;
  int32_t start_pos = 0;              // position of hidden row 0
  std::vector<int32_t> next_tokens;   // [n] tokens t_{start_pos+1} .. t_{start_pos+n}
  std::vector<float> hidden;          // [n, hidden_size] main-model hidden rows start_pos..+n-1
  std::vector<int32_t> block_table;   // covers positions [0, start_pos + n + num_drafts - 1)
  int num_drafts = 0;                 // 0: only write the MTP KV of the n rows
};

// Runs the MTP layer for every input (one batched ForwardMtp, then num_drafts - 1 more batched
// single-row calls) and returns drafts[i] of size inputs[i].num_drafts. Errors are the model's.
absl::Status RunMtpDrafts(Model& model, const std::vector<MtpDraftInput>& inputs,
                          std::vector<std::vector<int32_t>>* drafts);

}  // namespace glm::engine
