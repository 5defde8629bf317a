// LogRing: bounds by lines and bytes, sequence numbers, dropped counts, followers woken by a new
// line, concurrent appenders; and InitLogging feeding the process ring.
#include "common/log_ring.h"

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "gtest/gtest.h"

namespace glm {
namespace {

using std::chrono::milliseconds;

std::vector<std::string> Texts(const LogRing::Slice& s) {
  std::vector<std::string> out;
  for (const auto& l : s.lines) out.push_back(l.text);
  return out;
}

TEST(LogRingTest, EmptyRingHasNothing) {
  LogRing ring;
  EXPECT_EQ(ring.last_seq(), 0);
  LogRing::Slice tail = ring.Tail(10);
  EXPECT_TRUE(tail.lines.empty());
  EXPECT_EQ(tail.dropped_before, 0);
  EXPECT_TRUE(ring.WaitAfter(0, milliseconds(0)).lines.empty());
}

TEST(LogRingTest, SequenceNumbersAndTail) {
  LogRing ring;
  EXPECT_EQ(ring.Append("a\n"), 1);  // the newline is stripped
  EXPECT_EQ(ring.Append("b"), 2);
  EXPECT_EQ(ring.Append("c"), 3);
  LogRing::Slice tail = ring.Tail(2);
  EXPECT_EQ(Texts(tail), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(tail.lines[0].seq, 2);
  EXPECT_EQ(tail.lines[1].seq, 3);
  EXPECT_EQ(tail.dropped_before, 0);
  // More than were ever logged: all of them, nothing reported missing.
  EXPECT_EQ(Texts(ring.Tail(100)), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ring.Tail(100).dropped_before, 0);
  EXPECT_TRUE(ring.Tail(0).lines.empty());
}

TEST(LogRingTest, LineBoundDropsOldestAndCountsThem) {
  LogRing ring({.max_lines = 3, .max_bytes = 1 << 20});
  for (int i = 1; i <= 5; ++i) ring.Append("line " + std::to_string(i));
  EXPECT_EQ(ring.size(), 3u);
  EXPECT_EQ(ring.dropped(), 2);
  EXPECT_EQ(ring.last_seq(), 5);
  LogRing::Slice tail = ring.Tail(5);
  EXPECT_EQ(Texts(tail), (std::vector<std::string>{"line 3", "line 4", "line 5"}));
  EXPECT_EQ(tail.lines.front().seq, 3);
  EXPECT_EQ(tail.dropped_before, 2);  // lines 1 and 2 were asked for and are gone
  EXPECT_EQ(ring.Tail(4).dropped_before, 1);
  EXPECT_EQ(ring.Tail(3).dropped_before, 0);
  // A follower that last saw seq 1 missed line 2.
  LogRing::Slice after = ring.WaitAfter(1, milliseconds(0));
  EXPECT_EQ(after.dropped_before, 1);
  EXPECT_EQ(after.lines.front().seq, 3);
}

TEST(LogRingTest, ByteBoundDropsOldestAndCutsHugeLines) {
  LogRing ring({.max_lines = 100, .max_bytes = 10});
  ring.Append("aaaa");
  ring.Append("bbbb");
  EXPECT_EQ(ring.bytes(), 8u);
  ring.Append("cccc");  // 12 bytes > 10: "aaaa" goes
  EXPECT_EQ(ring.bytes(), 8u);
  EXPECT_EQ(Texts(ring.Tail(10)), (std::vector<std::string>{"bbbb", "cccc"}));
  EXPECT_EQ(ring.dropped(), 1);
  ring.Append(std::string(50, 'x'));  // longer than the whole ring: kept, cut to 10 bytes
  EXPECT_EQ(Texts(ring.Tail(10)), (std::vector<std::string>{std::string(10, 'x')}));
  EXPECT_EQ(ring.bytes(), 10u);
  EXPECT_EQ(ring.dropped(), 3);
}

TEST(LogRingTest, WaitAfterReturnsAtOnceWhenNewerLinesExist) {
  LogRing ring;
  ring.Append("a");
  ring.Append("b");
  ring.Append("c");
  LogRing::Slice s = ring.WaitAfter(1, milliseconds(0), /*max_lines=*/1);
  ASSERT_EQ(s.lines.size(), 1u);
  EXPECT_EQ(s.lines[0].seq, 2);
  EXPECT_EQ(s.lines[0].text, "b");
  EXPECT_EQ(s.dropped_before, 0);
  EXPECT_TRUE(ring.WaitAfter(3, milliseconds(0)).lines.empty());
}

TEST(LogRingTest, FollowerWakesOnANewLine) {
  LogRing ring;
  ring.Append("before");
  std::atomic<bool> waiting{false};
  LogRing::Slice got;
  std::thread follower([&] {
    waiting.store(true);
    // Generous bound: the append below wakes it long before.
    got = ring.WaitAfter(1, milliseconds(30000));
  });
  while (!waiting.load()) std::this_thread::yield();
  auto start = std::chrono::steady_clock::now();
  ring.Append("after");
  follower.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  ASSERT_EQ(got.lines.size(), 1u);
  EXPECT_EQ(got.lines[0].seq, 2);
  EXPECT_EQ(got.lines[0].text, "after");
}

TEST(LogRingTest, WaitAfterTimesOutEmpty) {
  LogRing ring;
  ring.Append("only");
  EXPECT_TRUE(ring.WaitAfter(1, milliseconds(1)).lines.empty());
}

TEST(LogRingTest, ConcurrentAppendersGetDistinctContiguousSeqs) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  LogRing ring({.max_lines = 1000, .max_bytes = 1 << 20});
  std::vector<std::vector<int64_t>> seqs(kThreads);
  std::vector<std::thread> threads;
  // A follower reading concurrently sees increasing, gap-free seqs (or a counted gap).
  std::atomic<bool> done{false};
  int64_t followed = 0;
  int64_t accounted = 0;
  std::thread follower([&] {
    int64_t after = 0;
    while (!done.load() || after < ring.last_seq()) {
      LogRing::Slice s = ring.WaitAfter(after, milliseconds(50));
      accounted += s.dropped_before;
      for (const auto& l : s.lines) {
        EXPECT_EQ(l.seq, after + 1 + (&l == &s.lines.front() ? s.dropped_before : 0));
        after = l.seq;
        ++followed;
      }
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        seqs[t].push_back(ring.Append("t" + std::to_string(t) + " " + std::to_string(i)));
      }
    });
  }
  for (auto& th : threads) th.join();
  done.store(true);
  follower.join();
  std::set<int64_t> all;
  for (const auto& v : seqs) {
    for (size_t i = 1; i < v.size(); ++i) EXPECT_LT(v[i - 1], v[i]);
    all.insert(v.begin(), v.end());
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kPerThread);
  EXPECT_EQ(ring.size(), 1000u);
  EXPECT_EQ(ring.dropped(), kThreads * kPerThread - 1000);
  EXPECT_EQ(followed + accounted, kThreads * kPerThread);
}

TEST(LogRingTest, ResumeAfterContinuesWithoutGapOrRepeat) {
  LogRing ring({.max_lines = 2, .max_bytes = 1 << 20});
  EXPECT_EQ(ring.Tail(5).resume_after, 0);
  ring.Append("a");
  ring.Append("b");
  ring.Append("c");  // "a" dropped
  EXPECT_EQ(ring.Tail(0).resume_after, 3);
  EXPECT_EQ(ring.Tail(1).resume_after, 3);
  LogRing::Slice s = ring.WaitAfter(0, milliseconds(0), /*max_lines=*/1);
  EXPECT_EQ(s.dropped_before, 1);
  EXPECT_EQ(s.resume_after, 2);
  EXPECT_EQ(ring.WaitAfter(s.resume_after, milliseconds(0)).lines.front().text, "c");
}

TEST(StreamLogRingTest, TailDefaultsTo200AndIsCappedAtTheRing) {
  LogRing ring({.max_lines = 300, .max_bytes = 1 << 20});
  for (int i = 1; i <= 500; ++i) ring.Append("l" + std::to_string(i));
  std::vector<int64_t> seqs;
  int64_t dropped = 0;
  auto collect = [&](const LogRing::Line& l, int64_t d) {
    seqs.push_back(l.seq);
    dropped += d;
    return true;
  };
  StreamLogRing(ring, {.tail_lines = 0}, collect, [] { return true; });
  ASSERT_EQ(seqs.size(), 200u);
  EXPECT_EQ(seqs.front(), 301);
  EXPECT_EQ(seqs.back(), 500);
  seqs.clear();
  StreamLogRing(ring, {.tail_lines = 100000}, collect, [] { return true; });
  EXPECT_EQ(seqs.size(), 300u);  // capped at max_lines: nothing reported as dropped
  EXPECT_EQ(dropped, 0);
}

TEST(StreamLogRingTest, FollowSendsNewLinesUntilStopOrWriteFails) {
  LogRing ring;
  ring.Append("old");
  std::vector<std::string> got;
  std::atomic<bool> stop{false};
  std::atomic<int> seen{0};
  std::thread follower([&] {
    StreamLogRing(
        ring, {.tail_lines = 5, .follow = true, .poll = milliseconds(5)},
        [&](const LogRing::Line& l, int64_t) {
          got.push_back(l.text);
          seen.fetch_add(1);
          return true;
        },
        [&] { return stop.load(); });
  });
  while (seen.load() < 1) std::this_thread::yield();  // the tail arrived: following now
  ring.Append("new");
  while (seen.load() < 2) std::this_thread::yield();
  stop.store(true);
  follower.join();  // ends within one poll
  EXPECT_EQ(got, (std::vector<std::string>{"old", "new"}));

  // A reader that goes away ends the stream at once, even while following.
  int writes = 0;
  StreamLogRing(
      ring, {.tail_lines = 5, .follow = true},
      [&](const LogRing::Line&, int64_t) { return ++writes < 1; }, [] { return false; });
  EXPECT_EQ(writes, 1);
}

TEST(LogRingTest, InitLoggingFeedsTheProcessRing) {
  InitLogging("ringtest");
  int64_t before = ProcessLogRing().last_seq();
  GLM_LOG_INFO("ring test line key={}", 42);
  GLM_LOG_DEBUG("below the level, not kept");
  LogRing::Slice s = ProcessLogRing().WaitAfter(before, milliseconds(0));
  ASSERT_EQ(s.lines.size(), 1u);
  EXPECT_NE(s.lines[0].text.find("ringtest: ring test line key=42"), std::string::npos)
      << s.lines[0].text;
  EXPECT_NE(s.lines[0].text.find(" I "), std::string::npos) << s.lines[0].text;
  EXPECT_EQ(s.lines[0].text.find('\x1b'), std::string::npos) << "no color codes in the ring";
  EXPECT_EQ(s.lines[0].text.back(), '2');  // no newline
}

}  // namespace
}  // namespace glm
