// The golden fixtures (tests/golden: tiny checkpoints with transformers' reference prompt logits
// and greedy ids) as the engine's golden tests read them. Test-only and header-only: the
// including target defines GLM_GOLDEN_DIR (the fixtures' build-time path); the environment
// variable GLM_GOLDEN_DIR overrides it (a build staged onto another machine).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "nlohmann/json.hpp"

namespace glm::engine::golden {

struct Case {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
};

struct Fixture {
  std::string name;
  std::string dir;
  std::vector<Case> cases;  // reference.json's prompt_ids / greedy_ids first, then extra_cases
  bool fp8 = false;         // config.json has an fp8 quantization_config
  bool quantized = false;   // INT4 / INT8 / NVFP4 weights (compressed-tensors or ModelOpt)
  const Case& main() const { return cases.front(); }
  std::span<const Case> extra() const { return std::span<const Case>(cases).subspan(1); }
};

inline std::string Dir() {
  const char* env = std::getenv("GLM_GOLDEN_DIR");
  return env != nullptr && *env != '\0' ? env : GLM_GOLDEN_DIR;
}

// Every fixture directory with a config.json and a reference.json holding prompt_ids and
// greedy_ids, sorted by name.
inline std::vector<Fixture> LoadFixtures() {
  namespace fs = std::filesystem;
  std::vector<Fixture> out;
  for (const auto& entry : fs::directory_iterator(Dir())) {
    const fs::path ref = entry.path() / "reference.json";
    if (!entry.is_directory() || !fs::exists(ref) || !fs::exists(entry.path() / "config.json")) {
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(ref));
    if (!j.contains("prompt_ids") || !j.contains("greedy_ids")) continue;
    Fixture fx;
    fx.name = entry.path().filename().string();
    fx.dir = entry.path().string();
    fx.cases.push_back({j["prompt_ids"].get<std::vector<int32_t>>(),
                        j["greedy_ids"].get<std::vector<int32_t>>()});
    if (j.contains("extra_cases")) {
      for (const auto& c : j["extra_cases"]) {
        fx.cases.push_back({c["prompt_ids"].get<std::vector<int32_t>>(),
                            c["greedy_ids"].get<std::vector<int32_t>>()});
      }
    }
    const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(entry.path() / "config.json"));
    const std::string method = cfg.contains("quantization_config")
                                   ? cfg["quantization_config"].value("quant_method", "")
                                   : "";
    fx.fp8 = method == "fp8";
    fx.quantized = method == "compressed-tensors" || method == "modelopt";
    out.push_back(std::move(fx));
  }
  std::sort(out.begin(), out.end(),
            [](const Fixture& a, const Fixture& b) { return a.name < b.name; });
  return out;
}

// A raw little-endian float32 file (logits.f32).
inline std::vector<float> ReadF32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// max |a - b| / max |b| over b's elements (b is the reference; a has at least as many).
inline double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - b[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(b[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

// A greedy request for max_tokens tokens that does not stop at EOS (the references don't).
inline Request GreedyRequest(const std::vector<int32_t>& prompt, int max_tokens) {
  Request r;
  r.prompt_ids = prompt;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

}  // namespace glm::engine::golden
