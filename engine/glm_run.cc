// glm-run: run one request through the engine from the command line.
//
//   glm-run --model DIR --tokens 1,2,3 [--max-tokens N] [--dump-logits FILE] [--mtp K]
//           [--prompt TEXT] [--temperature T --top-p P --top-k K --seed S]
//           [--backend cpu|cuda|auto] [--device N] [--dtype fp32|bf16|auto]
//           [--cuda-graphs on|off] [--gpu-memory-fraction F] [--report-memory]
//           [--kv-dtype fp32|fp8]
//
// The last line on stdout is the generated token ids, comma-separated. --dump-logits writes the
// logits of every prompt position as float32 little-endian, row-major
// [num_prompt_tokens, vocab_size]. --prompt tokenizes TEXT with DIR/tokenizer.json and also
// prints the generated text (streamed) on the line before the ids. Stats go to stderr.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "engine/engine.h"
#if GLM_RUN_HAVE_TOKENIZER
#include "engine/tokenizer/tokenizer.h"
#endif

namespace {

absl::Status ParseTokenList(const std::string& text, std::vector<int32_t>* out) {
  for (absl::string_view piece : absl::StrSplit(glm::ToAbsl(text), ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens: '", piece,
                                                     "' is not an integer token id (use 1,2,3)"));
    }
    out->push_back(id);
  }
  if (out->empty()) return absl::InvalidArgumentError("--tokens is empty: give ids like 1,2,3");
  return absl::OkStatus();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "glm-run: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"glm-run: run a GlmMoeDsa checkpoint on the engine (cpu or cuda backend)"};
  glm::engine::EngineOptions opts;
  std::string tokens_text, prompt_text, dump_logits, log_level = "warn";
  glm::engine::SamplingParams sp;
  sp.max_tokens = 32;
  int64_t seed = -1;
  int64_t kv_mib = 0;
  app.add_option("--model", opts.model_dir, "model directory (config.json, *.safetensors)")
      ->required();
  auto* tok_opt = app.add_option("--tokens", tokens_text, "prompt token ids, comma-separated");
  auto* prompt_opt =
      app.add_option("--prompt", prompt_text, "prompt text (tokenized with DIR/tokenizer.json)");
  tok_opt->excludes(prompt_opt);
  app.add_option("--max-tokens", sp.max_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--dump-logits", dump_logits,
                 "write prompt logits, float32 LE [num_prompt_tokens, vocab_size]");
  app.add_option("--mtp", opts.mtp_draft_tokens, "MTP speculative decoding: draft tokens per step")
      ->capture_default_str();
  app.add_option("--temperature", sp.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-p", sp.top_p)->capture_default_str();
  app.add_option("--top-k", sp.top_k, "0 = off")->capture_default_str();
  app.add_option("--seed", seed, "sampling seed");
  app.add_option("--min-tokens", sp.min_tokens)->capture_default_str();
  app.add_flag("--ignore-eos", sp.ignore_eos, "do not stop at the model's EOS tokens");
  app.add_option("--threads", opts.num_threads, "CPU threads (0 = all)")->capture_default_str();
  app.add_option("--backend", opts.backend,
                 "cpu, cuda, or auto (cuda when built with it and a GPU is usable)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  app.add_option("--device", opts.device, "CUDA device ordinal")->capture_default_str();
  app.add_option("--dtype", opts.weight_dtype,
                 "Linear weight storage: fp32, bf16, or auto (fp8 checkpoints keep e4m3 + block "
                 "scales, else bf16); cpu and cuda")
      ->check(CLI::IsMember({"fp32", "bf16", "auto"}))
      ->capture_default_str();
  app.add_option("--kv-dtype", opts.kv_dtype,
                 "KV cache storage: fp32, or fp8 (656-byte MLA latent + 132-byte indexer key "
                 "rows per token and layer at GLM-5 widths)")
      ->check(CLI::IsMember({"fp32", "fp8"}))
      ->capture_default_str();
  std::string cuda_graphs = "on";
  bool report_memory = false;
  app.add_option("--cuda-graphs", cuda_graphs, "decode steps as CUDA graphs (cuda backend)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--gpu-memory-fraction", opts.gpu_memory_fraction,
                 "size the KV cache from this fraction of the GPU's memory (cuda; overrides "
                 "--kv-mib and the per-request default)");
  app.add_flag("--report-memory", report_memory,
               "print the memory plan (weights / activations / KV bytes / blocks / max tokens) "
               "and the decode-graph counters to stderr");
  app.add_option("--kv-mib", kv_mib,
                 "KV cache budget in MiB (default: just enough blocks for this request)");
  app.add_option("--block-size", opts.kv_block_size)->capture_default_str();
  app.add_option("--max-batched-tokens", opts.max_num_batched_tokens, "per-step token budget")
      ->capture_default_str();
  app.add_option("--log-level", log_level)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  glm::InitLogging("glm-run", glm::ParseLogLevel(log_level));
  opts.kv_cache_bytes = kv_mib << 20;
  opts.cuda_graphs = cuda_graphs == "on";
  opts.max_num_batched_tokens = std::max(opts.max_num_batched_tokens, 1 + opts.mtp_draft_tokens);
  if (seed >= 0) sp.seed = static_cast<uint64_t>(seed);

  glm::engine::Request req;
  req.sampling = sp;
  req.return_prompt_logits = !dump_logits.empty();
#if GLM_RUN_HAVE_TOKENIZER
  std::unique_ptr<glm::tokenizer::Tokenizer> tokenizer;
#endif
  if (!prompt_text.empty()) {
#if GLM_RUN_HAVE_TOKENIZER
    auto t = glm::tokenizer::Tokenizer::FromFile(opts.model_dir + "/tokenizer.json");
    if (!t.ok()) return Fail(t.status());
    tokenizer = std::move(*t);
    req.prompt_ids = tokenizer->Encode(prompt_text, /*add_special_tokens=*/false);
#else
    return Fail(absl::UnimplementedError("--prompt needs glm_tokenizer, absent from this build"));
#endif
  } else if (!tokens_text.empty()) {
    if (absl::Status s = ParseTokenList(tokens_text, &req.prompt_ids); !s.ok()) return Fail(s);
  } else {
    return Fail(absl::InvalidArgumentError("give --tokens 1,2,3 or --prompt TEXT"));
  }
  const size_t num_prompt = req.prompt_ids.size();
  if (kv_mib <= 0 && opts.kv_block_size > 0 && opts.gpu_memory_fraction <= 0) {
    const int64_t positions =
        static_cast<int64_t>(num_prompt) + sp.max_tokens + 2 * std::max(opts.mtp_draft_tokens, 0);
    opts.kv_num_blocks = static_cast<int>((positions + opts.kv_block_size - 1) / opts.kv_block_size);
  }

  auto engine = glm::engine::Engine::Create(opts);
  if (!engine.ok()) return Fail(engine.status());
  if (report_memory) {
    const glm::engine::MemoryPlan mp = (*engine)->memory_plan();
    std::fprintf(stderr, "glm-run: memory plan: %s\n", mp.ToString().c_str());
    std::fprintf(stderr, "glm-run: kv cache: dtype=%s bytes_per_token=%lld\n",
                 opts.kv_dtype.c_str(),
                 static_cast<long long>(mp.kv_block_size > 0
                                            ? mp.kv_bytes_per_block / mp.kv_block_size
                                            : 0));
  }
  auto handle = (*engine)->Submit(std::move(req));
  if (!handle.ok()) return Fail(handle.status());

#if GLM_RUN_HAVE_TOKENIZER
  std::unique_ptr<glm::tokenizer::StreamDecoder> decoder;
  if (tokenizer) decoder = std::make_unique<glm::tokenizer::StreamDecoder>(*tokenizer);
#endif
  std::vector<int32_t> generated;
  glm::engine::TokenEvent ev;
  glm::engine::TokenEvent last;
  while (handle->stream->Next(&ev)) {
    if (!ev.prompt_logits.empty()) {
      const int64_t vocab = (*engine)->model_config().vocab_size;
      if (static_cast<int64_t>(ev.prompt_logits.size()) != static_cast<int64_t>(num_prompt) * vocab) {
        return Fail(absl::InternalError("prompt logits have the wrong size"));
      }
      std::ofstream f(dump_logits, std::ios::binary);
      f.write(reinterpret_cast<const char*>(ev.prompt_logits.data()),
              static_cast<std::streamsize>(ev.prompt_logits.size() * sizeof(float)));
      if (!f) return Fail(absl::UnavailableError("cannot write --dump-logits file " + dump_logits));
    }
    if (ev.token_id >= 0) {
      generated.push_back(ev.token_id);
#if GLM_RUN_HAVE_TOKENIZER
      if (decoder) {
        std::cout << decoder->Step(ev.token_id) << std::flush;
      }
#endif
    }
    if (ev.finished) last = ev;
  }
#if GLM_RUN_HAVE_TOKENIZER
  if (decoder) std::cout << decoder->Flush() << "\n";
#endif
  if (last.finish_reason == glm::engine::FinishReason::kError) return Fail(last.error);
  const glm::engine::EngineStats st = (*engine)->Stats();
  std::fprintf(stderr,
               "glm-run: prompt_tokens=%zu generated=%zu finish=%s steps=%lld "
               "draft_tokens=%lld accepted=%lld acceptance_rate=%.3f\n",
               num_prompt, generated.size(),
               std::string(glm::engine::FinishReasonName(last.finish_reason)).c_str(),
               static_cast<long long>(st.num_steps), static_cast<long long>(st.num_draft_tokens),
               static_cast<long long>(st.num_accepted_draft_tokens), st.draft_acceptance_rate);
  if (report_memory) {
    const glm::engine::DecodeGraphStats gs = (*engine)->decode_graph_stats();
    std::fprintf(stderr,
                 "glm-run: decode graphs: decode_steps=%lld eager=%lld captures=%lld "
                 "replays=%lld invalidations=%lld\n",
                 static_cast<long long>(gs.decode_steps), static_cast<long long>(gs.eager_steps),
                 static_cast<long long>(gs.captures), static_cast<long long>(gs.replays),
                 static_cast<long long>(gs.invalidations));
  }
  std::cout << absl::StrJoin(generated, ",") << std::endl;
  return 0;
}
