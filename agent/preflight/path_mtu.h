// Path-MTU probe between agents: a small UDP echo responder on each agent, and a prober that sends
// datagrams with the don't-fragment bit (IP_MTU_DISCOVER = IP_PMTUDISC_DO) and binary-searches
// the largest IP packet that reaches the peer. A fabric whose switch or peer port is at 1500
// while the nodes say 9000 passes every local check and then stalls NCCL; this finds it.
//
// Wire format (little-endian): request  = u32 magic 'GLMP', u32 seq, padding to the probe size;
//                              reply    = u32 magic, u32 seq, u32 bytes received.
// The reply is small, so a probe measures one direction (prober → responder).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/preflight/check.h"

namespace glm::preflight {

class UdpEchoResponder {
 public:
  // Binds `address:port` (port 0 = any) and answers on a background thread until destroyed.
  // `max_datagram` > 0 makes it ignore larger datagrams (tests emulate a narrower path with it).
  static absl::StatusOr<std::unique_ptr<UdpEchoResponder>> Start(const std::string& address,
                                                                 uint16_t port,
                                                                 int max_datagram = 0);
  ~UdpEchoResponder();
  uint16_t port() const { return port_; }

 private:
  UdpEchoResponder() = default;
  void Serve();
  int fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  uint16_t port_ = 0;
  int max_datagram_ = 0;
  std::thread thread_;
};

struct PathMtuOptions {
  std::string host;        // IPv4 of the peer's responder.
  uint16_t port = 0;
  int target_mtu = 9000;   // fabric.mtu: the IP packet size that should pass.
  int min_mtu = 576;       // the smallest size tried; must pass or the peer is unreachable.
  std::chrono::milliseconds timeout{200};  // per attempt.
  int attempts = 3;        // per size, to ride out an ordinary loss.
};

struct PathMtuResult {
  int largest_ok = 0;      // largest IP packet size (bytes, headers included) that arrived.
  int target_mtu = 0;
  int probes = 0;
  bool ok() const { return largest_ok >= target_mtu; }
};

// Errors: socket/connect failures, or not even min_mtu arriving (peer down / no responder).
absl::StatusOr<PathMtuResult> ProbePathMtu(const PathMtuOptions& options);

// The "mtu.path" check for one peer.
CheckResult PathMtuCheck(const std::string& peer, const absl::StatusOr<PathMtuResult>& result);

}  // namespace glm::preflight
