// glm-bench-cpu: prefill and decode tokens/s of the CPU backend.
//
//   glm-bench-cpu [--golden DIR] [--threads N] [--prompt P] [--decode D] [--batch B] [--synthetic]
//
// For each model (the tiny golden fixtures under DIR, default $GLM_SOURCE_DIR/tests/golden or
// ./tests/golden, plus a larger random config with --synthetic) it measures, once with 1 thread
// (the baseline) and once with N threads (default: all cores):
//   prefill  P tokens of one sequence in one step (expanded MLA form)            -> tokens/s
//   decode   D steps of one sequence, one token per step through the paged cache  -> tokens/s
//   decode   D steps of B sequences batched, one token each per step             -> tokens/s
// and prints the N-thread / 1-thread ratio. Numbers are wall-clock medians over repeats; no
// assertion is made on them.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/glm_moe_dsa.h"
#include "engine/model/random_weights.h"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;

struct Args {
  std::string golden;
  int threads = 0;
  int prompt = 128;
  int decode = 32;
  int batch = 8;
  bool synthetic = false;
  int repeats = 3;
};

struct Result {
  double prefill_tps = 0, decode_tps = 0, batch_decode_tps = 0;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int32_t> Tokens(int n, int64_t vocab, int seed) {
  std::vector<int32_t> t(n);
  uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (int i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t[i] = static_cast<int32_t>(x % static_cast<uint64_t>(vocab));
  }
  return t;
}

// Blocks [first, first + n).
std::vector<int32_t> Blocks(int first, int n) {
  std::vector<int32_t> b(n);
  for (int i = 0; i < n; ++i) b[i] = first + i;
  return b;
}

bool Check(const absl::Status& s) {
  if (!s.ok()) std::fprintf(stderr, "forward failed: %s\n", s.ToString().c_str());
  return s.ok();
}

Result Measure(Model& m, const Args& a) {
  const int bs = m.kv_geometry().block_size;
  const int64_t V = m.config().vocab_size;
  const int blocks_per_seq = (a.prompt + a.decode) / bs + 1;
  Result r;
  std::vector<double> prefill, decode, batched;
  for (int rep = 0; rep < a.repeats; ++rep) {
    // Prefill one sequence.
    ForwardBatch b;
    b.seqs.push_back({1, Tokens(a.prompt, V, rep), 0, Blocks(0, blocks_per_seq), false, false});
    ForwardResult out;
    double t0 = Now();
    if (!Check(m.Forward(b, &out))) return r;
    prefill.push_back(a.prompt / (Now() - t0));
    // Decode it token by token.
    t0 = Now();
    for (int i = 0; i < a.decode; ++i) {
      ForwardBatch d;
      d.seqs.push_back({1, {Tokens(1, V, 100 + i)[0]}, a.prompt + i, Blocks(0, blocks_per_seq),
                        false, false});
      if (!Check(m.Forward(d, &out))) return r;
    }
    decode.push_back(a.decode / (Now() - t0));
    // B sequences with short prompts, decoded together.
    const int short_prompt = std::max(1, a.prompt / 4);
    for (int s = 0; s < a.batch; ++s) {
      ForwardBatch p;
      p.seqs.push_back({s, Tokens(short_prompt, V, 200 + s), 0,
                        Blocks((s + 1) * blocks_per_seq, blocks_per_seq), false, false});
      if (!Check(m.Forward(p, &out))) return r;
    }
    t0 = Now();
    for (int i = 0; i < a.decode; ++i) {
      ForwardBatch d;
      for (int s = 0; s < a.batch; ++s) {
        d.seqs.push_back({s, {Tokens(1, V, 300 + i + s)[0]}, short_prompt + i,
                          Blocks((s + 1) * blocks_per_seq, blocks_per_seq), false, false});
      }
      if (!Check(m.Forward(d, &out))) return r;
    }
    batched.push_back(static_cast<double>(a.decode) * a.batch / (Now() - t0));
  }
  r.prefill_tps = Median(prefill);
  r.decode_tps = Median(decode);
  r.batch_decode_tps = Median(batched);
  return r;
}

KvCacheGeometry Geometry(const Args& a) {
  const int bs = 16;
  return {bs, ((a.prompt + a.decode) / bs + 1) * (a.batch + 1)};
}

void Report(const std::string& name, int threads, const Result& base, const Result& r) {
  std::printf("%-14s %7s %14.1f %14.1f %16.1f\n", name.c_str(), "1", base.prefill_tps,
              base.decode_tps, base.batch_decode_tps);
  std::printf("%-14s %7d %14.1f %14.1f %16.1f   x%.2f / x%.2f / x%.2f\n", name.c_str(), threads,
              r.prefill_tps, r.decode_tps, r.batch_decode_tps, r.prefill_tps / base.prefill_tps,
              r.decode_tps / base.decode_tps, r.batch_decode_tps / base.batch_decode_tps);
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  Args a;
  if (const char* src = std::getenv("GLM_SOURCE_DIR"); src != nullptr) {
    a.golden = std::string(src) + "/tests/golden";
  } else {
    a.golden = "tests/golden";
  }
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--golden") a.golden = next();
    else if (k == "--threads") a.threads = std::atoi(next());
    else if (k == "--prompt") a.prompt = std::atoi(next());
    else if (k == "--decode") a.decode = std::atoi(next());
    else if (k == "--batch") a.batch = std::atoi(next());
    else if (k == "--repeats") a.repeats = std::max(1, std::atoi(next()));
    else if (k == "--synthetic") a.synthetic = true;
    else {
      std::fprintf(stderr,
                   "usage: glm-bench-cpu [--golden DIR] [--threads N] [--prompt P] [--decode D] "
                   "[--batch B] [--repeats R] [--synthetic]\n");
      return 2;
    }
  }
  const int threads = a.threads > 0 ? a.threads
                                    : static_cast<int>(std::thread::hardware_concurrency());
  std::printf("glm-bench-cpu: prompt %d, decode %d, batch %d, repeats %d (median), %u cores\n",
              a.prompt, a.decode, a.batch, a.repeats, std::thread::hardware_concurrency());
  std::printf("%-14s %7s %14s %14s %16s   ratio N/1 threads\n", "model", "threads",
              "prefill tok/s", "decode tok/s", "batch dec tok/s");
  std::vector<std::string> fixtures;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(a.golden, ec)) {
    if (fs::exists(e.path() / "config.json") && e.path().filename().string().rfind("tiny-", 0) == 0) {
      fixtures.push_back(e.path().filename().string());
    }
  }
  std::sort(fixtures.begin(), fixtures.end());
  for (const std::string& f : fixtures) {
    Result res[2];
    const int counts[2] = {1, threads};
    for (int i = 0; i < 2; ++i) {
      ModelLoadOptions o;
      o.model_dir = (fs::path(a.golden) / f).string();
      o.kv = Geometry(a);
      o.num_threads = counts[i];
      auto m = LoadGlmMoeDsa(o);
      if (!m.ok()) {
        std::fprintf(stderr, "%s: %s\n", f.c_str(), m.status().ToString().c_str());
        return 1;
      }
      res[i] = Measure(**m, a);
    }
    Report(f, threads, res[0], res[1]);
  }
  if (a.synthetic) {
    // A mid-size random config: GLM-5 proportions at 1/6 width, 4 layers (1 dense + 3 MoE).
    ModelConfig c = SmallTestConfig(4, 1, /*index_share=*/true);
    c.vocab_size = 16384;
    c.hidden_size = 1024;
    c.intermediate_size = 2048;
    c.moe_intermediate_size = 384;
    c.num_attention_heads = 16;
    c.q_lora_rank = 384;
    c.kv_lora_rank = 128;
    c.qk_nope_head_dim = 64;
    c.qk_rope_head_dim = 32;
    c.v_head_dim = 64;
    c.index_n_heads = 8;
    c.index_head_dim = 64;
    c.index_topk = 64;
    c.n_routed_experts = 16;
    c.num_experts_per_tok = 4;
    c.num_nextn_predict_layers = 0;
    InMemoryWeights w;
    MakeRandomWeights(c, 7, &w);
    Result res[2];
    const int counts[2] = {1, threads};
    for (int i = 0; i < 2; ++i) {
      auto backend = CreateCpuBackend(counts[i]);
      ModelLoadOptions o;
      o.kv = Geometry(a);
      auto m = CreateGlmMoeDsa(c, w, backend.get(), o);
      if (!m.ok()) {
        std::fprintf(stderr, "synthetic: %s\n", m.status().ToString().c_str());
        return 1;
      }
      res[i] = Measure(**m, a);
    }
    Report("synthetic-1k", threads, res[0], res[1]);
  }
  return 0;
}

}  // namespace
}  // namespace glm::engine

int main(int argc, char** argv) { return glm::engine::Main(argc, argv); }
