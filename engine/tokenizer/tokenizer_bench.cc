// Encode/decode throughput of glm_tokenizer on a text corpus (a program, not a test: no timing
// is asserted anywhere).
//   tokenizer_bench --tokenizer tokenizer.json --corpus corpus.txt [--repeat N] [--threads T]
// Prints encode MB/s and tokens/s (single thread, warm and cold word cache), the same with T
// threads, and decode / stream-decode rates.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

int Usage() {
  std::fprintf(stderr,
               "usage: tokenizer_bench --tokenizer FILE --corpus FILE [--repeat N] "
               "[--threads T]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path;
  std::string corpus_path;
  int repeat = 20;
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokenizer") {
      tokenizer_path = argv[i + 1];
    } else if (flag == "--corpus") {
      corpus_path = argv[i + 1];
    } else if (flag == "--repeat") {
      repeat = std::atoi(argv[i + 1]);
    } else if (flag == "--threads") {
      threads = std::atoi(argv[i + 1]);
    } else {
      return Usage();
    }
  }
  if (tokenizer_path.empty() || corpus_path.empty() || repeat < 1 || threads < 1) return Usage();

  auto start = Clock::now();
  auto tok = glm::tokenizer::Tokenizer::FromFile(tokenizer_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  std::printf("load: %.3f s, vocab %zu\n", Seconds(start), (*tok)->VocabSize());

  std::ifstream in(corpus_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot open corpus %s\n", corpus_path.c_str());
    return 1;
  }
  std::vector<std::string> lines;
  size_t bytes = 0;
  for (std::string line; std::getline(in, line);) {
    bytes += line.size() + 1;
    lines.push_back(line + "\n");
  }
  std::printf("corpus: %zu lines, %.2f MB\n", lines.size(), bytes / 1e6);

  // Cold: the first pass fills the word cache.
  size_t num_tokens = 0;
  start = Clock::now();
  std::vector<std::vector<int32_t>> encoded;
  for (const std::string& line : lines) {
    encoded.push_back((*tok)->Encode(line));
    num_tokens += encoded.back().size();
  }
  double s = Seconds(start);
  std::printf("encode cold (1 thread): %.2f MB/s, %.0f tokens/s, %zu tokens\n", bytes / 1e6 / s,
              num_tokens / s, num_tokens);

  start = Clock::now();
  for (int r = 0; r < repeat; ++r) {
    for (const std::string& line : lines) (*tok)->Encode(line);
  }
  s = Seconds(start);
  std::printf("encode warm (1 thread): %.2f MB/s, %.0f tokens/s\n", bytes * repeat / 1e6 / s,
              num_tokens * repeat / s);

  start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int r = 0; r < repeat; ++r) {
        for (const std::string& line : lines) (*tok)->Encode(line);
      }
    });
  }
  for (auto& th : pool) th.join();
  s = Seconds(start);
  std::printf("encode warm (%d threads): %.2f MB/s total\n", threads,
              bytes * repeat * threads / 1e6 / s);

  start = Clock::now();
  for (int r = 0; r < repeat; ++r) {
    for (const auto& ids : encoded) (*tok)->Decode(ids);
  }
  s = Seconds(start);
  std::printf("decode: %.2f MB/s, %.0f tokens/s\n", bytes * repeat / 1e6 / s,
              num_tokens * repeat / s);

  start = Clock::now();
  for (int r = 0; r < repeat; ++r) {
    glm::tokenizer::StreamDecoder stream(**tok);
    for (const auto& ids : encoded) {
      for (int32_t id : ids) stream.Step(id);
    }
    stream.Flush();
  }
  s = Seconds(start);
  std::printf("stream decode: %.0f tokens/s (%.0f ns/token)\n", num_tokens * repeat / s,
              s * 1e9 / (num_tokens * repeat));
  return 0;
}
