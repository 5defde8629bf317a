#include "controller/gateway/openai/stop_matcher.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace glm::openai {
namespace {

struct Outcome {
  std::string text;
  bool stopped = false;
  std::string matched;
  bool operator==(const Outcome&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  return os << "{text=\"" << o.text << "\" stopped=" << o.stopped << " matched=\"" << o.matched
            << "\"}";
}

Outcome Run(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher matcher(stops);
  Outcome outcome;
  for (const std::string& piece : pieces) {
    StopMatcher::Result result = matcher.Feed(piece);
    outcome.text += result.text;
    if (result.stopped) {
      EXPECT_FALSE(outcome.stopped) << "reported twice";
      outcome.stopped = true;
    }
  }
  outcome.text += matcher.Flush();
  EXPECT_TRUE(!outcome.stopped || matcher.stopped());
  outcome.stopped = matcher.stopped();
  outcome.matched = matcher.matched();
  return outcome;
}

// The outcome for `text` whole, after checking that every split into one-byte pieces, two
// pieces at every position, and three pieces gives the same.
Outcome RunEverySplit(const std::vector<std::string>& stops, const std::string& text) {
  Outcome whole = Run(stops, {text});
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(Run(stops, bytes), whole) << "byte by byte";
  for (size_t i = 0; i <= text.size(); ++i) {
    EXPECT_EQ(Run(stops, {text.substr(0, i), text.substr(i)}), whole) << "cut at " << i;
    for (size_t j = i; j <= text.size(); ++j) {
      EXPECT_EQ(Run(stops, {text.substr(0, i), text.substr(i, j - i), text.substr(j)}), whole)
          << "cuts at " << i << ", " << j;
    }
  }
  return whole;
}

TEST(StopMatcherTest, StopsBeforeTheStopString) {
  EXPECT_EQ(RunEverySplit({"END"}, "hello END world"), (Outcome{"hello ", true, "END"}));
  EXPECT_EQ(RunEverySplit({"\n\n"}, "line1\nline2\n\nline3"), (Outcome{"line1\nline2", true, "\n\n"}));
  EXPECT_EQ(RunEverySplit({"END"}, "END"), (Outcome{"", true, "END"}));
}

TEST(StopMatcherTest, NoMatchReleasesEverything) {
  EXPECT_EQ(RunEverySplit({"END"}, "the EN"), (Outcome{"the EN", false, ""}));
  EXPECT_EQ(RunEverySplit({}, "anything"), (Outcome{"anything", false, ""}));
  EXPECT_EQ(RunEverySplit({""}, "empty stops are ignored"),
            (Outcome{"empty stops are ignored", false, ""}));
}

TEST(StopMatcherTest, FirstMatchInTheTextWins) {
  EXPECT_EQ(RunEverySplit({"world", "lo"}, "hello world"), (Outcome{"hel", true, "lo"}));
  // Overlapping stop strings: the earliest start wins however the text arrives.
  EXPECT_EQ(RunEverySplit({"abcd", "c"}, "xabcdy"), (Outcome{"x", true, "abcd"}));
  EXPECT_EQ(RunEverySplit({"abcd", "c"}, "xabcy"), (Outcome{"xab", true, "c"}));
  // Same start: the shorter completes first.
  EXPECT_EQ(RunEverySplit({"abc", "ab"}, "zabc"), (Outcome{"z", true, "ab"}));
}

TEST(StopMatcherTest, HoldsBackOnlyWhatCouldStillMatch) {
  StopMatcher matcher({"</s>"});
  EXPECT_EQ(matcher.Feed("a<").text, "a");
  EXPECT_EQ(matcher.Feed("/").text, "");
  EXPECT_EQ(matcher.Feed("x").text, "</x");
  StopMatcher::Result result = matcher.Feed("b</s>c");
  EXPECT_EQ(result.text, "b");
  EXPECT_TRUE(result.stopped);
  EXPECT_EQ(matcher.Feed("more").text, "");
  EXPECT_EQ(matcher.Flush(), "");
}

TEST(StopMatcherTest, FlushResolvesADeferredMatch) {
  StopMatcher matcher({"abcd", "c"});
  StopMatcher::Result result = matcher.Feed("xabc");  // "abc" could still become "abcd"
  EXPECT_EQ(result.text, "x");
  EXPECT_FALSE(result.stopped);
  EXPECT_EQ(matcher.Flush(), "ab");
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.matched(), "c");
}

TEST(StopMatcherTest, MultibyteText) {
  EXPECT_EQ(RunEverySplit({"。"}, "日本語。次"), (Outcome{"日本語", true, "。"}));
}

}  // namespace
}  // namespace glm::openai
