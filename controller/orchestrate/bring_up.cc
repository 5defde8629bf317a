#include "controller/orchestrate/bring_up.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "controller/orchestrate/bring_up_context.h"

namespace glm::orchestrate {

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kIdle: return "idle";
    case Phase::kValidate: return "validate";
    case Phase::kConnect: return "connect";
    case Phase::kPreflight: return "preflight";
    case Phase::kPlan: return "plan";
    case Phase::kStage: return "stage";
    case Phase::kLoad: return "load";
    case Phase::kCanary: return "canary";
    case Phase::kGateway: return "gateway";
    case Phase::kReady: return "ready";
    case Phase::kFailed: return "failed";
    case Phase::kDown: return "down";
  }
  return "unknown";
}

bool IsStepPhase(Phase phase) { return phase >= Phase::kValidate && phase <= Phase::kGateway; }

bool BringUpMachine::CanTransition(Phase from, Phase to) {
  if (to == Phase::kFailed) return IsStepPhase(from);
  if (to == Phase::kDown) {
    return from == Phase::kIdle || from == Phase::kReady || from == Phase::kFailed;
  }
  if (to == Phase::kValidate) {
    return from == Phase::kIdle || from == Phase::kReady || from == Phase::kFailed ||
           from == Phase::kDown;
  }
  // Forward through the steps (skipping phases without a step) and from the last one to Ready.
  if (IsStepPhase(from) && (IsStepPhase(to) || to == Phase::kReady)) return to > from;
  return false;
}

absl::StatusOr<std::unique_ptr<BringUpMachine>> BringUpMachine::Create(
    std::vector<std::unique_ptr<BringUpStep>> steps, TransitionObserver observer) {
  Phase last = Phase::kIdle;
  for (const auto& step : steps) {
    if (!step) return absl::InvalidArgumentError("bring-up step is null");
    if (!IsStepPhase(step->phase()) || step->phase() <= last) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bring-up step for phase '", PhaseName(step->phase()),
          "' is out of order or not a step phase: steps must be Validate..Gateway, each at most "
          "once, in phase order"));
    }
    last = step->phase();
  }
  if (steps.empty() || steps.front()->phase() != Phase::kValidate) {
    return absl::InvalidArgumentError("bring-up must start with a Validate step");
  }
  return std::unique_ptr<BringUpMachine>(new BringUpMachine(std::move(steps), std::move(observer)));
}

BringUpMachine::BringUpMachine(std::vector<std::unique_ptr<BringUpStep>> steps,
                               TransitionObserver observer)
    : steps_(std::move(steps)), observer_(std::move(observer)) {}

absl::Status BringUpMachine::TransitionLocked(Phase to, const std::string& message) {
  Phase from = phase_;
  if (!CanTransition(from, to)) {
    return absl::InternalError(absl::StrCat("illegal bring-up transition ", PhaseName(from),
                                            " -> ", PhaseName(to)));
  }
  phase_ = to;
  GLM_LOG_INFO("bring-up transition from={} to={}", PhaseName(from), PhaseName(to));
  if (observer_) observer_(from, to, message);
  return absl::OkStatus();
}

absl::Status BringUpMachine::Run(BringUpContext& ctx) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "bring-up is already running (phase ", PhaseName(phase_),
          "); follow it with `glmctl status` and run `glmctl up` again when it ends"));
    }
    running_ = true;
  }
  // The lock is not held while steps run (they take seconds); running_ keeps Runs exclusive and
  // only this thread moves phase_ until running_ is cleared.
  absl::Status result = absl::OkStatus();
  for (const auto& step : steps_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      result = TransitionLocked(step->phase(), "");
    }
    if (!result.ok()) break;
    absl::Status s = step->Run(ctx);
    if (!s.ok()) {
      result = Annotate(s, absl::StrCat(PhaseName(step->phase()), " failed"));
      break;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (result.ok()) {
    result = TransitionLocked(Phase::kReady, "");
  }
  if (!result.ok() && IsStepPhase(phase_)) {
    // Keep the step's error even if recording the failure is refused (it cannot be: any step
    // phase may fail).
    TransitionLocked(Phase::kFailed, std::string(result.message())).IgnoreError();
  }
  running_ = false;
  return result;
}

absl::Status BringUpMachine::MarkDown() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bring-up is running (phase ", PhaseName(phase_), "); run `glmctl down` when it ends"));
  }
  if (phase_ == Phase::kDown) return absl::OkStatus();
  return TransitionLocked(Phase::kDown, "");
}

Phase BringUpMachine::phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_;
}

bool BringUpMachine::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

std::vector<Phase> BringUpMachine::planned_phases() const {
  std::vector<Phase> out;
  for (const auto& s : steps_) out.push_back(s->phase());
  out.push_back(Phase::kReady);
  return out;
}

}  // namespace glm::orchestrate
