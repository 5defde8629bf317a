// Internal to glm_http_server: the state a Server shares with its connections and with every
// Exchange/Stream it hands out. Compiles Boost.Asio; the public header does not.
//
// Lifetime: the ServerCore owns the io_context. The Server, every Exchange and every Stream hold
// a shared_ptr to it, so the io_context outlives each socket; a Connection holds a raw pointer
// (it is only reachable through an Exchange/Stream, an Asio handler or the weak registry).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "absl/status/status.h"
#include "controller/gateway/http/http_server.h"

namespace glm::http::internal {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using Strand = net::strand<net::io_context::executor_type>;

class Connection;

// One request's reply state, shared by its Exchange, its Stream and its Connection. Every field
// is guarded by `mu`: the handler's side touches it from any thread, the connection on its strand.
struct ExchangeState {
  std::mutex mu;
  bool answered = false;     // Respond or StartStream was called (or the server answered 500)
  bool done = false;         // the reply is handed over (Respond, Finish): on_close never runs
  bool closed = false;       // the client is gone or the stream was aborted: Send returns false
  bool close_fired = false;  // on_close has been taken to run
  std::function<void()> on_close;
  std::string pending;        // Send data not yet moved onto the strand
  bool flush_posted = false;  // a FlushStream is queued on the strand
  bool finish_requested = false;
  size_t unsent_bytes = 0;  // Send data not yet written to the socket (the overflow bound)
};

class ServerCore : public std::enable_shared_from_this<ServerCore> {
 public:
  ServerCore(ServerOptions options, Handler handler);
  ~ServerCore();

  // Opens, binds and listens on `endpoint`; errors name `listen_text` and the fix.
  absl::Status Listen(const tcp::endpoint& endpoint, const std::string& listen_text);
  // Starts the I/O threads and the accept loop.
  void Run();
  // See Server::Shutdown.
  void Shutdown(std::chrono::milliseconds grace);

  // Posts `fn` onto `strand` unless the I/O threads have stopped; returns whether it did. A
  // handler posted here always runs (Shutdown drains the queue before the threads leave).
  template <class Fn>
  bool PostIfRunning(const Strand& strand, Fn&& fn) {
    std::shared_lock lock(run_mu_);
    if (stopped_) return false;
    net::post(strand, std::forward<Fn>(fn));
    return true;
  }

  void Unregister(Connection* connection);

  int port() const { return port_; }

  // Declared first so it is destroyed last: every socket, timer and handler below dies first.
  net::io_context ioc;
  const ServerOptions options;
  const Handler handler;

  std::atomic<int64_t> open_connections{0};
  std::atomic<int64_t> open_streams{0};
  std::atomic<int64_t> rejecting{0};  // connections being answered 503
  std::atomic<bool> draining{false};

 private:
  void Accept();
  void OnAccept(const boost::system::error_code& ec);
  std::vector<std::shared_ptr<Connection>> Snapshot();
  // Waits until no connection is registered or `deadline` passes; true when none is left.
  bool WaitForNoConnections(std::chrono::steady_clock::time_point deadline);

  std::shared_mutex run_mu_;
  bool stopped_ = false;  // guarded by run_mu_

  Strand accept_strand_;
  tcp::acceptor acceptor_;
  net::steady_timer accept_backoff_;
  std::optional<Strand> pending_strand_;     // the next connection's strand
  std::optional<tcp::socket> pending_socket_;  // the socket async_accept fills
  std::chrono::steady_clock::time_point last_accept_warning_{};
  int port_ = 0;

  std::optional<net::executor_work_guard<net::io_context::executor_type>> work_;
  std::vector<std::thread> threads_;
  std::mutex threads_mu_;
  std::condition_variable threads_cv_;
  int running_threads_ = 0;  // guarded by threads_mu_

  std::mutex conns_mu_;
  std::condition_variable conns_cv_;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> conns_;  // guarded by conns_mu_

  std::mutex shutdown_mu_;  // held through Shutdown: a second caller waits for the first
  bool running_ = false;    // guarded by shutdown_mu_
};

}  // namespace glm::http::internal
