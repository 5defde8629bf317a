// The gateway's event-driven HTTP/1.1 server: short JSON exchanges and long Server-Sent-Events
// streams, thousands open at once on a few I/O threads (Boost.Beast/Asio underneath; no Beast
// type appears here, so code that includes this header does not compile Beast).
//
// Threading: one io_context run by `io_threads` threads; each connection lives on its own strand.
// The Handler runs on an I/O thread and must not block. It answers the Exchange it is given,
// at once or later from any thread (e.g. a gRPC callback): exactly one of Respond or StartStream.
//
// HTTP: keep-alive (1.1) and close (1.0), pipelined requests answered in order, `Expect:
// 100-continue`. Requests that break the limits or the grammar get an answer and the connection
// closes: body over max_body_bytes → 413 (JSON error body), header over max_header_bytes → 431,
// malformed → 400, no complete request within idle_timeout → 408 (or a quiet close when idle).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace glm::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path without the query string, e.g. "/v1/chat/completions"
  std::string query;   // after '?', raw (not percent-decoded); empty when there is none
  Headers headers;     // names lower-cased, values as received, in order
  std::string body;    // de-chunked
  std::string remote;  // "ip:port", "[v6]:port"

  // The first header named `lower_name` (lower case), or null.
  const std::string* Header(std::string_view lower_name) const;
};

struct Response {
  int status = 200;
  // Content-Type etc. The server owns framing: Content-Length, Transfer-Encoding and Connection
  // given here are ignored; names or values holding CR/LF are dropped.
  Headers headers;
  std::string body;
};

// A streamed response (SSE): chunked transfer encoding (close-delimited for an HTTP/1.0 client).
// Thread-safe: Send/Finish/OnClose may be called from any thread. Sends are written in call order
// (data queued between two writes goes out as one chunk) with TCP_NODELAY, so each is flushed
// promptly. Unsent data is bounded by ServerOptions::max_stream_buffer_bytes: a client that stops
// reading past it has its stream closed (Send returns false, on_close runs).
class Stream {
 public:
  virtual ~Stream() = default;
  // Queues raw bytes, e.g. "data: {...}\n\n". Returns false once the stream is closed (client
  // gone, buffer bound passed, server shut down) or finished; the data is then dropped. An empty
  // string sends nothing.
  virtual bool Send(std::string data) = 0;
  // Ends the response (the chunked terminator after all queued data). Idempotent. Afterwards
  // on_close never runs and the connection carries the client's next request.
  virtual void Finish() = 0;
  // Sets the callback that runs once if the stream closes before Finish (client disconnect,
  // overflow, server shutdown). It runs on an I/O thread, never inside Send. If the stream is
  // already closed it still runs once: posted to an I/O thread, or inline here once the server
  // has stopped. Set it before the first Send; setting it again replaces one that has not run.
  virtual void OnClose(std::function<void()> on_close) = 0;
  // True once Send would return false: finished, or closed before Finish.
  virtual bool closed() const = 0;
};

// One request and its reply. Respond and StartStream may be called from any thread, now or later;
// the first call wins and later ones are ignored (StartStream then returns a closed Stream). After
// the connection has died (or the Server is gone) both are harmless no-ops. If the last reference
// is dropped without either, the client gets 500.
class Exchange {
 public:
  virtual ~Exchange() = default;

  Request request;

  virtual void Respond(Response response) = 0;
  // Sends the status line and headers now (Content-Type: text/event-stream and Cache-Control:
  // no-cache unless `headers` sets them) and returns the stream for the body.
  virtual std::shared_ptr<Stream> StartStream(int status, Headers headers) = 0;
  // The callback runs once, on an I/O thread, if the client goes away before the reply is handed
  // over (Respond, or the stream's Finish): a long non-streamed request can cancel its work. It
  // is the same slot as the Stream's OnClose. Already closed: runs once (posted, or inline if the
  // server has stopped).
  virtual void OnClose(std::function<void()> on_close) = 0;
  // True once the client is known to be gone (or the server aborted the connection).
  virtual bool client_gone() const = 0;
};

// Runs on an I/O thread: must not block.
using Handler = std::function<void(std::shared_ptr<Exchange>)>;

struct ServerOptions {
  std::string listen = "127.0.0.1:0";  // host:port or [v6]:port; port 0 picks a free one
  int io_threads = 1;
  size_t max_body_bytes = 8 << 20;     // 413 beyond
  size_t max_header_bytes = 64 << 10;  // 431 beyond (request line + fields)
  // Keep-alive idle close; also the bound on receiving one request's header (slowloris), on a
  // body pause, and on each socket write completing (a client that stopped reading).
  std::chrono::milliseconds idle_timeout{60000};
  int max_connections = 10000;  // beyond: accept, answer 503 with Retry-After, close
  size_t max_stream_buffer_bytes = 4 << 20;  // per stream: unsent bytes before it is closed
};

namespace internal {
class ServerCore;
}

class Server {
 public:
  // Binds and starts the I/O threads. Errors (InvalidArgument, Unavailable) name the address and
  // the fix.
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options, Handler handler);

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  ~Server();  // Shutdown(0) if still running

  int port() const;  // the bound port

  // Graceful: stops accepting, closes idle keep-alive connections, lets in-flight requests and
  // open streams finish for up to `grace` (their connections then close), then closes what is
  // left (on_close runs for open streams and unanswered exchanges); returns when every I/O thread
  // has stopped. Idempotent. Never call it from an I/O thread (a handler or an on_close).
  void Shutdown(std::chrono::milliseconds grace);

  int64_t open_connections() const;  // accepted and not yet closed (503-rejected ones excluded)
  int64_t open_streams() const;      // started and not yet finished or closed

 private:
  explicit Server(std::shared_ptr<internal::ServerCore> core);
  std::shared_ptr<internal::ServerCore> core_;
};

}  // namespace glm::http
