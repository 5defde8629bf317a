// Path-MTU probe across two network namespaces joined by a veth pair whose ends have different
// MTUs (9000 in A, 1500 in B). The test creates and removes the namespaces itself; addresses
// exist only inside them. Skips (with the reason) when not root or `ip netns` is unavailable.
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "agent/preflight/path_mtu.h"
#include "gtest/gtest.h"

namespace glm::preflight {
namespace {

int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

class TwoNamespaces : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    if (Sh("command -v ip") != 0) GTEST_SKIP() << "no `ip` command (iproute2)";
    std::string id = std::to_string(getpid());
    a_ = "glm_mtu_a_" + id;
    b_ = "glm_mtu_b_" + id;
    if (Sh("ip netns add " + a_) != 0) GTEST_SKIP() << "`ip netns add` failed (no CAP_SYS_ADMIN?)";
    created_ = true;
    std::string va = "gma" + id, vb = "gmb" + id;
    ASSERT_EQ(Sh("ip netns add " + b_), 0);
    ASSERT_EQ(Sh("ip link add " + va + " netns " + a_ + " type veth peer name " + vb + " netns " + b_), 0);
    ASSERT_EQ(Sh("ip -n " + a_ + " addr add 10.231.0.1/24 dev " + va), 0);
    ASSERT_EQ(Sh("ip -n " + b_ + " addr add 10.231.0.2/24 dev " + vb), 0);
    ASSERT_EQ(Sh("ip -n " + a_ + " link set " + va + " mtu 9000 up"), 0);
    ASSERT_EQ(Sh("ip -n " + b_ + " link set " + vb + " mtu 1500 up"), 0);
    Sh("ip -n " + a_ + " link set lo up");
    Sh("ip -n " + b_ + " link set lo up");
  }
  void TearDown() override {
    if (!created_) return;
    Sh("ip netns del " + a_);
    Sh("ip netns del " + b_);
  }

  // Runs `fn` on a thread that has joined namespace `ns` (setns affects only that thread).
  void InNamespace(const std::string& ns, const std::function<void()>& fn) {
    std::thread t([&] {
      int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(setns(fd, CLONE_NEWNET), 0);
      close(fd);
      fn();
    });
    t.join();
  }

  absl::StatusOr<PathMtuResult> Probe(const std::string& from, const std::string& host,
                                      uint16_t port) {
    absl::StatusOr<PathMtuResult> result = absl::UnknownError("not run");
    InNamespace(from, [&] {
      PathMtuOptions o;
      o.host = host;
      o.port = port;
      o.target_mtu = 9000;
      o.timeout = std::chrono::milliseconds(150);
      o.attempts = 2;
      result = ProbePathMtu(o);
    });
    return result;
  }

  std::string a_, b_;
  bool created_ = false;
};

TEST_F(TwoNamespaces, ProbeFindsTheNarrowerEnd) {
  std::unique_ptr<UdpEchoResponder> in_b, in_a;
  InNamespace(b_, [&] {
    auto r = UdpEchoResponder::Start("10.231.0.2", 0);
    ASSERT_TRUE(r.ok()) << r.status();
    in_b = std::move(*r);
  });
  InNamespace(a_, [&] {
    auto r = UdpEchoResponder::Start("10.231.0.1", 0);
    ASSERT_TRUE(r.ok()) << r.status();
    in_a = std::move(*r);
  });
  ASSERT_TRUE(in_a && in_b);

  // A (9000) → B (1500): frames above B's MTU are dropped at B's veth. The veth lets a
  // VLAN header's worth (4 bytes) of slack through, so the answer is 1500..1504.
  auto a_to_b = Probe(a_, "10.231.0.2", in_b->port());
  ASSERT_TRUE(a_to_b.ok()) << a_to_b.status();
  EXPECT_GE(a_to_b->largest_ok, 1500);
  EXPECT_LE(a_to_b->largest_ok, 1504);
  EXPECT_EQ(PathMtuCheck("b", a_to_b).status, CheckStatus::kFail);

  // B → A: B's own MTU refuses DF datagrams over 1500 (EMSGSIZE), exactly.
  auto b_to_a = Probe(b_, "10.231.0.1", in_a->port());
  ASSERT_TRUE(b_to_a.ok()) << b_to_a.status();
  EXPECT_EQ(b_to_a->largest_ok, 1500);
}

}  // namespace
}  // namespace glm::preflight
