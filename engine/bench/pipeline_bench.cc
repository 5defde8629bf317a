// glm-bench-pipeline: decode throughput of a pipeline-parallel replica with one step in flight
// against micro-batches in flight (EngineOptions::max_steps_in_flight = pp_size).
//
//   glm-bench-pipeline [--golden DIR] [--fixture NAME | --model DIR] [--tokens N]
//                      [--streams 1,2,4,8] [--threads T] [--repeats R]
//
// Model: a golden fixture (default tiny-sparse: 5 layers with IndexShare "shared" layers) or
// any model directory (--model, e.g. models/demo-chat). Layouts over its L layers: PP 2 (two
// halves) and PP 3 ([0,0] [1,L-2] [L-1,L-1]; on tiny-sparse a boundary before a shared layer). Every rank is an Engine in this process (Engine::Create over an InProcessRendezvous
// and Gloo on 127.0.0.1, the production wiring), with T CPU threads (default 1).
// For each layout, depth (1, then pp_size, in the same process on the same replica shape) and S
// concurrent streams (S greedy requests of N tokens each, eos ignored, distinct prompts of 8 to
// 8 + S tokens, prefix caching off): the best of R runs of
//   tok/s   generated tokens / wall time from the first submit to the last token
//   busy    per stage: growth of EngineStats::stage_compute_seconds (the time in the stage's
//           layers) / wall time; with a full pipeline every stage is near 1
//   ratio   tok/s at depth pp_size / tok/s at depth 1
// and the most steps the head had outstanding. No figure is asserted; docs/benchmarks.md
// records a run. The ranks share this machine's cores: where they are fewer than the ranks'
// threads, overlapping stages compete for the same cores and the ratio understates what
// separate nodes give (it cannot exceed cores / threads per rank).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/dist/in_process_rendezvous.h"
#include "engine/engine.h"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Partition = std::vector<std::pair<int, int>>;

struct Args {
  std::string golden;
  std::string fixture = "tiny-sparse";
  std::string model;  // a model directory instead of a fixture
  int tokens = 32;
  std::vector<int> streams = {1, 2, 4, 8};
  int threads = 1;
  int repeats = 2;
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (f == "--golden") {
      a->golden = next();
    } else if (f == "--fixture") {
      a->fixture = next();
    } else if (f == "--model") {
      a->model = next();
    } else if (f == "--tokens") {
      if (!absl::SimpleAtoi(next(), &a->tokens) || a->tokens < 1) return false;
    } else if (f == "--threads") {
      if (!absl::SimpleAtoi(next(), &a->threads) || a->threads < 1) return false;
    } else if (f == "--repeats") {
      if (!absl::SimpleAtoi(next(), &a->repeats) || a->repeats < 1) return false;
    } else if (f == "--streams") {
      a->streams.clear();
      for (absl::string_view v : absl::StrSplit(next(), ',')) {
        int s = 0;
        if (!absl::SimpleAtoi(v, &s) || s < 1) return false;
        a->streams.push_back(s);
      }
    } else {
      return false;
    }
  }
  if (a->golden.empty()) {
    const char* src = std::getenv("GLM_SOURCE_DIR");
    a->golden = src != nullptr ? std::string(src) + "/tests/golden" : "tests/golden";
  }
  return true;
}

struct Replica {
  std::unique_ptr<InProcessRendezvous> rendezvous = std::make_unique<InProcessRendezvous>();
  std::vector<std::unique_ptr<Engine>> ranks;  // world-rank order; [0] is the head
};

std::unique_ptr<Replica> StartReplica(const EngineOptions& base, const Partition& stages,
                                      const std::string& key) {
  auto replica = std::make_unique<Replica>();
  const int pp_size = static_cast<int>(stages.size());
  replica->ranks.resize(pp_size);
  std::vector<absl::Status> status(pp_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < pp_size; ++r) {
    threads.emplace_back([&, r] {
      EngineOptions eo = base;
      ShardTopology& t = eo.shard;
      t.pp_rank = r;
      t.pp_size = pp_size;
      t.first_layer = stages[r].first;
      t.last_layer = stages[r].second;
      t.rendezvous = replica->rendezvous.get();
      t.group_key = key;
      t.connect_timeout = std::chrono::seconds(60);
      t.op_timeout = std::chrono::seconds(60);
      auto engine = Engine::Create(eo);
      status[r] = engine.status();
      if (engine.ok()) replica->ranks[r] = *std::move(engine);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < pp_size; ++r) {
    if (!status[r].ok()) {
      std::fprintf(stderr, "rank %d: %s\n", r, status[r].ToString().c_str());
      return nullptr;
    }
  }
  return replica;
}

struct Run {
  double tokens_per_second = 0.0;
  std::vector<double> busy;  // per stage
  int max_in_flight = 0;
};

// S concurrent greedy streams of `tokens` tokens each on `replica`.
bool RunStreams(Replica& replica, int streams, int tokens, Run* out) {
  Engine& head = *replica.ranks[0];
  const int vocab = static_cast<int>(head.model_config().vocab_size);
  std::vector<double> compute0;
  for (auto& e : replica.ranks) compute0.push_back(e->Stats().stage_compute_seconds);
  const auto t0 = Clock::now();
  std::vector<RequestHandle> handles;
  for (int s = 0; s < streams; ++s) {
    Request r;
    for (int i = 0; i < 8 + s; ++i) r.prompt_ids.push_back((i * 31 + s * 17 + i * i) % vocab);
    r.sampling.max_tokens = tokens;
    r.sampling.temperature = 0.0f;
    r.sampling.ignore_eos = true;
    auto h = head.Submit(std::move(r));
    if (!h.ok()) {
      std::fprintf(stderr, "submit: %s\n", h.status().ToString().c_str());
      return false;
    }
    handles.push_back(*h);
  }
  int64_t generated = 0;
  for (auto& h : handles) {
    TokenEvent last;
    generated += static_cast<int64_t>(h.stream->CollectTokens(&last).size());
    if (last.finish_reason != FinishReason::kLength) {
      std::fprintf(stderr, "stream ended early: %s\n", last.error.ToString().c_str());
      return false;
    }
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  out->tokens_per_second = static_cast<double>(generated) / wall;
  // The head publishes its stats after each step: wait until its last step is in.
  for (int i = 0; i < 200 && head.Stats().num_running > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  out->busy.clear();
  for (size_t r = 0; r < replica.ranks.size(); ++r) {
    out->busy.push_back((replica.ranks[r]->Stats().stage_compute_seconds - compute0[r]) / wall);
  }
  out->max_in_flight = head.Stats().max_steps_in_flight_observed;
  return true;
}

std::string BusyText(const std::vector<double>& busy) {
  std::string s;
  for (double b : busy) s += absl::StrCat(s.empty() ? "" : " ", static_cast<int>(b * 100 + 0.5), "%");
  return s;
}

int Main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: glm-bench-pipeline [--golden DIR] [--fixture NAME | --model DIR] [--tokens N] "
                 "[--streams 1,2,4,8] [--threads T] [--repeats R]\n");
    return 2;
  }
  const fs::path dir =
      args.model.empty() ? fs::path(args.golden) / args.fixture : fs::path(args.model);
  if (!fs::exists(dir / "config.json")) {
    std::fprintf(stderr, "no fixture at %s (--golden DIR --fixture NAME)\n", dir.c_str());
    return 2;
  }
  std::printf("glm-bench-pipeline model=%s tokens/stream=%d threads/rank=%d cores=%u\n",
              dir.filename().c_str(), args.tokens, args.threads,
              std::thread::hardware_concurrency());
  int num_layers = 0;
  {
    EngineOptions probe;
    probe.model_dir = dir.string();
    probe.backend = "cpu";
    probe.num_threads = 1;
    probe.kv_num_blocks = 16;
    auto single = Engine::Create(probe);
    if (!single.ok()) {
      std::fprintf(stderr, "%s\n", single.status().ToString().c_str());
      return 1;
    }
    num_layers = static_cast<int>((*single)->model_config().num_hidden_layers);
  }
  if (num_layers < 3) {
    std::fprintf(stderr, "the model has %d layers: PP 3 needs 3\n", num_layers);
    return 2;
  }
  // PP 2: halves; PP 3: one layer, the middle, one layer.
  const int half = num_layers / 2;
  const std::vector<Partition> layouts = {{{0, half - 1}, {half, num_layers - 1}},
                                          {{0, 0}, {1, num_layers - 2}, {num_layers - 1, num_layers - 1}}};
  int key = 0;
  for (const Partition& stages : layouts) {
    const int pp = static_cast<int>(stages.size());
    std::printf("\nPP %d\n%8s %12s %-16s %12s %-16s %7s %9s\n", pp, "streams", "tok/s d=1",
                "busy d=1", absl::StrCat("tok/s d=", pp).c_str(),
                absl::StrCat("busy d=", pp).c_str(), "ratio", "in flight");
    for (int streams : args.streams) {
      Run best[2];
      for (int rep = 0; rep < args.repeats; ++rep) {
        for (int d = 0; d < 2; ++d) {
          EngineOptions eo;
          eo.model_dir = dir.string();
          eo.backend = "cpu";
          eo.num_threads = args.threads;
          eo.kv_block_size = 16;
          eo.kv_num_blocks = 512;
          eo.max_num_seqs = 64;
          eo.max_num_batched_tokens = 512;
          eo.enable_prefix_caching = false;
          eo.max_steps_in_flight = d == 0 ? 1 : pp;
          auto replica = StartReplica(eo, stages, absl::StrCat("bench/replica", key++));
          if (replica == nullptr) return 1;
          Run warm, run;
          if (!RunStreams(*replica, 1, 4, &warm) || !RunStreams(*replica, streams, args.tokens, &run)) {
            return 1;
          }
          if (run.tokens_per_second > best[d].tokens_per_second) best[d] = run;
        }
      }
      std::printf("%8d %12.1f %-16s %12.1f %-16s %7.2f %9d\n", streams, best[0].tokens_per_second,
                  BusyText(best[0].busy).c_str(), best[1].tokens_per_second,
                  BusyText(best[1].busy).c_str(),
                  best[1].tokens_per_second / best[0].tokens_per_second, best[1].max_in_flight);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace glm::engine

int main(int argc, char** argv) { return glm::engine::Main(argc, argv); }
