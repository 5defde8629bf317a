// ControllerRendezvous against an in-test Controller service holding the rendezvous keys (the
// agent never links controller/): Put/Get within a namespace, a Get that waits for a later Put,
// the wait bounded by DEADLINE_EXCEEDED naming the key, a controller that starts late, and two
// ShardHosts forming a PP 2 replica through it and serving the fixture's greedy tokens.
#include "agent/shard/controller_rendezvous.h"

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "agent/shard/shard_host.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace glm::agent {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using std::chrono::milliseconds;

// The controller's rendezvous RPCs over a map (what controller/rendezvous does, minus limits).
class FakeRendezvousService final : public glm::v1::Controller::Service {
 public:
  grpc::Status RendezvousPut(grpc::ServerContext*, const glm::v1::RendezvousPutRequest* req,
                             glm::v1::RendezvousPutResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    values_[req->namespace_() + "\n" + req->key()] = req->value();
    ++puts_;
    cv_.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status RendezvousGet(grpc::ServerContext*, const glm::v1::RendezvousGetRequest* req,
                             glm::v1::RendezvousGetResponse* resp) override {
    std::unique_lock<std::mutex> lock(mu_);
    const std::string k = req->namespace_() + "\n" + req->key();
    if (!cv_.wait_for(lock, milliseconds(req->wait_ms()), [&] { return values_.count(k) > 0; })) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "key " + req->key() + " not set");
    }
    resp->set_value(values_[k]);
    return grpc::Status::OK;
  }
  grpc::Status RendezvousDelete(grpc::ServerContext*, const glm::v1::RendezvousDeleteRequest* req,
                                glm::v1::RendezvousDeleteResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (auto it = values_.begin(); it != values_.end();) {
      if (it->first.rfind(req->namespace_() + "\n", 0) == 0) {
        it = values_.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    resp->set_deleted(n);
    return grpc::Status::OK;
  }
  int puts() {
    std::lock_guard<std::mutex> lock(mu_);
    return puts_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
  int puts_ = 0;
};

struct Server {
  FakeRendezvousService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  void Start(int want_port = 0) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:" + std::to_string(want_port), grpc::InsecureServerCredentials(),
                       &port);
    b.RegisterService(&service);
    server = b.BuildAndStart();
    ASSERT_NE(server, nullptr);
    ASSERT_GT(port, 0);
  }
  ~Server() {
    if (server) server->Shutdown(std::chrono::system_clock::now() + milliseconds(200));
  }
};

TEST(ControllerRendezvousTest, PutGetAndNamespaces) {
  Server s;
  s.Start();
  ControllerRendezvous a(s.address(), nullptr, "replica-0/epoch-1");
  ControllerRendezvous b(s.address(), nullptr, "replica-0/epoch-2");
  ASSERT_TRUE(a.Put("k", "v1").ok());
  auto got = a.Get("k", milliseconds(0));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v1");
  // Another epoch's namespace never sees it.
  auto other = b.Get("k", milliseconds(50));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(other.status().message()),
              AllOf(HasSubstr("'k'"), HasSubstr("replica-0/epoch-2"), HasSubstr(s.address())));
  a.DeleteNamespace();
  EXPECT_EQ(a.Get("k", milliseconds(0)).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(ControllerRendezvousTest, GetWaitsForALaterPut) {
  Server s;
  s.Start();
  ControllerRendezvous r(s.address(), nullptr, "ns");
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(150));
    ASSERT_TRUE(r.Put("addr/1", std::string("\0\1bytes", 7)).ok());
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto got = r.Get("addr/1", milliseconds(5000));
  later.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string("\0\1bytes", 7));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(3000));
}

TEST(ControllerRendezvousTest, AControllerThatStartsLateIsRetriedWithinTheWait) {
  // Reserve a port, release it, and start the controller there after the Get began.
  int port = 0;
  {
    Server probe;
    probe.Start();
    port = probe.port;
  }
  ControllerRendezvous r("127.0.0.1:" + std::to_string(port), nullptr, "ns");
  Server s;
  std::thread start([&] {
    std::this_thread::sleep_for(milliseconds(300));
    s.Start(port);
    ASSERT_TRUE(ControllerRendezvous(s.address(), nullptr, "ns").Put("k", "v").ok());
  });
  auto got = r.Get("k", milliseconds(5000));
  start.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
  // Nobody listening and no time left: DEADLINE_EXCEEDED naming the key, quickly.
  ControllerRendezvous dead("127.0.0.1:1", nullptr, "ns");
  const auto t0 = std::chrono::steady_clock::now();
  auto none = dead.Get("k", milliseconds(300));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(3000));
}

// Two ShardHosts (PP 2 over tiny-sparse, the boundary before a shared-indexer layer) meet through
// the rendezvous service and serve the single-process engine's greedy tokens.
TEST(ShardGroupTest, TwoPipelineStagesServeTheGoldenGreedyTokens) {
  Server s;
  s.Start();
  const std::string dir = std::string(GLM_GOLDEN_DIR) + "/tiny-sparse";
  std::ifstream in(dir + "/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  const auto prompt = ref["prompt_ids"].get<std::vector<int32_t>>();
  const auto greedy = ref["greedy_ids"].get<std::vector<int32_t>>();

  auto options = [](const std::string& node) {
    ShardHostOptions o;
    o.node = node;
    o.num_threads = 1;
    o.tick_thread = false;
    o.monitor_interval = milliseconds(50);
    return o;
  };
  ShardHost head(options("pp0")), tail(options("pp1"));
  auto load = [&](ShardHost& h, int pp, int begin, int end) {
    glm::v1::LoadShardRequest r;
    r.set_model_dir(dir);
    r.mutable_shard()->set_pp_rank(pp);
    r.set_layer_begin(begin);
    r.set_layer_end(end);
    r.set_pp_size(2);
    r.set_tp_size(1);
    r.set_kv_cache_bytes(4 << 20);
    r.set_backend("cpu");
    ASSERT_TRUE(h.Load(r, nullptr).ok());
  };
  load(head, 0, 0, 2);  // layer 2 is a shared-indexer layer: the top-k crosses the boundary
  load(tail, 1, 2, 5);
  auto start_request = [&](int pp) {
    glm::v1::StartShardRequest r;
    r.mutable_shard()->set_pp_rank(pp);
    r.mutable_shard()->set_epoch(7);
    r.set_rendezvous_address(s.address());
    r.set_connect_timeout_ms(20'000);
    r.set_op_timeout_ms(5'000);
    return r;
  };
  absl::Status tail_started;
  std::thread worker([&] { tail_started = tail.Start(start_request(1), nullptr); });
  absl::Status head_started = head.Start(start_request(0), nullptr);
  worker.join();
  ASSERT_TRUE(head_started.ok()) << head_started;
  ASSERT_TRUE(tail_started.ok()) << tail_started;
  EXPECT_GT(s.service.puts(), 0);
  EXPECT_EQ(head.status().group_key(), "replica-0/epoch-7");

  glm::v1::GenerateRequest g;
  for (int32_t id : prompt) g.add_prompt_token_ids(id);
  g.set_max_tokens(10);
  std::vector<int32_t> got;
  ASSERT_TRUE(head.Generate(g, [&](const glm::v1::TokenEvent& e) {
                    got.insert(got.end(), e.token_ids().begin(), e.token_ids().end());
                    return true;
                  }, nullptr).ok());
  EXPECT_EQ(got, std::vector<int32_t>(greedy.begin(), greedy.begin() + 10));
  absl::Status follower = tail.Generate(g, [](auto&) { return true; }, nullptr);
  EXPECT_EQ(follower.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(follower.message()), AllOf(HasSubstr("pp1"), HasSubstr("head")));
  // The follower's heartbeat counts the steps it served.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (tail.status().steps() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_GT(tail.status().steps(), 0);

  // The tail stage goes away: the head's group fails fast and says which rank.
  ASSERT_TRUE(tail.Stop({}, nullptr).ok());
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status after = head.Generate(g, [](auto&) { return true; }, nullptr);
  while (head.state() != glm::v1::SHARD_STATE_FAILED &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_FALSE(after.ok());
  EXPECT_EQ(head.state(), glm::v1::SHARD_STATE_FAILED);
  EXPECT_THAT(head.status().last_error(), HasSubstr("replica-0/epoch-7"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

}  // namespace
}  // namespace glm::agent
