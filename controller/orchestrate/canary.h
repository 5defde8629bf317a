// The canary: one greedy request every replica must answer before it is admitted. Bring-up runs
// it as its Canary phase (after Load, before Ready); restarts and self-healing run it on the
// replica they reloaded.
//
// The request comes from cluster.yaml's model.canary (ClusterTopology::canary): the prompt as
// ids or as text (encoded with the model's tokenizer on the controller host), generated greedily
// (temperature 0, eos ignored) for max_tokens tokens, twice on each replica's head shard. It
// passes when every logprob is finite, both runs give the same ids, the ids equal expect_ids
// (or their text starts with `expect`) when an expectation is given, and every replica gives
// the ids the reference holds (the first replica to pass since the last bring-up sets it). A
// failure names the replica, the first differing position and both sides, in ids and text.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "controller/orchestrate/bring_up.h"
#include "controller/orchestrate/bring_up_context.h"

namespace glm::orchestrate {

// The model's tokenizer on the controller host, for text canaries and readable diffs. Either
// function may be null (no tokenizer there: canaries must give ids; diffs show ids only).
struct CanaryTokenizer {
  std::function<absl::StatusOr<std::vector<int32_t>>(const std::string& text)> encode;
  std::function<std::string(const std::vector<int32_t>& ids)> decode;
};

// The output every replica must agree with. Thread-safe.
class CanaryReference {
 public:
  void Reset();
  std::optional<std::vector<int32_t>> Get() const;
  // Sets the reference unless one is set; returns the reference in force.
  std::vector<int32_t> SetIfEmpty(const std::vector<int32_t>& ids);

 private:
  mutable std::mutex mu_;
  std::optional<std::vector<int32_t>> ids_;
};

// The prompt and expectation of a canary, resolved from the settings.
struct CanaryRequest {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> expect_ids;  // empty: none
  std::string expect_text;          // empty: none
  int max_tokens = 8;
};

// Resolves model.canary: ids as given, text through `tokenizer.encode`; with no prompt at all
// the prompt "Hello" (or ids [1, 2, 3, 4] without a tokenizer). An error names the field and the
// fix (text without a tokenizer on the controller host).
absl::StatusOr<CanaryRequest> ResolveCanary(const CanarySettings& settings,
                                            const CanaryTokenizer& tokenizer);

// Runs the canary on `replicas` of ctx.topology (each on its head node's client in ctx.agents),
// concurrently. Events go to ctx's sink as Canary-phase node events. OK when every replica
// passed; otherwise FAILED_PRECONDITION naming each failing replica with its diff.
absl::Status RunCanary(BringUpContext& ctx, const std::vector<int>& replicas,
                       const CanaryTokenizer& tokenizer, CanaryReference* reference,
                       Clock::Duration timeout);

// Bring-up's Canary phase: every replica of the plan. A failing replica is held out of service
// (ClusterState mode kHeld with the diff) and bring-up fails with the diff.
class CanaryStep : public BringUpStep {
 public:
  CanaryStep(CanaryTokenizer tokenizer, CanaryReference* reference,
             Clock::Duration timeout = std::chrono::minutes(5))
      : tokenizer_(std::move(tokenizer)), reference_(reference), timeout_(timeout) {}
  Phase phase() const override { return Phase::kCanary; }
  absl::Status Run(BringUpContext& ctx) override;

 private:
  const CanaryTokenizer tokenizer_;
  CanaryReference* const reference_;
  const Clock::Duration timeout_;
};

}  // namespace glm::orchestrate
