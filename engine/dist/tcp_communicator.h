// Communicator for the CPU backend: host memory over TCP, one connection per pair of ranks (a
// full mesh; TP groups are <= 8 ranks). Addresses are exchanged through the Rendezvous under
// `<key_prefix>/tcp/<rank>` ("ip:port"; IPv4).
//
// AllReduceSum is a direct reduce-scatter + all-gather: rank p owns chunk p of the buffer,
// receives every rank's copy of it, sums them in rank order (((x0 + x1) + x2) + ...), exactly as
// a serial loop over ranks would) and sends the sum back to everyone, so results are
// bit-identical on every rank and equal to the serial sum. Each rank sends and receives
// 2 (n-1)/n of the buffer, like a ring, in 2 steps instead of 2 (n-1).
//
// Every message carries a 16-byte frame (magic, operation, count), so ranks that issue different
// operations or counts fail with both named instead of reading garbage. A peer that closes its
// connection fails the operation at once; one that stays silent fails it after `op_timeout`
// without progress. On failure the communicator closes all its connections, so the other ranks
// fail fast too, and stays poisoned.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/dist/communicator.h"
#include "engine/dist/rendezvous.h"

namespace glm::engine {

struct TcpCommunicatorOptions {
  int rank = 0;
  int size = 1;
  // Scopes the rendezvous keys: one prefix per group and epoch.
  std::string key_prefix;
  // IPv4 address to listen on and publish (the node's fabric IP; 127.0.0.1 in tests). Port 0.
  std::string host = "127.0.0.1";
  // Bound on setup: waiting for peers' addresses, connecting, and their hellos.
  std::chrono::milliseconds connect_timeout{60'000};
  // An operation fails when no byte moved for this long (a stuck or dead peer).
  std::chrono::milliseconds op_timeout{60'000};
};

class TcpCommunicator : public Communicator {
 public:
  // Listens, publishes the address, connects to lower ranks and accepts higher ones. `rendezvous`
  // must outlive this call only.
  static absl::StatusOr<std::unique_ptr<TcpCommunicator>> Create(Rendezvous* rendezvous,
                                                                 TcpCommunicatorOptions options);
  ~TcpCommunicator() override;
  TcpCommunicator(const TcpCommunicator&) = delete;
  TcpCommunicator& operator=(const TcpCommunicator&) = delete;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status Send(const float* data, size_t count, int peer) override;
  absl::Status Recv(float* data, size_t count, int peer) override;
  absl::Status SendRecv(const float* send, size_t send_count, int send_peer, float* recv,
                        size_t recv_count, int recv_peer) override;
  absl::Status Broadcast(float* data, size_t count, int root) override;
  absl::Status Barrier() override;
  absl::Status Synchronize() override;

  // One transfer of a framed message to or from a peer (public for the .cc's helpers).
  struct Transfer {
    int peer = -1;
    bool is_send = false;
    uint32_t op = 0;
    char* data = nullptr;  // Source (send) or destination (recv).
    uint64_t count = 0;    // fp32 elements.
  };

 private:
  explicit TcpCommunicator(TcpCommunicatorOptions options);
  absl::Status Connect(Rendezvous* rendezvous);
  absl::Status Usable() const;
  absl::Status CheckPeer(int peer, const char* op) const;
  // Moves every transfer (at most one send and one recv per peer) to completion.
  absl::Status Run(const std::vector<Transfer>& transfers, const char* op_name);
  absl::Status Fail(absl::Status status);
  void CloseAll();

  TcpCommunicatorOptions options_;
  std::vector<int> fds_;  // [size]; fds_[rank] == -1.
  std::vector<float> scratch_;
  absl::Status poisoned_;
};

}  // namespace glm::engine
