// The bring-up state machine (DESIGN.md §3).
//
//   Idle ──► Validate ──► Connect ──► Preflight ──► Plan ──► Stage ──► Load ──► [Canary ──►
//   Gateway] ──► Ready        (bracketed: phases whose steps do not exist yet)
//   any step ──► Failed;   Failed | Ready | Down ──► Validate (re-run; idempotent);
//   Idle | Ready | Failed ──► Down;   Down ──► Validate
//
// Each phase is one BringUpStep. The machine runs the steps it was built with in phase order;
// phases without a step are skipped, so the later milestones (staging, shard loading, canary,
// gateway) plug in by adding a step for their phase in controller main, with no change here.
// Transitions are checked against the table above (CanTransition); an illegal one is a bug and
// fails the run with INTERNAL.
//
// Thread-safety: one Run at a time (a concurrent Run fails with FAILED_PRECONDITION); phase() and
// MarkDown() may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/orchestrate/topology.h"

namespace glm::orchestrate {

enum class Phase {
  kIdle,
  kValidate,
  kConnect,
  kPreflight,
  kPlan,
  kStage,
  kLoad,
  kCanary,
  kGateway,
  kReady,
  kFailed,
  kDown,
};

// "idle", "validate", ... (lower case, for logs and the CLI).
const char* PhaseName(Phase phase);
// True for the phases a step can implement (Validate..Gateway).
bool IsStepPhase(Phase phase);

class BringUpContext;

// One phase of bring-up. Run must be idempotent: re-running it on a node where its work is
// already done is cheap and succeeds. It reports per-node progress through the context and
// returns an error that names the node, what failed and the fix.
class BringUpStep {
 public:
  virtual ~BringUpStep() = default;
  virtual Phase phase() const = 0;
  virtual absl::Status Run(BringUpContext& ctx) = 0;
};

class BringUpMachine {
 public:
  // Called on every transition (from, to, message). From Run's thread; must not call back into
  // the machine.
  using TransitionObserver = std::function<void(Phase from, Phase to, const std::string& message)>;

  // Steps must be step phases in strictly increasing order; otherwise INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<BringUpMachine>> Create(
      std::vector<std::unique_ptr<BringUpStep>> steps, TransitionObserver observer = nullptr);

  static bool CanTransition(Phase from, Phase to);

  // Runs every step in order. Ends in Ready (returns OK) or Failed (returns the step's error,
  // annotated with the phase). Allowed from Idle, Ready, Failed and Down.
  absl::Status Run(BringUpContext& ctx);

  // Desired state "down". FAILED_PRECONDITION while a Run is in progress.
  absl::Status MarkDown();

  Phase phase() const;
  bool running() const;
  // The phases this machine will pass through on a successful run, Validate..Ready.
  std::vector<Phase> planned_phases() const;

 private:
  BringUpMachine(std::vector<std::unique_ptr<BringUpStep>> steps, TransitionObserver observer);
  absl::Status TransitionLocked(Phase to, const std::string& message);

  std::vector<std::unique_ptr<BringUpStep>> steps_;
  TransitionObserver observer_;
  mutable std::mutex mu_;
  Phase phase_ = Phase::kIdle;
  bool running_ = false;
};

}  // namespace glm::orchestrate
