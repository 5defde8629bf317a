#include "engine/tokenizer/normalizer.h"

#include <string>

#include "gtest/gtest.h"

namespace glm::tokenizer {
namespace {

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// {input, NFC} as UTF-8 hex, from Python's unicodedata.normalize("NFC", ...) (Unicode 14.0):
// composition, Hangul, reordering of marks, singletons (U+212B), excluded composites (U+0344,
// U+F900), blocked pairs, leading non-starters, and random strings over a tricky alphabet.
constexpr const char* kCases[][2] = {
{"65cc81", "c3a9"},
{"e18480e185a1e186a8", "eab081"},
{"61cca8cc81", "c485cc81"},
{"61cc81cca8", "c485cc81"},
{"e284ab", "c385"},
{"cd84", "cc88cc81"},
{"cc8161", "cc8161"},
{"c385cc81", "c7ba"},
{"ed959ce186a8", "ed959ce186a8"},
{"e0a495e0a4bc", "e0a495e0a4bc"},
{"c3a9cc81cc80", "c3a9cc81cc80"},
{"41cc8acca3", "e1baa0cc8a"},
{"41cc83cc82cca3cc9b", "e1baa0cc9bcc83cc82"},
{"e1ba9bcca3", "e1ba9bcca3"},
{"efa480", "e8b188"},
{"e284a6", "cea9"},
{"cc81e185a1e0a4bc61c3a920", "cc81e185a1e0a4bc61c3a920"},
{"e18480e284ab", "e18480c385"},
{"e38299", "e38299"},
{"61c3a9e186a8e186a8", "61c3a9e186a8e186a8"},
{"cca3c3a9", "cca3c3a9"},
{"6120e284abcc80cca3e0a4bce0a4bc", "6120e1baa0e0a4bce0a4bccc8acc80"},
{"e284ab", "c385"},
{"61cca361e3818bcc81ccb1e186a8", "e1baa161e3818bccb1cc81e186a8"},
{"e3818bcc80e284ab", "e3818bcc80c385"},
{"e3818b20e0bdb3cc82cc80", "e3818b20e0bdb1e0bdb2cc82cc80"},
{"e18480cc80e3818be0bdb1", "e18480cc80e3818be0bdb1"},
{"e284ab61", "c38561"},
{"eab081e0bdb3e3818be186a8", "eab081e0bdb1e0bdb2e3818be186a8"},
{"eab080e284abeab080e18480ccb1cca3", "eab080c385eab080e18480ccb1cca3"},
{"e0bdb1e1b88ccca3", "e0bdb1e1b88ccca3"},
{"e284abccb1", "c385ccb1"},
{"cd85e0bdb2eab080ccb1e0a495c3a9cc80e38299", "e0bdb2cd85eab080ccb1e0a495c3a9e38299cc80"},
{"cc82e1b88ccd85cc81eab081e186a861", "cc82e1b88ccc81cd85eab081e186a861"},
{"e1b88ce3818b", "e1b88ce3818b"},
{"cd85e0bdb1e18480e0a495eab081e284ab", "e0bdb1cd85e18480e0a495eab081c385"},
{"c3a920c3a9cca8eab081e0bdb1e0bdb3c3a9", "c3a920c499cc81eab081e0bdb1e0bdb1e0bdb2c3a9"},
{"e0bdb2", "e0bdb2"},
{"e0a4bce284abe0bdb320eab080", "e0a4bcc385e0bdb1e0bdb220eab080"},
{"e0bdb1e185a1e0bdb3e1848041", "e0bdb1e185a1e0bdb1e0bdb2e1848041"},
{"e18480cc82e0a495cc80eab08161cc88e1b88c", "e18480cc82e0a495cc80eab081c3a4e1b88c"},
{"cc81e0bdb2cca3e185a1e185a1", "e0bdb2cca3cc81e185a1e185a1"},
{"c3a9cc82eab080e185a1e3818bcca8cc8120", "c3a9cc82eab080e185a1e3818bcca8cc8120"},
{"e3818bcca8e0bdb1e186a8e18480e0bdb3e185a1", "e3818be0bdb1cca8e186a8e18480e0bdb1e0bdb2e185a1"},
{"cc81c3a9cc82cc81", "cc81c3a9cc82cc81"},
{"e0bdb3cca341eab081", "e0bdb1e0bdb2cca341eab081"},
{"cca8ccb141", "cca8ccb141"},
{"e186a8e3818be18480", "e186a8e3818be18480"},
{"cc81e0bdb1e38299e0a495e0a4bce0bdb3", "e38299e0bdb1cc81e0a495e0a4bce0bdb1e0bdb2"},
{"eab080", "eab080"},
{"e185a1e185a1e185a1cc80eab081e0a4bce185a1", "e185a1e185a1e185a1cc80eab081e0a4bce185a1"},
{"cc88", "cc88"},
{"cc88eab080", "cc88eab080"},
{"cc80cd85e0a495", "cc80cd85e0a495"},
{"cc80", "cc80"},
{"e284ab", "c385"},
};

TEST(NfcTest, MatchesPythonUnicodedata) {
  for (const auto& c : kCases) {
    EXPECT_EQ(NormalizeNfc(FromHex(c[0])), FromHex(c[1])) << c[0];
  }
}

TEST(NfcTest, AsciiAndLatin1AreUnchanged) {
  EXPECT_TRUE(IsTriviallyNfc("plain ASCII \xC3\xA9"));
  EXPECT_FALSE(IsTriviallyNfc("e\xCC\x81"));
  EXPECT_EQ(NormalizeNfc(""), "");
  EXPECT_EQ(NormalizeNfc("h\xC3\xA9llo"), "h\xC3\xA9llo");
}

}  // namespace
}  // namespace glm::tokenizer
