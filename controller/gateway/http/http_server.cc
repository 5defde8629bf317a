#include "controller/gateway/http/http_server.h"

#include <future>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "controller/gateway/http/connection.h"
#include "controller/gateway/http/listen_address.h"
#include "controller/gateway/http/server_core.h"

namespace glm::http {

const std::string* Request::Header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return &value;
  }
  return nullptr;
}

namespace internal {
namespace {

using boost::system::error_code;
using Clock = std::chrono::steady_clock;

// Connections answered 503 at once beyond which further ones are closed without an answer.
constexpr int64_t kMaxRejecting = 256;
// After the grace period, how long Shutdown waits for the closes it ordered, and then for the
// I/O threads to run out of work, before it stops the io_context outright.
constexpr std::chrono::seconds kStopWait{5};

std::string FixFor(const error_code& ec, int port) {
  namespace error = boost::asio::error;
  if (ec == error::address_in_use) {
    return absl::StrCat("another process holds the port (see `ss -ltnp 'sport = :", port,
                        "'`); stop it or choose another port in the listen address");
  }
  if (ec == error::access_denied) {
    return "ports below 1024 need root or CAP_NET_BIND_SERVICE; use a port from 1024 up";
  }
  if (ec == boost::system::errc::address_not_available) {
    return "the host is not an address of this machine; use one of its addresses, 127.0.0.1 or "
           "0.0.0.0";
  }
  return "check the listen address";
}

}  // namespace

ServerCore::ServerCore(ServerOptions options_in, Handler handler_in)
    : options(std::move(options_in)),
      handler(std::move(handler_in)),
      accept_strand_(net::make_strand(ioc)),
      acceptor_(accept_strand_),
      accept_backoff_(accept_strand_) {}

ServerCore::~ServerCore() = default;

absl::Status ServerCore::Listen(const tcp::endpoint& endpoint, const std::string& listen_text) {
  error_code ec;
  const auto fail = [&](const char* step) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen_text, " (", step,
                                               "): ", ec.message(), "; ",
                                               FixFor(ec, endpoint.port())));
  };
  acceptor_.open(endpoint.protocol(), ec);
  if (ec) return fail("open");
  acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (ec) return fail("SO_REUSEADDR");
  acceptor_.bind(endpoint, ec);
  if (ec) return fail("bind");
  acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen");
  port_ = acceptor_.local_endpoint(ec).port();
  if (ec) return fail("local address");
  return absl::OkStatus();
}

void ServerCore::Run() {
  {
    std::lock_guard lock(shutdown_mu_);
    running_ = true;
  }
  work_.emplace(ioc.get_executor());
  net::post(accept_strand_, [this] { Accept(); });
  running_threads_ = options.io_threads;
  threads_.reserve(options.io_threads);
  for (int i = 0; i < options.io_threads; ++i) {
    threads_.emplace_back([this] {
      ioc.run();
      std::lock_guard lock(threads_mu_);
      --running_threads_;
      threads_cv_.notify_all();
    });
  }
}

void ServerCore::Accept() {
  if (!acceptor_.is_open()) return;
  pending_strand_.emplace(net::make_strand(ioc));
  pending_socket_.emplace(*pending_strand_);
  acceptor_.async_accept(*pending_socket_, [this](const error_code& ec) { OnAccept(ec); });
}

void ServerCore::OnAccept(const error_code& ec) {
  if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
  if (ec) {
    // Out of descriptors (or a transient error): back off instead of spinning.
    const auto now = Clock::now();
    if (now - last_accept_warning_ > std::chrono::seconds(10)) {
      last_accept_warning_ = now;
      GLM_LOG_WARN("http accept failed port={} error=\"{}\" open_connections={}", port_,
                   ec.message(), open_connections.load());
    }
    accept_backoff_.expires_after(std::chrono::milliseconds(50));
    accept_backoff_.async_wait([this](const error_code& wait_ec) {
      if (!wait_ec) Accept();
    });
    return;
  }
  tcp::socket socket = std::move(*pending_socket_);
  Strand strand = *pending_strand_;
  pending_socket_.reset();
  const bool reject = open_connections.load() >= options.max_connections;
  if (reject && rejecting.load() >= kMaxRejecting) {
    error_code close_ec;
    socket.close(close_ec);
    Accept();
    return;
  }
  if (reject) {
    rejecting.fetch_add(1);
  } else {
    open_connections.fetch_add(1);
  }
  auto connection = std::make_shared<Connection>(this, strand, std::move(socket), !reject);
  {
    std::lock_guard lock(conns_mu_);
    conns_.emplace(connection.get(), connection);
  }
  net::post(strand, [connection, reject] { connection->Start(reject); });
  Accept();
}

void ServerCore::Unregister(Connection* connection) {
  std::lock_guard lock(conns_mu_);
  conns_.erase(connection);
  if (conns_.empty()) conns_cv_.notify_all();
}

std::vector<std::shared_ptr<Connection>> ServerCore::Snapshot() {
  std::vector<std::shared_ptr<Connection>> connections;
  std::lock_guard lock(conns_mu_);
  connections.reserve(conns_.size());
  for (const auto& [raw, weak] : conns_) {
    if (auto connection = weak.lock()) connections.push_back(std::move(connection));
  }
  return connections;
}

bool ServerCore::WaitForNoConnections(Clock::time_point deadline) {
  std::unique_lock lock(conns_mu_);
  return conns_cv_.wait_until(lock, deadline, [this] { return conns_.empty(); });
}

void ServerCore::Shutdown(std::chrono::milliseconds grace) {
  std::lock_guard shutdown_lock(shutdown_mu_);
  if (!running_) return;
  running_ = false;
  GLM_LOG_INFO("http server stopping port={} grace_ms={} open_connections={} open_streams={}",
               port_, grace.count(), open_connections.load(), open_streams.load());
  const auto grace_deadline = Clock::now() + grace;
  draining.store(true);

  // 1. Stop accepting. After this no connection is added to the registry.
  std::promise<void> acceptor_closed;
  net::post(accept_strand_, [this, &acceptor_closed] {
    error_code ec;
    acceptor_.close(ec);
    accept_backoff_.cancel();
    pending_socket_.reset();
    acceptor_closed.set_value();
  });
  acceptor_closed.get_future().wait();

  // 2. Idle connections close now, busy ones after their current reply, until the grace ends.
  for (const auto& connection : Snapshot()) {
    PostIfRunning(connection->strand(), [connection] { connection->Drain(); });
  }
  WaitForNoConnections(grace_deadline);

  // 3. Close what is left (on_close runs for unfinished exchanges).
  const auto left = Snapshot();
  for (const auto& connection : left) {
    PostIfRunning(connection->strand(), [connection] { connection->Close(); });
  }
  const bool all_closed = WaitForNoConnections(Clock::now() + kStopWait);

  // 4. Let the threads run out of work. Handlers posted before `stopped_` still run.
  {
    std::unique_lock lock(run_mu_);
    stopped_ = true;
  }
  work_.reset();
  bool threads_done = false;
  {
    std::unique_lock lock(threads_mu_);
    threads_done = threads_cv_.wait_for(lock, kStopWait, [this] { return running_threads_ == 0; });
  }
  if (!threads_done) ioc.stop();
  for (auto& thread : threads_) thread.join();
  threads_.clear();
  GLM_LOG_INFO("http server stopped port={} forced_closes={} clean={}", port_, left.size(),
               all_closed && threads_done);
}

}  // namespace internal

Server::Server(std::shared_ptr<internal::ServerCore> core) : core_(std::move(core)) {}

Server::~Server() { Shutdown(std::chrono::milliseconds(0)); }

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options, Handler handler) {
  if (!handler) return absl::InvalidArgumentError("http server: the handler is empty");
  if (options.io_threads < 1 || options.io_threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http server: io_threads is ", options.io_threads, "; use 1 to 1024 (a few suffice)"));
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http server: max_connections is ", options.max_connections, "; use at least 1"));
  }
  if (options.idle_timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        "http server: idle_timeout must be positive (it bounds idle and slow clients)");
  }
  if (options.max_header_bytes < 64 || options.max_stream_buffer_bytes < 1) {
    return absl::InvalidArgumentError(
        "http server: max_header_bytes must be at least 64 and max_stream_buffer_bytes positive");
  }
  auto address = ParseListenAddress(options.listen);
  if (!address.ok()) return address.status();

  internal::tcp::endpoint endpoint;
  boost::system::error_code ec;
  const auto ip = internal::net::ip::make_address(address->host, ec);
  if (!ec) {
    endpoint = internal::tcp::endpoint(ip, static_cast<unsigned short>(address->port));
  } else {
    internal::net::io_context resolve_context;
    internal::tcp::resolver resolver(resolve_context);
    const auto results =
        resolver.resolve(address->host, std::to_string(address->port),
                         internal::tcp::resolver::passive | internal::tcp::resolver::numeric_service,
                         ec);
    if (ec || results.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "listen address '", options.listen, "': cannot resolve host '", address->host,
          "': ", ec ? ec.message() : "no addresses",
          "; use an IP address such as 127.0.0.1 or 0.0.0.0"));
    }
    endpoint = results.begin()->endpoint();
  }

  const std::string listen_text = options.listen;
  const int io_threads = options.io_threads;
  auto core = std::make_shared<internal::ServerCore>(std::move(options), std::move(handler));
  if (absl::Status status = core->Listen(endpoint, listen_text); !status.ok()) return status;
  core->Run();
  GLM_LOG_INFO("http server listening addr={} port={} io_threads={}", listen_text, core->port(),
               io_threads);
  return std::unique_ptr<Server>(new Server(std::move(core)));
}

int Server::port() const { return core_->port(); }

void Server::Shutdown(std::chrono::milliseconds grace) { core_->Shutdown(grace); }

int64_t Server::open_connections() const { return core_->open_connections.load(); }

int64_t Server::open_streams() const { return core_->open_streams.load(); }

}  // namespace glm::http
