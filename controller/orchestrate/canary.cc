#include "controller/orchestrate/canary.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "controller/orchestrate/steps.h"

namespace glm::orchestrate {

void CanaryReference::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  ids_.reset();
}

std::optional<std::vector<int32_t>> CanaryReference::Get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ids_;
}

std::vector<int32_t> CanaryReference::SetIfEmpty(const std::vector<int32_t>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ids_) ids_ = ids;
  return *ids_;
}

absl::StatusOr<CanaryRequest> ResolveCanary(const CanarySettings& settings,
                                            const CanaryTokenizer& tokenizer) {
  CanaryRequest req;
  auto encode = [&](const std::string& text, const char* field) -> absl::StatusOr<std::vector<int32_t>> {
    if (!tokenizer.encode) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model.canary.", field, " is text, but the controller host has no tokenizer for the "
          "model (tokenizer.json in model.path there). Fix: give model.canary.", field,
          "_ids (token ids) instead, or put the model's tokenizer.json on the controller host"));
    }
    return tokenizer.encode(text);
  };
  if (!settings.prompt_ids.empty()) {
    req.prompt_ids = settings.prompt_ids;
  } else if (!settings.prompt.empty()) {
    GLM_ASSIGN_OR_RETURN(req.prompt_ids, encode(settings.prompt, "prompt"));
  } else if (tokenizer.encode) {
    GLM_ASSIGN_OR_RETURN(req.prompt_ids, tokenizer.encode("Hello"));
  } else {
    req.prompt_ids = {1, 2, 3, 4};
  }
  if (req.prompt_ids.empty()) {
    return absl::InvalidArgumentError(
        "model.canary: the prompt encodes to no tokens. Fix: give a longer model.canary.prompt");
  }
  req.expect_ids = settings.expect_ids;
  req.expect_text = settings.expect;
  if (settings.max_tokens > 0) {
    req.max_tokens = settings.max_tokens;
  } else if (!req.expect_ids.empty()) {
    req.max_tokens = static_cast<int>(req.expect_ids.size());
  } else if (!req.expect_text.empty() && tokenizer.encode) {
    // The expected text's own length in tokens, with room for a different split.
    auto ids = tokenizer.encode(req.expect_text);
    req.max_tokens = ids.ok() ? static_cast<int>(ids->size()) + 4 : 8;
  }
  return req;
}

namespace {

std::string Ids(const std::vector<int32_t>& ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ", "), "]");
}

std::string Text(const CanaryTokenizer& tok, const std::vector<int32_t>& ids) {
  if (!tok.decode) return "";
  std::string text = tok.decode(ids);
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '\n') {
      quoted += "\\n";
    } else if (c == '"') {
      quoted += "\\\"";
    } else {
      quoted += c;
    }
  }
  return quoted + "\"";
}

// "differ at token 3: expected 845, got 12; expected [..] "..", got [..] "..""
std::string Diff(const CanaryTokenizer& tok, const std::vector<int32_t>& expected,
                 const std::vector<int32_t>& got, const char* expected_name) {
  size_t i = 0;
  while (i < expected.size() && i < got.size() && expected[i] == got[i]) ++i;
  std::string where =
      i < expected.size() && i < got.size()
          ? absl::StrCat("token ", i, " differs (", expected_name, " ", expected[i], ", got ",
                         got[i], ")")
          : absl::StrCat("the output has ", got.size(), " tokens, ", expected_name, " ",
                         expected.size());
  std::string e_text = Text(tok, expected);
  std::string g_text = Text(tok, got);
  return absl::StrCat(where, "; ", expected_name, " ", Ids(expected),
                      e_text.empty() ? "" : " ", e_text, ", got ", Ids(got),
                      g_text.empty() ? "" : " ", g_text);
}

// One greedy run on `client`: the generated ids, or an error (an RPC failure, non-finite
// logprobs).
absl::StatusOr<std::vector<int32_t>> Generate(AgentClient& client, const CanaryRequest& canary,
                                              const std::string& request_id,
                                              Clock::Duration timeout) {
  glm::v1::GenerateRequest req;
  req.set_request_id(request_id);
  for (int32_t id : canary.prompt_ids) req.add_prompt_token_ids(id);
  req.set_max_tokens(canary.max_tokens);
  req.set_temperature(0.0f);
  req.set_top_p(1.0f);
  req.set_ignore_eos(true);
  req.set_return_logprobs(true);
  std::vector<int32_t> ids;
  std::string non_finite;
  GLM_RETURN_IF_ERROR(client.Generate(
      req,
      [&](const glm::v1::TokenEvent& ev) {
        for (int i = 0; i < ev.token_ids_size(); ++i) {
          if (i < ev.logprobs_size() && !std::isfinite(ev.logprobs(i).logprob()) &&
              non_finite.empty()) {
            non_finite = absl::StrCat("token ", ids.size(), " (id ", ev.token_ids(i),
                                      ") has logprob ", ev.logprobs(i).logprob());
          }
          ids.push_back(ev.token_ids(i));
        }
      },
      timeout));
  if (!non_finite.empty()) {
    return absl::DataLossError(absl::StrCat(
        "non-finite logits: ", non_finite,
        ". Fix: check the weights (glmctl up re-verifies them) and the node's GPU"));
  }
  return ids;
}

const NodeEndpoint* HeadOf(const ClusterTopology& topology, int replica) {
  for (const NodeEndpoint& n : topology.nodes) {
    if (n.replica == replica && n.pp_rank == 0 && n.tp_rank == 0) return &n;
  }
  return nullptr;
}

}  // namespace

absl::Status RunCanary(BringUpContext& ctx, const std::vector<int>& replicas,
                       const CanaryTokenizer& tokenizer, CanaryReference* reference,
                       Clock::Duration timeout) {
  absl::StatusOr<CanaryRequest> canary = ResolveCanary(ctx.topology.canary, tokenizer);
  if (!canary.ok()) return canary.status();
  std::mutex mu;
  std::map<int, std::string> failures;
  std::map<int, std::vector<int32_t>> outputs;
  ParallelFor(replicas, [&](int r) {
    const NodeEndpoint* head = HeadOf(ctx.topology, r);
    auto fail = [&](const std::string& why) {
      std::lock_guard<std::mutex> lock(mu);
      failures[r] = why;
    };
    if (head == nullptr) return fail("the plan has no head node (pp 0, tp 0) for it");
    std::shared_ptr<AgentClient> client;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = ctx.agents.find(head->name);
      if (it != ctx.agents.end()) client = it->second;
    }
    if (!client) return fail(absl::StrCat("its head node ", head->name, " is not connected"));
    std::vector<std::vector<int32_t>> runs;
    for (int run = 0; run < 2; ++run) {
      auto ids = Generate(*client, *canary, absl::StrCat("canary-r", r, "-", run), timeout);
      if (!ids.ok()) return fail(absl::StrCat("run ", run + 1, ": ", ids.status().message()));
      runs.push_back(*std::move(ids));
    }
    if (runs[0] != runs[1]) {
      return fail(absl::StrCat("two greedy runs disagree (the replica is not deterministic): ",
                               Diff(tokenizer, runs[0], runs[1], "first run")));
    }
    const std::vector<int32_t>& got = runs[0];
    if (!canary->expect_ids.empty()) {
      std::vector<int32_t> head_ids(got.begin(),
                                    got.begin() + std::min(got.size(), canary->expect_ids.size()));
      if (head_ids != canary->expect_ids) {
        return fail(absl::StrCat("output differs from model.canary.expect_ids: ",
                                 Diff(tokenizer, canary->expect_ids, got, "expected")));
      }
    }
    if (!canary->expect_text.empty()) {
      if (!tokenizer.decode) {
        return fail(
            "model.canary.expect is text but the controller host has no tokenizer to decode the "
            "output. Fix: give model.canary.expect_ids instead");
      }
      std::string text = tokenizer.decode(got);
      if (text.compare(0, canary->expect_text.size(), canary->expect_text) != 0) {
        return fail(absl::StrCat("output ", Text(tokenizer, got), " (ids ", Ids(got),
                                 ") does not start with model.canary.expect \"",
                                 canary->expect_text, "\""));
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    outputs[r] = got;
  });
  // Agreement: every replica that passed gives the reference's ids. The reference is the first
  // passing replica's output since it was reset (bring-up resets it).
  for (const auto& [r, ids] : outputs) {
    std::vector<int32_t> ref = reference ? reference->SetIfEmpty(ids) : outputs.begin()->second;
    if (ids != ref) {
      failures[r] = absl::StrCat("output differs from the other replicas': ",
                                 Diff(tokenizer, ref, ids, "they give"));
    }
  }
  for (int r : replicas) {
    const NodeEndpoint* head = HeadOf(ctx.topology, r);
    const std::string node = head ? head->name : "";
    auto it = failures.find(r);
    glm::v1::UpEvent e;
    e.set_phase(glm::v1::BRING_UP_PHASE_CANARY);
    e.set_node(node);
    e.set_replica(r);
    if (it == failures.end()) {
      e.set_node_state(glm::v1::NODE_STATE_READY);
      e.set_message(absl::StrCat("replica ", r, ": canary passed (", outputs[r].size(),
                                 " greedy tokens, the same twice",
                                 failures.empty() && outputs.size() > 1 ? " and on every replica"
                                                                        : "",
                                 ")"));
    } else {
      e.set_node_state(glm::v1::NODE_STATE_FAILED);
      e.set_message(absl::StrCat("replica ", r, ": canary failed: ", it->second));
      GLM_LOG_WARN("canary failed replica={} node={}: {}", r, node, it->second);
    }
    ctx.Emit(e);
  }
  if (failures.empty()) return absl::OkStatus();
  std::vector<std::string> lines;
  for (const auto& [r, why] : failures) {
    lines.push_back(absl::StrCat("replica ", r, ": canary failed: ", why));
  }
  return absl::FailedPreconditionError(absl::StrJoin(lines, "\n"));
}

absl::Status CanaryStep::Run(BringUpContext& ctx) {
  if (reference_) reference_->Reset();
  std::vector<int> replicas;
  for (size_t r = 0; r < ctx.topology.replicas.size(); ++r) replicas.push_back(static_cast<int>(r));
  if (replicas.empty()) {
    for (const NodeEndpoint& n : ctx.topology.nodes) {
      if (std::find(replicas.begin(), replicas.end(), n.replica) == replicas.end()) {
        replicas.push_back(n.replica);
      }
    }
  }
  absl::Status s = RunCanary(ctx, replicas, tokenizer_, reference_, timeout_);
  if (!s.ok()) {
    // Hold every failing replica out of service with its diff (the message lines name them).
    for (int r : replicas) {
      const std::string prefix = absl::StrCat("replica ", r, ": ");
      for (absl::string_view line : absl::StrSplit(s.message(), '\n')) {
        if (absl::StartsWith(line, prefix)) {
          ctx.state().SetReplicaMode(r, ReplicaMode::kHeld, std::string(line.substr(prefix.size())));
        }
      }
    }
  }
  return s;
}

}  // namespace glm::orchestrate
