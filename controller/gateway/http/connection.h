// Internal to glm_http_server: one accepted TCP connection, driven on its own strand.
//
// One read loop is kept pending for the connection's whole life (except while pipelined input is
// parked past a bound), so a client that disconnects is noticed while its handler is still
// working or its stream is quiet. Bytes go into `input_`; while a request is being received the
// Beast parser consumes them. One write is in flight at a time; everything else waits in `out_`.
//
//   kReading ──request──▶ kWaiting ──Respond──▶ kResponding ──written──▶ kReading (keep-alive)
//                              └──StartStream──▶ kStreaming ──Finish written──┘
//   errors and ends: ──▶ kLingering (shut down sending, discard input briefly) ──▶ kClosed
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "controller/gateway/http/http_server.h"
#include "controller/gateway/http/server_core.h"

namespace glm::http::internal {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerCore* core, Strand strand, tcp::socket socket, bool counted);

  const Strand& strand() const { return strand_; }

  // Everything below runs on the strand.
  // Starts serving; `reject` answers 503 (over max_connections) and closes.
  void Start(bool reject);
  // Server shutdown began: close when idle, otherwise after the current reply.
  void Drain();
  // Closes now; an unfinished exchange's on_close runs.
  void Close();

  // From the Exchange/Stream (posted). A state that is no longer current is ignored.
  void WriteResponse(const std::shared_ptr<ExchangeState>& state, Response response);
  void BeginStream(const std::shared_ptr<ExchangeState>& state, int status, Headers headers);
  void FlushStream(const std::shared_ptr<ExchangeState>& state);
  void AbortStream(const std::shared_ptr<ExchangeState>& state);

 private:
  enum class Phase { kReading, kWaiting, kResponding, kStreaming, kLingering, kClosed };
  struct Out {
    std::string bytes;
    size_t stream_bytes = 0;  // of these, Send data counted in ExchangeState::unsent_bytes
  };

  void DoRead();
  void OnRead(const boost::system::error_code& ec, size_t num_bytes);
  void ProcessInput();
  void OnHeaderDone();
  void Dispatch();
  // Answers an error with the JSON error body and closes after it.
  void FailRequest(int status, const std::string& message);
  void FinishExchange();
  void CloseAfterReply(bool linger);

  void Enqueue(std::string bytes, size_t stream_bytes = 0);
  void StartWrite();
  void OnWrite(const boost::system::error_code& ec);

  void ArmReadDeadline(std::chrono::steady_clock::duration timeout);
  void WaitReadDeadline();
  void CancelReadDeadline();
  void OnReadDeadline();

  // The status line and header block of a reply; `content_length` or chunked framing.
  std::string FormatHead(int status, const Headers& headers,
                         std::optional<size_t> content_length, bool chunked);

  ServerCore* const core_;
  const Strand strand_;
  tcp::socket socket_;
  net::steady_timer read_timer_;
  net::steady_timer write_timer_;
  const bool counted_;  // in core_->open_connections (else in core_->rejecting)
  std::string remote_;

  Phase phase_ = Phase::kReading;
  bool reading_ = false;  // an async_read_some is pending
  // The read chunk: small while waiting for a request or watching for a disconnect, large while
  // a request is arriving (allocated then, released when idle).
  std::array<char, 512> small_chunk_;
  std::unique_ptr<char[]> large_chunk_;
  bool read_into_large_ = false;
  boost::beast::flat_buffer input_;  // received, not yet parsed
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  bool request_started_ = false;  // bytes of the next request have arrived
  bool header_done_ = false;

  // The current request.
  std::shared_ptr<ExchangeState> current_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool head_request_ = false;
  bool chunked_ = false;        // the stream uses chunked framing
  bool stream_counted_ = false;  // in core_->open_streams
  bool reply_complete_ = false;  // the whole reply is queued in out_
  bool linger_on_close_ = false;
  bool peer_eof_ = false;
  bool draining_ = false;

  std::deque<Out> out_;
  std::vector<Out> in_flight_;
  std::vector<net::const_buffer> write_buffers_;
  bool writing_ = false;

  std::chrono::steady_clock::time_point read_deadline_;
  bool read_deadline_active_ = false;
  uint64_t read_timer_generation_ = 0;
  uint64_t write_timer_generation_ = 0;
};

}  // namespace glm::http::internal
