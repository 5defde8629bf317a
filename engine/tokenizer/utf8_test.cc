#include "engine/tokenizer/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace glm::tokenizer {
namespace {

const std::string kR = "\xEF\xBF\xBD";  // U+FFFD

// Expected values are what Python's bytes.decode("utf-8", "replace") returns (identical to
// Rust's String::from_utf8_lossy): one U+FFFD per maximal ill-formed subpart.
TEST(Utf8Test, LossyMatchesPythonReplace) {
  EXPECT_EQ(Utf8Lossy("abc"), "abc");
  EXPECT_EQ(Utf8Lossy("\xE2\x82"), kR);                        // truncated 3-byte sequence
  EXPECT_EQ(Utf8Lossy("\xE2\x82" "a"), kR + "a");
  EXPECT_EQ(Utf8Lossy("\xE0\x80"), kR + kR);                   // E0 needs A0..BF next
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"), kR);                    // truncated emoji
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), kR + kR + kR);          // surrogate
  EXPECT_EQ(Utf8Lossy("\xC0\xAF"), kR + kR);                   // overlong
  EXPECT_EQ(Utf8Lossy("\xF4\x90\x80\x80"), kR + kR + kR + kR);  // > U+10FFFF
  EXPECT_EQ(Utf8Lossy("\xFF" "a\x80"), kR + "a" + kR);
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(Utf8Test, Validity) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("h\xC3\xA9llo \xE4\xBD\xA0 \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));
  EXPECT_FALSE(IsValidUtf8("\xF5\x80\x80\x80"));
}

TEST(Utf8Test, IncompleteTail) {
  EXPECT_EQ(IncompleteTailStart(""), 0u);
  EXPECT_EQ(IncompleteTailStart("ab"), 2u);
  EXPECT_EQ(IncompleteTailStart("a\xF0"), 1u);
  EXPECT_EQ(IncompleteTailStart("a\xF0\x9F"), 1u);
  EXPECT_EQ(IncompleteTailStart("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(IncompleteTailStart("a\xF0\x9F\x98\x80"), 5u);  // complete
  EXPECT_EQ(IncompleteTailStart("a\xE0\x80"), 3u);          // can never complete
  EXPECT_EQ(IncompleteTailStart("a\x80\x80"), 3u);          // stray continuations
  EXPECT_EQ(IncompleteTailStart("\xC3\xA9\xE4"), 2u);
}

TEST(Utf8Test, WhiteSpaceIsTheUnicodeProperty) {
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u,
                      0x200Au, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u}) {
    EXPECT_TRUE(IsWhiteSpace(cp)) << cp;
  }
  for (uint32_t cp : {0x08u, 0x1Cu, 0x180Eu, 0x200Bu, 0xFEFFu, 0x41u}) {
    EXPECT_FALSE(IsWhiteSpace(cp)) << cp;
  }
}

}  // namespace
}  // namespace glm::tokenizer
