#include "controller/rendezvous/rendezvous_store.h"

#include <thread>

#include "gtest/gtest.h"

namespace glm::rendezvous {
namespace {

using std::chrono::milliseconds;

TEST(RendezvousStoreTest, PutThenGet) {
  RendezvousStore store;
  ASSERT_TRUE(store.Put("g0/e1", "rank0", "10.0.0.1:5000").ok());
  auto v = store.Get("g0/e1", "rank0", milliseconds(0));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "10.0.0.1:5000");
}

TEST(RendezvousStoreTest, MissingKeyWithoutWaitNamesKey) {
  RendezvousStore store;
  auto v = store.Get("g0/e1", "rank3", milliseconds(0));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(v.status().message().find("rank3"), absl::string_view::npos);
}

TEST(RendezvousStoreTest, GetWaitsForPut) {
  RendezvousStore store;
  std::thread getter([&] {
    auto v = store.Get("g0/e1", "rank1", std::chrono::minutes(1));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, "addr");
  });
  ASSERT_TRUE(store.Put("g0/e1", "rank1", "addr").ok());
  getter.join();
}

TEST(RendezvousStoreTest, NamespacesAreSeparateAndDeletable) {
  RendezvousStore store;
  ASSERT_TRUE(store.Put("g0/e1", "k", "old").ok());
  EXPECT_FALSE(store.Get("g0/e2", "k", milliseconds(0)).ok());
  EXPECT_EQ(store.Delete("g0/e1"), 1);
  EXPECT_FALSE(store.Get("g0/e1", "k", milliseconds(0)).ok());
}

TEST(RendezvousStoreTest, RejectsBadInput) {
  RendezvousStore store;
  EXPECT_EQ(store.Put("", "k", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Put("n", std::string(600, 'k'), "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Put("n", "k", std::string(RendezvousStore::kMaxValueBytes + 1, 'v')).code(),
            absl::StatusCode::kInvalidArgument);
}

// Puts into ever new namespaces fill the store up to its byte limit, not memory; deleting a
// namespace and overwriting a key give their bytes back.
TEST(RendezvousStoreTest, TotalBytesAreBounded) {
  RendezvousStore store;
  const std::string value(RendezvousStore::kMaxValueBytes, 'v');
  const size_t fit = RendezvousStore::kMaxTotalBytes / (value.size() + 8);
  size_t stored = 0;
  absl::Status s;
  for (size_t i = 0; i < fit + 16 && (s = store.Put("ns" + std::to_string(i), "k", value)).ok();
       ++i) {
    ++stored;
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("rendezvous store is full"), std::string::npos) << s;
  EXPECT_NE(s.message().find("Fix:"), std::string::npos) << s;
  EXPECT_GE(stored, fit - 1);
  EXPECT_TRUE(store.Put("ns0", "k", value).ok());  // an overwrite of the same size fits
  EXPECT_EQ(store.Delete("ns1"), 1);
  EXPECT_TRUE(store.Put("fresh", "k", value).ok());
}

TEST(RendezvousStoreTest, ShutdownWakesWaiters) {
  RendezvousStore store;
  std::thread getter([&] {
    EXPECT_EQ(store.Get("n", "k", std::chrono::minutes(5)).status().code(),
              absl::StatusCode::kCancelled);
  });
  store.Shutdown();
  getter.join();
}

}  // namespace
}  // namespace glm::rendezvous
