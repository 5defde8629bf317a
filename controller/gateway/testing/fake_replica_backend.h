// A scripted ReplicaBackend for the gateway's tests: replicas whose readiness the test sets (and
// announces to the readiness listener), and generations that answer a fixed continuation (one
// script for all replicas, or one per replica) from a thread of their own (as gRPC's callbacks
// come from threads of their own), one token per event.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "controller/gateway/replica_backend.h"

namespace glm::gateway::testing {

class FakeReplicaBackend : public ReplicaBackend {
 public:
  struct Script {
    std::vector<int32_t> tokens;        // emitted in order, then finish
    std::string finish_reason = "stop";  // used when every token was sent
    absl::Status error;                 // non-OK: on_done(error) after the tokens
    bool hold = false;                  // wait for Release() (or Cancel) before the tokens
  };

  explicit FakeReplicaBackend(int num_replicas = 1) {
    for (int i = 0; i < num_replicas; ++i) {
      ReplicaInfo r;
      r.index = i;
      r.ready = true;
      r.state = "ready";
      replicas_.push_back(r);
    }
  }
  ~FakeReplicaBackend() override {
    Release();
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

  // Adds a ready replica (index = the next one).
  void AddReplica() {
    std::lock_guard<std::mutex> lock(mu_);
    ReplicaInfo r;
    r.index = static_cast<int>(replicas_.size());
    r.ready = true;
    r.state = "ready";
    replicas_.push_back(r);
  }
  // `notify` false: the readiness listener is not told (the gateway sees the change only at its
  // next periodic re-check).
  void SetReady(int replica, bool ready, std::string state = "", bool notify = true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      replicas_[replica].ready = ready;
      replicas_[replica].state = state.empty() ? (ready ? "ready" : "failed") : state;
      replicas_[replica].reason = ready ? "" : "replica " + std::to_string(replica) + " is down";
    }
    if (notify) {
      std::lock_guard<std::mutex> lock(listener_mu_);
      if (listener_) listener_();
    }
  }
  void SetScript(Script script) {
    std::lock_guard<std::mutex> lock(mu_);
    script_ = std::move(script);
  }
  // Generations on `replica` follow `script` instead of the common one.
  void SetReplicaScript(int replica, Script script) {
    std::lock_guard<std::mutex> lock(mu_);
    replica_scripts_[replica] = std::move(script);
  }
  // Lets held generations go on.
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  // What the gateway asked for, in order.
  std::vector<std::pair<int, GenerateParams>> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  int cancels() const { return cancels_.load(); }

  std::vector<ReplicaInfo> Replicas() override {
    std::lock_guard<std::mutex> lock(mu_);
    return replicas_;
  }

  void SetReadinessListener(std::function<void()> listener) override {
    std::lock_guard<std::mutex> lock(listener_mu_);
    listener_ = std::move(listener);
  }

  std::shared_ptr<GenerateCall> Generate(int replica, const GenerateParams& params,
                                         GenerateCallbacks callbacks) override {
    auto call = std::make_shared<Call>(this);
    std::lock_guard<std::mutex> lock(mu_);
    requests_.emplace_back(replica, params);
    auto own = replica_scripts_.find(replica);
    Script script = own != replica_scripts_.end() ? own->second : script_;
    const int max_tokens = params.max_tokens;
    threads_.emplace_back([this, call, script, max_tokens, callbacks = std::move(callbacks)] {
      if (script.hold) {
        std::unique_lock<std::mutex> hold(mu_);
        cv_.wait(hold, [&] { return released_ || call->cancelled.load(); });
      }
      int sent = 0;
      for (int32_t id : script.tokens) {
        if (call->cancelled.load()) break;
        if (sent == max_tokens) break;
        std::vector<TokenLogprob> logprobs(1);
        logprobs[0].logprob = -0.5f;
        logprobs[0].top = {{id, -0.5f}, {id + 1, -1.5f}};
        callbacks.on_tokens({id}, logprobs);
        ++sent;
      }
      const int prompt = 0;
      if (call->cancelled.load()) {
        callbacks.on_done(absl::OkStatus(), "abort", prompt, sent);
      } else if (!script.error.ok()) {
        callbacks.on_done(script.error, "", prompt, sent);
      } else {
        callbacks.on_done(absl::OkStatus(),
                          sent == max_tokens && sent < static_cast<int>(script.tokens.size())
                              ? "length"
                              : script.finish_reason,
                          prompt, sent);
      }
    });
    return call;
  }

 private:
  struct Call : GenerateCall {
    explicit Call(FakeReplicaBackend* backend) : backend(backend) {}
    void Cancel() override {
      if (!cancelled.exchange(true)) backend->cancels_.fetch_add(1);
      std::lock_guard<std::mutex> lock(backend->mu_);
      backend->cv_.notify_all();
    }
    FakeReplicaBackend* backend;
    std::atomic<bool> cancelled{false};
  };

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ReplicaInfo> replicas_;
  Script script_;
  std::map<int, Script> replica_scripts_;
  std::mutex listener_mu_;  // held while the listener runs, so clearing it waits for a call
  std::function<void()> listener_;
  bool released_ = false;
  std::vector<std::pair<int, GenerateParams>> requests_;
  std::vector<std::thread> threads_;
  std::atomic<int> cancels_{0};
};

}  // namespace glm::gateway::testing
