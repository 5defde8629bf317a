// Fuzz target: arbitrary bytes through Encode, Decode and StreamDecoder on a GLM-shaped
// byte-level BPE fixture (tests/tokenizer/fixtures/glm_like.json). Checks:
//   - decode(encode(x)) == x for valid UTF-8 x (byte-level BPE, no normalizer, no stripping
//     added tokens), == the lossy repair of x otherwise;
//   - streaming every id and flushing gives exactly Decode(ids), and every streamed piece is
//     valid UTF-8;
//   - arbitrary ids (the input reinterpreted as int32) decode to valid UTF-8 without crashing.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

#ifndef GLM_TOKENIZER_FUZZ_FIXTURE
#error "GLM_TOKENIZER_FUZZ_FIXTURE must name the fixture tokenizer.json"
#endif

namespace {

using glm::tokenizer::StreamDecoder;
using glm::tokenizer::Tokenizer;

const Tokenizer& Get() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::FromFile(GLM_TOKENIZER_FUZZ_FIXTURE);
    if (!t.ok()) {
      std::fprintf(stderr, "tokenizer_fuzz: %s\n", std::string(t.status().message()).c_str());
      std::abort();
    }
    return t->release();
  }();
  return *tok;
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "tokenizer_fuzz: check failed: %s\n", what);
    std::abort();
  }
}

void CheckStream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  StreamDecoder stream(tok, skip);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = stream.Step(id);
    Check(glm::tokenizer::IsValidUtf8(piece), "streamed piece is valid UTF-8");
    Check(stream.pending_bytes() <= 3, "at most 3 bytes held back");
    streamed += piece;
  }
  const std::string tail = stream.Flush();
  Check(glm::tokenizer::IsValidUtf8(tail), "flushed tail is valid UTF-8");
  streamed += tail;
  Check(streamed == tok.Decode(ids, skip), "stream concatenation equals Decode");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& tok = Get();
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  const std::vector<int32_t> ids = tok.Encode(text);
  const std::string decoded = tok.Decode(ids);
  if (glm::tokenizer::IsValidUtf8(text)) {
    Check(decoded == text, "decode(encode(x)) == x");
  } else {
    Check(decoded == glm::tokenizer::Utf8Lossy(text), "decode(encode(x)) == lossy(x)");
  }
  const std::vector<int32_t> with_special = tok.Encode(text, /*add_special_tokens=*/true);
  Check(with_special.size() >= ids.size(), "templates only add ids");
  CheckStream(tok, ids, false);
  CheckStream(tok, ids, true);

  // The same bytes as raw ids (any value, in or out of the vocab).
  std::vector<int32_t> raw(size / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * 4);
  for (int32_t& id : raw) id %= static_cast<int32_t>(tok.MaxIdPlusOne() + 16);
  Check(glm::tokenizer::IsValidUtf8(tok.Decode(raw)), "decode of any ids is valid UTF-8");
  CheckStream(tok, raw, false);
  return 0;
}
