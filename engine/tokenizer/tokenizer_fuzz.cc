// Fuzz target: arbitrary bytes through Encode, Decode and StreamDecoder on GLM-shaped
// byte-level BPE fixtures (tests/tokenizer/fixtures/glm_like.json, glm_nfc.json). Checks:
//   - decode(encode(x)) == x for valid UTF-8 x (byte-level BPE, no normalizer, no stripping
//     added tokens), == the lossy repair of x otherwise; with the NFC normalizer canonically
//     equivalent to it, and NFC is idempotent;
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

#include "engine/tokenizer/normalizer.h"

#ifndef GLM_TOKENIZER_FUZZ_FIXTURES
#error "GLM_TOKENIZER_FUZZ_FIXTURES must name the fixture directory"
#endif

namespace {

using glm::tokenizer::StreamDecoder;
using glm::tokenizer::Tokenizer;

const Tokenizer* Load(const char* name) {
  auto t = Tokenizer::FromFile(std::string(GLM_TOKENIZER_FUZZ_FIXTURES) + "/" + name);
  if (!t.ok()) {
    std::fprintf(stderr, "tokenizer_fuzz: %s\n", std::string(t.status().message()).c_str());
    std::abort();
  }
  return t->release();
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
  static const Tokenizer* plain = Load("glm_like.json");
  static const Tokenizer* nfc = Load("glm_nfc.json");
  const Tokenizer& tok = *plain;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string repaired = glm::tokenizer::Utf8Lossy(text);

  const std::vector<int32_t> ids = tok.Encode(text);
  const std::string decoded = tok.Decode(ids);
  Check(decoded == repaired, "decode(encode(x)) == x (after lossy repair)");

  const std::string normalized = glm::tokenizer::NormalizeNfc(repaired);
  Check(glm::tokenizer::IsValidUtf8(normalized), "NFC output is valid UTF-8");
  Check(glm::tokenizer::NormalizeNfc(normalized) == normalized, "NFC is idempotent");
  const std::vector<int32_t> nfc_ids = nfc->Encode(text);
  // Pieces between raw added tokens are normalized separately (as the reference does), so the
  // decoded text is canonically equivalent to x rather than equal to NFC(x).
  Check(glm::tokenizer::NormalizeNfc(nfc->Decode(nfc_ids)) == normalized,
        "NFC tokenizer: NFC(decode(encode(x))) == NFC(x)");
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
