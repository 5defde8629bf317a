#include "controller/orchestrate/bring_up.h"

#include <vector>

#include "controller/orchestrate/bring_up_context.h"
#include "gtest/gtest.h"

namespace glm::orchestrate {
namespace {

// A step that records its runs and returns a scripted status.
class ScriptedStep : public BringUpStep {
 public:
  ScriptedStep(Phase phase, std::vector<Phase>* log) : phase_(phase), log_(log) {}
  Phase phase() const override { return phase_; }
  absl::Status Run(BringUpContext&) override {
    log_->push_back(phase_);
    if (fail_next_) {
      fail_next_ = false;
      return absl::UnavailableError("node 'n2' unreachable");
    }
    return absl::OkStatus();
  }
  void FailNext() { fail_next_ = true; }

 private:
  Phase phase_;
  std::vector<Phase>* log_;
  bool fail_next_ = false;
};

struct Harness {
  Harness(std::vector<Phase> phases) : clock(), state(&clock), ctx(&state, nullptr) {
    std::vector<std::unique_ptr<BringUpStep>> steps;
    for (Phase p : phases) {
      auto s = std::make_unique<ScriptedStep>(p, &runs);
      by_phase[p] = s.get();
      steps.push_back(std::move(s));
    }
    auto m = BringUpMachine::Create(std::move(steps),
                                    [this](Phase from, Phase to, const std::string& msg) {
                                      transitions.push_back({from, to});
                                      last_message = msg;
                                    });
    EXPECT_TRUE(m.ok()) << m.status();
    machine = *std::move(m);
  }
  FakeClock clock;
  ClusterState state;
  BringUpContext ctx;
  std::vector<Phase> runs;
  std::vector<std::pair<Phase, Phase>> transitions;
  std::string last_message;
  std::map<Phase, ScriptedStep*> by_phase;
  std::unique_ptr<BringUpMachine> machine;
};

const std::vector<Phase> kToday = {Phase::kValidate, Phase::kConnect, Phase::kPreflight,
                                   Phase::kPlan};

TEST(BringUpMachineTest, HappyPathVisitsEveryStepInOrderThenReady) {
  Harness h(kToday);
  EXPECT_EQ(h.machine->phase(), Phase::kIdle);
  ASSERT_TRUE(h.machine->Run(h.ctx).ok());
  EXPECT_EQ(h.machine->phase(), Phase::kReady);
  EXPECT_EQ(h.runs, kToday);
  std::vector<std::pair<Phase, Phase>> want = {{Phase::kIdle, Phase::kValidate},
                                               {Phase::kValidate, Phase::kConnect},
                                               {Phase::kConnect, Phase::kPreflight},
                                               {Phase::kPreflight, Phase::kPlan},
                                               {Phase::kPlan, Phase::kReady}};
  EXPECT_EQ(h.transitions, want);
}

TEST(BringUpMachineTest, FailureStopsAtTheStepAndNamesIt) {
  Harness h(kToday);
  h.by_phase[Phase::kConnect]->FailNext();
  absl::Status s = h.machine->Run(h.ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("connect failed"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("n2"), absl::string_view::npos) << s;
  EXPECT_EQ(h.machine->phase(), Phase::kFailed);
  EXPECT_EQ(h.runs, (std::vector<Phase>{Phase::kValidate, Phase::kConnect}));
  EXPECT_EQ(h.transitions.back(), std::make_pair(Phase::kConnect, Phase::kFailed));
  EXPECT_NE(h.last_message.find("n2"), std::string::npos);
}

TEST(BringUpMachineTest, RerunAfterFailureStartsOverFromValidate) {
  Harness h(kToday);
  h.by_phase[Phase::kPreflight]->FailNext();
  ASSERT_FALSE(h.machine->Run(h.ctx).ok());
  h.runs.clear();
  ASSERT_TRUE(h.machine->Run(h.ctx).ok());
  EXPECT_EQ(h.runs, kToday);
  EXPECT_EQ(h.machine->phase(), Phase::kReady);
}

TEST(BringUpMachineTest, DownFromReadyAndUpAgain) {
  Harness h(kToday);
  ASSERT_TRUE(h.machine->Run(h.ctx).ok());
  ASSERT_TRUE(h.machine->MarkDown().ok());
  EXPECT_EQ(h.machine->phase(), Phase::kDown);
  EXPECT_TRUE(h.machine->MarkDown().ok());  // idempotent
  ASSERT_TRUE(h.machine->Run(h.ctx).ok());
  EXPECT_EQ(h.machine->phase(), Phase::kReady);
}

TEST(BringUpMachineTest, LaterPhasesPlugInWithoutChangingTheMachine) {
  Harness h({Phase::kValidate, Phase::kConnect, Phase::kPreflight, Phase::kPlan, Phase::kStage,
             Phase::kLoad, Phase::kCanary, Phase::kGateway});
  ASSERT_TRUE(h.machine->Run(h.ctx).ok());
  EXPECT_EQ(h.runs.back(), Phase::kGateway);
  EXPECT_EQ(h.machine->planned_phases().size(), 9u);
}

TEST(BringUpMachineTest, RejectsStepsOutOfOrderOrDuplicated) {
  std::vector<Phase> log;
  {
    std::vector<std::unique_ptr<BringUpStep>> steps;
    steps.push_back(std::make_unique<ScriptedStep>(Phase::kValidate, &log));
    steps.push_back(std::make_unique<ScriptedStep>(Phase::kPlan, &log));
    steps.push_back(std::make_unique<ScriptedStep>(Phase::kConnect, &log));
    EXPECT_EQ(BringUpMachine::Create(std::move(steps)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  {
    std::vector<std::unique_ptr<BringUpStep>> steps;
    steps.push_back(std::make_unique<ScriptedStep>(Phase::kValidate, &log));
    steps.push_back(std::make_unique<ScriptedStep>(Phase::kValidate, &log));
    EXPECT_FALSE(BringUpMachine::Create(std::move(steps)).ok());
  }
  {
    std::vector<std::unique_ptr<BringUpStep>> steps;
    steps.push_back(std::make_unique<ScriptedStep>(Phase::kConnect, &log));
    EXPECT_FALSE(BringUpMachine::Create(std::move(steps)).ok());  // must start with Validate
  }
  {
    std::vector<std::unique_ptr<BringUpStep>> steps;
    steps.push_back(std::make_unique<ScriptedStep>(Phase::kReady, &log));
    EXPECT_FALSE(BringUpMachine::Create(std::move(steps)).ok());  // not a step phase
  }
}

TEST(BringUpMachineTest, TransitionTable) {
  using M = BringUpMachine;
  EXPECT_TRUE(M::CanTransition(Phase::kIdle, Phase::kValidate));
  EXPECT_FALSE(M::CanTransition(Phase::kIdle, Phase::kReady));
  EXPECT_FALSE(M::CanTransition(Phase::kIdle, Phase::kConnect));
  EXPECT_TRUE(M::CanTransition(Phase::kPlan, Phase::kStage));
  EXPECT_TRUE(M::CanTransition(Phase::kStage, Phase::kReady));
  EXPECT_TRUE(M::CanTransition(Phase::kStage, Phase::kLoad));
  EXPECT_TRUE(M::CanTransition(Phase::kStage, Phase::kFailed));
  EXPECT_FALSE(M::CanTransition(Phase::kStage, Phase::kPlan));  // never backwards
  EXPECT_FALSE(M::CanTransition(Phase::kStage, Phase::kDown));  // not while running
  EXPECT_TRUE(M::CanTransition(Phase::kPlan, Phase::kReady));  // later phases without steps
  EXPECT_FALSE(M::CanTransition(Phase::kPlan, Phase::kConnect));  // never backwards
  EXPECT_TRUE(M::CanTransition(Phase::kPreflight, Phase::kFailed));
  EXPECT_FALSE(M::CanTransition(Phase::kReady, Phase::kFailed));
  EXPECT_FALSE(M::CanTransition(Phase::kIdle, Phase::kFailed));
  EXPECT_TRUE(M::CanTransition(Phase::kFailed, Phase::kValidate));
  EXPECT_TRUE(M::CanTransition(Phase::kReady, Phase::kValidate));
  EXPECT_TRUE(M::CanTransition(Phase::kReady, Phase::kDown));
  EXPECT_FALSE(M::CanTransition(Phase::kConnect, Phase::kDown));  // not while running
  EXPECT_TRUE(M::CanTransition(Phase::kDown, Phase::kValidate));
  EXPECT_FALSE(M::CanTransition(Phase::kDown, Phase::kReady));
}

// A step that blocks until released, to observe the machine while it runs.
class BlockingStep : public BringUpStep {
 public:
  Phase phase() const override { return Phase::kValidate; }
  absl::Status Run(BringUpContext&) override {
    std::unique_lock<std::mutex> lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
    return absl::OkStatus();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false;
  bool released = false;
};

TEST(BringUpMachineTest, ConcurrentRunAndDownAreRefusedWhileRunning) {
  FakeClock clock;
  ClusterState state(&clock);
  BringUpContext ctx(&state, nullptr);
  auto step = std::make_unique<BlockingStep>();
  BlockingStep* blocking = step.get();
  std::vector<std::unique_ptr<BringUpStep>> steps;
  steps.push_back(std::move(step));
  auto machine = *BringUpMachine::Create(std::move(steps));
  std::thread runner([&] { EXPECT_TRUE(machine->Run(ctx).ok()); });
  {
    std::unique_lock<std::mutex> lock(blocking->mu);
    blocking->cv.wait(lock, [&] { return blocking->entered; });
  }
  EXPECT_TRUE(machine->running());
  EXPECT_EQ(machine->Run(ctx).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(machine->MarkDown().code(), absl::StatusCode::kFailedPrecondition);
  {
    std::lock_guard<std::mutex> lock(blocking->mu);
    blocking->released = true;
  }
  blocking->cv.notify_all();
  runner.join();
  EXPECT_EQ(machine->phase(), Phase::kReady);
}

}  // namespace
}  // namespace glm::orchestrate
