// Serves the complete files under a directory to peers (stage_protocol.h). Every agent runs one
// on its weights directory, so a node serves what it already holds and transfers fan out
// peer to peer instead of all pulling from the source. Only final (verified, renamed) files are
// visible; *.partial files are never served.
//
// Thread-safe. One thread accepts; each connection gets its own (detached) thread. Stop() (or the
// destructor) closes the listener and every open connection, as a crash would.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace glm::stage {

class StageServer {
 public:
  struct Options {
    std::string root;                 // directory served.
    std::string bind_address = "127.0.0.1";
    uint16_t port = 0;                // 0 = any free port.
    int io_timeout_ms = 30000;
  };

  static absl::StatusOr<std::unique_ptr<StageServer>> Start(Options options);
  ~StageServer();

  uint16_t port() const { return port_; }
  void Stop();
  uint64_t bytes_served() const { return bytes_served_.load(); }

 private:
  explicit StageServer(Options options) : options_(std::move(options)) {}
  void AcceptLoop();
  void Serve(int fd);

  Options options_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  uint16_t port_ = 0;
  std::thread accept_thread_;
  std::mutex mu_;
  bool stopping_ = false;
  std::condition_variable idle_;
  std::set<int> open_fds_;
  int active_workers_ = 0;  // detached connection threads still running.
  std::atomic<uint64_t> bytes_served_{0};
};

}  // namespace glm::stage
