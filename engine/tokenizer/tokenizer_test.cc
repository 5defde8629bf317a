#include "engine/tokenizer/tokenizer.h"

#include <string>
#include <thread>
#include <vector>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace glm::tokenizer {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The pre-tokenizer pattern of GLM-4 / GLM-5 tokenizer.json files.
constexpr char kGlmPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Byte-level vocab: the character of byte b has id b; extra tokens get ids from 256.
json ByteVocab() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelEncode(std::string(1, static_cast<char>(b)))] = b;
  return vocab;
}

std::string B(std::string_view text) { return ByteLevelEncode(text); }

// A small GLM-shaped tokenizer: Split(GLM regex, Isolated) + ByteLevel(use_regex=false),
// ByteLevel decoder, GLM special tokens, merges for "hello" and " world".
json GlmLike() {
  json vocab = ByteVocab();
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {B(" "), "w"}, {"o", "r"},
      {B(" w"), "or"}};
  int next = 256;
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merge_list.push_back(a + " " + b);
  }
  json added = json::array();
  for (const char* t : {"<|endoftext|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>"}) {
    added.push_back({{"id", next++}, {"content", t}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", kGlmPattern}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", true},
           {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false},
        {"use_regex", true}}},
      {"decoder",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}}};
}

std::unique_ptr<Tokenizer> Load(const json& j) {
  auto tok = Tokenizer::FromJson(j.dump());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

TEST(TokenizerTest, EncodesWithGlmRegexAndRankedMerges) {
  auto tok = Load(GlmLike());
  ASSERT_NE(tok, nullptr);
  // "hello" -> hello(259); " world" -> Ġw(260) o r -> Ġw or(261) -> Ġwor(262) l d.
  EXPECT_THAT(tok->Encode("hello world"), ElementsAre(259, 262, 'l', 'd'));
  EXPECT_EQ(tok->Decode(tok->Encode("hello world")), "hello world");
  EXPECT_TRUE(tok->Encode("").empty());
}

TEST(TokenizerTest, MergesByRankNotLeftToRight) {
  // "abc" with merges [b c, a b]: rank 0 (b c) wins although (a b) is leftmost.
  json j = GlmLike();
  j["model"]["vocab"]["bc"] = 300;
  j["model"]["vocab"]["ab"] = 301;
  j["model"]["merges"] = json::array({json::array({"b", "c"}), json::array({"a", "b"})});
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("abc"), ElementsAre('a', 300));
  // Legacy "a b" strings give the same model.
  j["model"]["merges"] = json::array({"b c", "a b"});
  auto legacy = Load(j);
  ASSERT_NE(legacy, nullptr);
  EXPECT_THAT(legacy->Encode("abc"), ElementsAre('a', 300));
}

TEST(TokenizerTest, IgnoreMergesTakesWholeWordsFromTheVocab) {
  json j = GlmLike();
  j["model"]["vocab"]["xyz"] = 400;  // reachable only as a whole word (no merges lead to it)
  auto plain = Load(j);
  ASSERT_NE(plain, nullptr);
  EXPECT_THAT(plain->Encode("xyz"), ElementsAre('x', 'y', 'z'));
  j["model"]["ignore_merges"] = true;
  auto ignoring = Load(j);
  ASSERT_NE(ignoring, nullptr);
  EXPECT_THAT(ignoring->Encode("xyz"), ElementsAre(400));
}

TEST(TokenizerTest, AddedTokensAreSplitBeforePreTokenization) {
  auto tok = Load(GlmLike());
  ASSERT_NE(tok, nullptr);
  const int32_t gmask = *tok->TokenToId("[gMASK]");
  const int32_t sop = *tok->TokenToId("<sop>");
  const int32_t user = *tok->TokenToId("<|user|>");
  EXPECT_EQ(gmask, 264);
  EXPECT_THAT(tok->Encode("[gMASK]<sop><|user|>\nhello"),
              ElementsAre(gmask, sop, user, '\n', 259));
  // Not a token without the closing bracket.
  EXPECT_THAT(tok->Encode("[gMASK"), ElementsAre('[', 'g', 'M', 'A', 'S', 'K'));
  EXPECT_EQ(tok->Decode(tok->Encode("[gMASK]<sop>hello")), "[gMASK]<sop>hello");
  EXPECT_EQ(tok->Decode(tok->Encode("[gMASK]<sop>hello"), /*skip_special_tokens=*/true), "hello");
  EXPECT_TRUE(tok->IsSpecialId(gmask));
  EXPECT_FALSE(tok->IsSpecialId(259));
  EXPECT_EQ(tok->IdToToken(sop), "<sop>");
  EXPECT_EQ(tok->IdToToken(259), "hello");
  EXPECT_EQ(tok->IdToToken(99999), std::nullopt);
  EXPECT_EQ(tok->VocabSize(), 256u + 7u + 5u);
  EXPECT_EQ(tok->VocabSize(false), 256u + 7u);
}

TEST(TokenizerTest, LongestAddedTokenWins) {
  json j = GlmLike();
  j["added_tokens"].push_back({{"id", 268}, {"content", "<|user|>x"}, {"special", false},
                               {"normalized", false}});
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("<|user|>xy"), ElementsAre(268, 'y'));
  EXPECT_THAT(tok->Encode("<|user|>y"), ElementsAre(*tok->TokenToId("<|user|>"), 'y'));
}

TEST(TokenizerTest, AddedTokenStripAndSingleWordFlags) {
  json j = GlmLike();
  j["added_tokens"].push_back({{"id", 268}, {"content", "<mask>"}, {"lstrip", true},
                               {"rstrip", true}, {"special", true}, {"normalized", false}});
  j["added_tokens"].push_back({{"id", 269}, {"content", "foo"}, {"single_word", true},
                               {"special", false}, {"normalized", true}});
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  // lstrip/rstrip swallow the white space around the token.
  EXPECT_THAT(tok->Encode("a  <mask>  b"), ElementsAre('a', 268, 'b'));
  // single_word: only when not inside a word (\w as Rust regex: letters, digits, _, marks).
  EXPECT_THAT(tok->Encode("foo"), ElementsAre(269));
  EXPECT_THAT(tok->Encode("a foo."), ElementsAre('a', ' ', 269, '.'));
  EXPECT_THAT(tok->Encode("foobar"), ElementsAre('f', 'o', 'o', 'b', 'a', 'r'));
  EXPECT_THAT(tok->Encode("_foo"), ElementsAre('_', 'f', 'o', 'o'));
  EXPECT_EQ(tok->Encode("\xC3\xA9" "foo").back(), 'o');  // é is a word character
}

TEST(TokenizerTest, AddedTokenIdsFollowTheReferenceAssignment) {
  // A content already in the vocab keeps the vocab id; new contents get vocab_size, +1, ...
  json j = GlmLike();
  j["added_tokens"] = json::array(
      {{{"id", 5}, {"content", "hello"}, {"special", true}, {"normalized", false}},
       {{"id", 999}, {"content", "<new>"}, {"special", true}, {"normalized", false}}});
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->TokenToId("hello"), 259);
  EXPECT_EQ(tok->TokenToId("<new>"), 263);
  EXPECT_THAT(tok->Encode("<new>hello"), ElementsAre(263, 259));
  EXPECT_EQ(tok->Decode({263, 259}, true), "");
}

TEST(TokenizerTest, TemplateProcessingAddsPrefixOnlyWhenAsked) {
  json j = GlmLike();
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "[gMASK]"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "<sop>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens",
       {{"[gMASK]", {{"id", "[gMASK]"}, {"ids", {264}}, {"tokens", {"[gMASK]"}}}},
        {"<sop>", {{"id", "<sop>"}, {"ids", {265}}, {"tokens", {"<sop>"}}}}}}};
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("hello"), ElementsAre(259));
  EXPECT_THAT(tok->Encode("hello", /*add_special_tokens=*/true), ElementsAre(264, 265, 259));
  j["post_processor"] = {{"type", "Sequence"},
                         {"processors", {{{"type", "ByteLevel"}}, j["post_processor"]}}};
  auto seq = Load(j);
  ASSERT_NE(seq, nullptr);
  EXPECT_THAT(seq->Encode("hello", true), ElementsAre(264, 265, 259));
}

TEST(TokenizerTest, ByteLevelPreTokenizerWithGpt2RegexAndPrefixSpace) {
  json j = GlmLike();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  // " hello" is not merged to "hello" (the prefix space stays its own symbol), " world" is.
  EXPECT_THAT(tok->Encode("hello world"), ElementsAre(' ', 259, 262, 'l', 'd'));
  EXPECT_THAT(tok->Encode(" hello"), ElementsAre(' ', 259));
  EXPECT_EQ(tok->Decode(tok->Encode("hello world")), " hello world");
}

TEST(TokenizerTest, RoundTripsArbitraryUnicode) {
  auto tok = Load(GlmLike());
  ASSERT_NE(tok, nullptr);
  for (const std::string& text :
       std::vector<std::string>{"Hello, World! It's 12345 o'clock.\r\n\tTabs  and   spaces   ",
        "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C",  // 你好，世界
        "emoji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD and ZWJ "
        "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9",
        "e\xCC\x81 combining, NEL\xC2\x85, NBSP\xC2\xA0, ideographic\xE3\x80\x80space",
        "I'LL WE'VE they'D", "\n\n\n", "   ", "x", "[gMASK]<sop><|user|>"}) {
    EXPECT_EQ(tok->Decode(tok->Encode(text)), text);
  }
}

TEST(TokenizerTest, InvalidUtf8IsRepairedLikePythonReplace) {
  auto tok = Load(GlmLike());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("ab\xFF\xC3" "cd"),
            tok->Encode("ab\xEF\xBF\xBD\xEF\xBF\xBD" "cd"));
  EXPECT_EQ(tok->Decode(tok->Encode("\xF0\x9F\x98")), "\xEF\xBF\xBD");
}

TEST(TokenizerTest, DecodeRepairsBrokenBytesAndSkipsUnknownIds) {
  auto tok = Load(GlmLike());
  ASSERT_NE(tok, nullptr);
  // 0xE4 0xBD alone (first two bytes of 你) decode to one U+FFFD, like from_utf8_lossy.
  EXPECT_EQ(tok->Decode({0xE4, 0xBD}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok->Decode({'a', -1, 1 << 30, 'b'}), "ab");
}

TEST(TokenizerTest, StreamDecoderHoldsIncompleteCharacters) {
  auto tok = Load(GlmLike());
  ASSERT_NE(tok, nullptr);
  StreamDecoder stream(*tok);
  EXPECT_EQ(stream.Step(0xE4), "");  // 你 = E4 BD A0
  EXPECT_EQ(stream.Step(0xBD), "");
  EXPECT_EQ(stream.pending_bytes(), 2u);
  EXPECT_EQ(stream.Step(0xA0), "\xE4\xBD\xA0");
  EXPECT_EQ(stream.Step(259), "hello");
  // A lead byte followed by ASCII can never complete: U+FFFD right away.
  EXPECT_EQ(stream.Step(0xE4), "");
  EXPECT_EQ(stream.Step('a'), "\xEF\xBF\xBD" "a");
  // Leftovers at the end become U+FFFD, as Decode renders them.
  EXPECT_EQ(stream.Step(0xF0), "");
  EXPECT_EQ(stream.Step(0x9F), "");
  EXPECT_EQ(stream.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.pending_bytes(), 0u);
}

TEST(TokenizerTest, StreamDecoderConcatenationEqualsDecode) {
  auto tok = Load(GlmLike());
  ASSERT_NE(tok, nullptr);
  const std::string text =
      "[gMASK]<sop>h\xC3\xA9llo \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80! hello world";
  std::vector<int32_t> ids = tok->Encode(text);
  ids.insert(ids.begin() + 3, {0xF0, 0x9F});  // an emoji cut short in the middle
  for (bool skip : {false, true}) {
    StreamDecoder stream(*tok, skip);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = stream.Step(id);
      EXPECT_TRUE(IsValidUtf8(piece)) << piece;
      EXPECT_LE(stream.pending_bytes(), 3u);
      streamed += piece;
    }
    streamed += stream.Flush();
    EXPECT_EQ(streamed, tok->Decode(ids, skip));
  }
}

TEST(TokenizerTest, NoDecoderJoinsTokensWithSpaces) {
  json j = GlmLike();
  j["decoder"] = nullptr;
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = tok->Encode("hello world");
  EXPECT_EQ(tok->Decode(ids), "hello \xC4\xA0wor l d");
  StreamDecoder stream(*tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.Step(id);
  EXPECT_EQ(streamed + stream.Flush(), tok->Decode(ids));
}

TEST(TokenizerTest, SplitBehaviours) {
  auto encode_with = [](const char* behavior, bool invert) {
    json j = GlmLike();
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"},
                             {"pattern", {{"String", "-"}}},
                             {"behavior", behavior},
                             {"invert", invert}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false},
                             {"use_regex", false}}}}};
    // Merges that only apply inside one piece show where the pieces are: "a-", "-b", "--".
    j["model"]["vocab"]["a-"] = 500;
    j["model"]["vocab"]["-b"] = 501;
    j["model"]["vocab"]["--"] = 502;
    j["model"]["merges"] = json::array({"a -", "- b", "- -"});
    auto tok = Tokenizer::FromJson(j.dump());
    EXPECT_TRUE(tok.ok()) << tok.status();
    return (*tok)->Encode("a-b--c");
  };
  EXPECT_THAT(encode_with("Removed", false), ElementsAre('a', 'b', 'c'));
  EXPECT_THAT(encode_with("Isolated", false), ElementsAre('a', '-', 'b', '-', '-', 'c'));
  EXPECT_THAT(encode_with("MergedWithPrevious", false), ElementsAre(500, 'b', '-', '-', 'c'));
  EXPECT_THAT(encode_with("MergedWithNext", false), ElementsAre('a', 501, '-', '-', 'c'));
  EXPECT_THAT(encode_with("Contiguous", false), ElementsAre('a', '-', 'b', 502, 'c'));
  // invert: the non-matches are the delimiters.
  EXPECT_THAT(encode_with("Removed", true), ElementsAre('-', '-', '-'));
  EXPECT_THAT(encode_with("Isolated", true), ElementsAre('a', '-', 'b', '-', '-', 'c'));
}

TEST(TokenizerTest, NfcNormalizerComposesBeforeSplitting) {
  json j = GlmLike();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
  // A normalized added token written decomposed matches its composed form.
  j["added_tokens"].push_back({{"id", 268}, {"content", "<e\xCC\x81>"}, {"special", false},
                               {"normalized", true}});
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  // e + U+0301 -> U+00E9 (C3 A9), one letter run with "t".
  EXPECT_EQ(tok->Encode("e\xCC\x81t"), tok->Encode("\xC3\xA9t"));
  EXPECT_THAT(tok->Encode("e\xCC\x81t"), ElementsAre(0xC3, 0xA9, 't'));
  EXPECT_THAT(tok->Encode("<\xC3\xA9>"), ElementsAre(268));
  EXPECT_THAT(tok->Encode("<e\xCC\x81>"), ElementsAre(268));
  EXPECT_EQ(tok->IdToToken(268), "<\xC3\xA9>");
  // The ByteLevel decoder maps U+00E9 (a byte-alphabet character) to byte E9, as the reference
  // does for such added tokens: invalid UTF-8, rendered as U+FFFD.
  EXPECT_EQ(tok->Decode({268}), "<\xEF\xBF\xBD>");
}

TEST(TokenizerTest, UnkAndByteFallback) {
  json j = GlmLike();
  j["pre_tokenizer"] = nullptr;  // raw characters reach the model
  j["decoder"] = nullptr;
  j["model"]["vocab"]["<unk>"] = 600;
  j["model"]["unk_token"] = "<unk>";
  auto unk = Load(j);
  ASSERT_NE(unk, nullptr);
  // U+4F60 is not a vocab character; 'a' is.
  EXPECT_THAT(unk->Encode("\xE4\xBD\xA0\xE4\xBD\xA0" "a"), ElementsAre(600, 600, 'a'));
  j["model"]["fuse_unk"] = true;
  EXPECT_THAT(Load(j)->Encode("\xE4\xBD\xA0\xE4\xBD\xA0" "a"), ElementsAre(600, 'a'));
  j["model"]["vocab"]["<0xE4>"] = 601;
  j["model"]["vocab"]["<0xBD>"] = 602;
  j["model"]["vocab"]["<0xA0>"] = 603;
  j["model"]["byte_fallback"] = true;
  EXPECT_THAT(Load(j)->Encode("\xE4\xBD\xA0" "a"), ElementsAre(601, 602, 603, 'a'));
}

TEST(TokenizerTest, OnigurumaWhiteSpaceSemantics) {
  auto re = Regex::Compile(R"(\s+)", false);
  ASSERT_TRUE(re.ok());
  std::vector<std::pair<size_t, size_t>> m;
  (*re)->FindAll("a\xC2\x85" "b\xE1\xA0\x8E" "c", &m);  // NEL is \s, U+180E is not
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], std::make_pair(size_t{1}, size_t{3}));
  EXPECT_EQ(TranslateOnigurumaPattern(R"([^\s\p{L}])").find("\\s"), std::string::npos);
  // \h is a hex digit in Oniguruma; \w includes marks and all numbers.
  auto hex = Regex::Compile(R"(\h+)", false);
  ASSERT_TRUE(hex.ok());
  m.clear();
  (*hex)->FindAll("zz0aF9 g", &m);
  EXPECT_THAT(m, ElementsAre(std::make_pair(size_t{2}, size_t{6})));
  auto word = Regex::Compile(R"(\w+)", false);
  ASSERT_TRUE(word.ok());
  m.clear();
  (*word)->FindAll("e\xCC\x81\xC2\xB2 -", &m);  // e + combining acute + superscript two (No)
  EXPECT_THAT(m, ElementsAre(std::make_pair(size_t{0}, size_t{5})));
  // Empty matches advance one character at a time, like onig's find_iter.
  auto empty = Regex::Compile("x*", false);
  ASSERT_TRUE(empty.ok());
  m.clear();
  (*empty)->FindAll("a\xC3\xA9xx", &m);
  EXPECT_THAT(m, ElementsAre(std::make_pair(size_t{0}, size_t{0}),
                             std::make_pair(size_t{1}, size_t{1}),
                             std::make_pair(size_t{3}, size_t{5})));
}

TEST(TokenizerTest, LongInputsDoNotBlowUp) {
  auto tok = Load(GlmLike());
  ASSERT_NE(tok, nullptr);
  for (const std::string& text : {std::string(1 << 20, ' '), std::string(1 << 20, '\n'),
                                  std::string(1 << 18, 'a'), std::string(1 << 18, '!'),
                                  std::string(100000, ' ') + "x" + std::string(100000, '\t')}) {
    EXPECT_EQ(tok->Decode(tok->Encode(text)), text);
  }
}

TEST(TokenizerTest, ConcurrentEncodesAgree) {
  auto tok = Load(GlmLike());
  ASSERT_NE(tok, nullptr);
  const std::string text = "hello world, [gMASK] h\xC3\xA9llo \xE4\xBD\xA0\xE5\xA5\xBD 12345 ";
  std::string big;
  for (int i = 0; i < 200; ++i) big += text + std::to_string(i);
  const std::vector<int32_t> expected = tok->Encode(big);
  std::vector<std::thread> threads;
  std::vector<bool> same(4, false);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] { same[t] = tok->Encode(big) == expected; });
  }
  for (auto& th : threads) th.join();
  for (bool s : same) EXPECT_TRUE(s);
}

TEST(TokenizerTest, RejectsBrokenOrUnsupportedFilesWithTheField) {
  auto error = [](const json& j) {
    auto tok = Tokenizer::FromJson(j.dump());
    return tok.ok() ? std::string("ok") : std::string(tok.status().message());
  };
  EXPECT_THAT(std::string(Tokenizer::FromJson("{not json").status().message()),
              HasSubstr("not valid JSON"));
  json j = GlmLike();
  j.erase("model");
  EXPECT_THAT(error(j), HasSubstr("/model"));
  j = GlmLike();
  j["model"]["merges"].push_back("h zz");
  EXPECT_THAT(error(j), HasSubstr("\"zz\" that is not in the vocab"));
  j = GlmLike();
  j["model"]["merges"].push_back("a b c");
  EXPECT_THAT(error(j), HasSubstr("/model/merges/7"));
  j = GlmLike();
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_THAT(error(j), HasSubstr("/normalizer"));
  j = GlmLike();
  j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Metaspace"}};
  EXPECT_THAT(error(j), HasSubstr("/pre_tokenizer/pretokenizers/1"));
  j = GlmLike();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_THAT(error(j), HasSubstr("does not compile"));
  j = GlmLike();
  j["model"]["type"] = "WordPiece";
  EXPECT_THAT(error(j), HasSubstr("/model/type"));
  j = GlmLike();
  j["decoder"] = {{"type", "Metaspace"}};
  EXPECT_THAT(error(j), HasSubstr("/decoder"));
  j = GlmLike();
  j["model"]["dropout"] = 0.1;
  EXPECT_THAT(error(j), HasSubstr("dropout"));
  EXPECT_THAT(std::string(Tokenizer::FromFile("/nonexistent/tokenizer.json").status().message()),
              HasSubstr("cannot open"));
}

}  // namespace
}  // namespace glm::tokenizer
