#include "controller/gateway/http/connection.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/status.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "controller/gateway/http/exchange_impl.h"

namespace glm::http::internal {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

constexpr size_t kLargeChunkBytes = 16 << 10;
// Input parked while a reply is pending (pipelined requests) beyond which reading pauses.
constexpr size_t kMinParkedInputBytes = 64 << 10;
// How long a closing connection keeps discarding input so the client reads the error reply
// instead of a reset.
constexpr std::chrono::milliseconds kLingerTime{1000};

bool ValidHeaderName(const std::string& name) {
  if (name.empty()) return false;
  for (unsigned char c : name) {
    if (c <= 0x20 || c >= 0x7f || c == ':') return false;
  }
  return true;
}

bool ValidHeaderValue(const std::string& value) {
  return value.find_first_of("\r\n", 0, 2) == std::string::npos &&
         value.find('\0') == std::string::npos;
}

bool HasHeader(const Headers& headers, absl::string_view name) {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) return true;
  }
  return false;
}

std::string FormatRemote(const tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  if (address.is_v6()) return absl::StrCat("[", address.to_string(), "]:", endpoint.port());
  return absl::StrCat(address.to_string(), ":", endpoint.port());
}

// A status with a body (not 1xx, 204, 304).
bool StatusHasBody(int status) { return status >= 200 && status != 204 && status != 304; }

}  // namespace

Connection::Connection(ServerCore* core, Strand strand, tcp::socket socket, bool counted)
    : core_(core),
      strand_(std::move(strand)),
      socket_(std::move(socket)),
      read_timer_(strand_),
      write_timer_(strand_),
      counted_(counted) {}

void Connection::Start(bool reject) {
  if (phase_ == Phase::kClosed) return;
  error_code ec;
  socket_.set_option(tcp::no_delay(true), ec);
  const auto endpoint = socket_.remote_endpoint(ec);
  if (!ec) remote_ = FormatRemote(endpoint);
  if (reject) {
    keep_alive_ = false;
    linger_on_close_ = true;
    phase_ = Phase::kResponding;
    std::string body = ErrorBody(503, absl::StrFormat(
        "the server is at its connection limit (%d); retry later", core_->options.max_connections));
    Enqueue(FormatHead(503, {{"Content-Type", "application/json"}, {"Retry-After", "1"}},
                       body.size(), false));
    Enqueue(std::move(body));
    reply_complete_ = true;
    StartWrite();
    return;
  }
  phase_ = Phase::kReading;
  ArmReadDeadline(core_->options.idle_timeout);
  DoRead();
}

void Connection::Drain() {
  draining_ = true;
  if (phase_ == Phase::kReading && !request_started_ && input_.size() == 0 && !writing_) {
    Close();  // idle keep-alive connection
  }
}

void Connection::Close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  error_code ec;
  read_timer_.cancel();
  write_timer_.cancel();
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  if (stream_counted_) {
    stream_counted_ = false;
    core_->open_streams.fetch_sub(1);
  }
  if (current_) {
    std::function<void()> on_close;
    {
      std::lock_guard lock(current_->mu);
      current_->closed = true;
      current_->pending.clear();
      if (!current_->done && !current_->close_fired && current_->on_close) {
        current_->close_fired = true;
        on_close = std::move(current_->on_close);
        current_->on_close = nullptr;
      }
    }
    current_.reset();
    if (on_close) {
      try {
        on_close();
      } catch (const std::exception& e) {
        GLM_LOG_ERROR("http on_close callback threw error={}", e.what());
      }
    }
  }
  out_.clear();
  parser_.reset();
  input_ = beast::flat_buffer();
  if (!reading_) large_chunk_.reset();
  if (counted_) {
    core_->open_connections.fetch_sub(1);
  } else {
    core_->rejecting.fetch_sub(1);
  }
  core_->Unregister(this);
}

// ---- Reading ---------------------------------------------------------------------------------

void Connection::DoRead() {
  if (reading_ || phase_ == Phase::kClosed) return;
  const bool receiving = phase_ == Phase::kReading || phase_ == Phase::kLingering;
  if (!receiving &&
      input_.size() >= std::max(kMinParkedInputBytes, core_->options.max_header_bytes)) {
    return;  // parked pipelined input; resumes when the current reply is done
  }
  // A large chunk only while a request is arriving (or being discarded).
  read_into_large_ = receiving && (request_started_ || phase_ == Phase::kLingering);
  net::mutable_buffer chunk;
  if (read_into_large_) {
    if (!large_chunk_) large_chunk_ = std::make_unique<char[]>(kLargeChunkBytes);
    chunk = net::buffer(large_chunk_.get(), kLargeChunkBytes);
  } else {
    large_chunk_.reset();
    chunk = net::buffer(small_chunk_);
  }
  reading_ = true;
  socket_.async_read_some(chunk, [self = shared_from_this()](const error_code& ec, size_t n) {
    self->OnRead(ec, n);
  });
}

void Connection::OnRead(const error_code& ec, size_t num_bytes) {
  reading_ = false;
  if (phase_ == Phase::kClosed) {
    large_chunk_.reset();
    return;
  }
  if (ec) {
    // EOF or reset. A reply being written finishes first; otherwise the client is gone.
    if (phase_ == Phase::kResponding) {
      peer_eof_ = true;
      keep_alive_ = false;
      linger_on_close_ = false;
      return;
    }
    Close();
    return;
  }
  if (phase_ == Phase::kLingering) {
    DoRead();  // discard
    return;
  }
  const char* data = read_into_large_ ? large_chunk_.get() : small_chunk_.data();
  auto space = input_.prepare(num_bytes);
  std::memcpy(space.data(), data, num_bytes);
  input_.commit(num_bytes);
  if (phase_ == Phase::kReading) {
    if (!request_started_) {
      request_started_ = true;
    } else if (header_done_) {
      read_deadline_ = Clock::now() + core_->options.idle_timeout;  // the body is progressing
    }
    ProcessInput();
  }
  DoRead();
}

void Connection::ProcessInput() {
  while (phase_ == Phase::kReading && input_.size() > 0) {
    request_started_ = true;
    if (!parser_) {
      parser_.emplace();
      parser_->eager(true);
      parser_->header_limit(static_cast<uint32_t>(
          std::min<size_t>(core_->options.max_header_bytes, UINT32_MAX)));
      parser_->body_limit(core_->options.max_body_bytes);
      header_done_ = false;
    }
    error_code ec;
    const size_t used = parser_->put(input_.data(), ec);
    input_.consume(used);
    if (ec == bhttp::error::need_more) return;
    if (ec == bhttp::error::header_limit) {
      FailRequest(431, absl::StrFormat("request header is larger than %d bytes",
                                       core_->options.max_header_bytes));
      return;
    }
    if (ec == bhttp::error::body_limit) {
      FailRequest(413, absl::StrFormat("request body is larger than %d bytes",
                                       core_->options.max_body_bytes));
      return;
    }
    if (ec) {
      FailRequest(400, absl::StrCat("malformed HTTP request: ", ec.message()));
      return;
    }
    if (!header_done_ && parser_->is_header_done()) {
      header_done_ = true;
      OnHeaderDone();
    }
    if (parser_->is_done()) {
      Dispatch();
      return;
    }
    if (used == 0) return;
  }
}

void Connection::OnHeaderDone() {
  ArmReadDeadline(core_->options.idle_timeout);  // the body gets its own inactivity bound
  const auto& message = parser_->get();
  if (message.version() >= 11 && !parser_->is_done()) {
    const auto expect = message[bhttp::field::expect];
    if (absl::EqualsIgnoreCase(absl::string_view(expect.data(), expect.size()), "100-continue")) {
      Enqueue("HTTP/1.1 100 Continue\r\n\r\n");
      StartWrite();
    }
  }
}

void Connection::Dispatch() {
  auto message = parser_->release();
  parser_.reset();
  header_done_ = false;
  CancelReadDeadline();

  Request request;
  request.method = std::string(message.method_string());
  const std::string_view target(message.target().data(), message.target().size());
  const size_t question = target.find('?');
  request.target = std::string(target.substr(0, question));
  if (question != std::string_view::npos) request.query = std::string(target.substr(question + 1));
  request.headers.reserve(std::distance(message.begin(), message.end()));
  for (const auto& field : message) {
    request.headers.emplace_back(
        absl::AsciiStrToLower(absl::string_view(field.name_string().data(),
                                               field.name_string().size())),
        std::string(field.value()));
  }
  request.body = std::move(message.body());
  request.remote = remote_;

  version_ = message.version();
  keep_alive_ = message.keep_alive() && !draining_ && !core_->draining.load();
  head_request_ = message.method() == bhttp::verb::head;
  phase_ = Phase::kWaiting;
  current_ = std::make_shared<ExchangeState>();

  // The core outlives the connection's handlers; the Exchange keeps it alive beyond that.
  auto exchange = std::make_shared<ExchangeImpl>(core_->shared_from_this(), shared_from_this(),
                                                 current_, std::move(request));
  try {
    core_->handler(exchange);
  } catch (const std::exception& e) {
    GLM_LOG_ERROR("http handler threw error={}", e.what());
    Response response;
    response.status = 500;
    response.headers = {{"Content-Type", "application/json"}};
    response.body = ErrorBody(500, "internal error in the request handler");
    exchange->Respond(std::move(response));
  }
  // Dropping the last reference without a reply answers 500 (~ExchangeImpl).
}

void Connection::FailRequest(int status, const std::string& message) {
  parser_.reset();
  header_done_ = false;
  CancelReadDeadline();
  keep_alive_ = false;
  linger_on_close_ = true;
  phase_ = Phase::kResponding;
  std::string body = ErrorBody(status, message);
  Enqueue(FormatHead(status, {{"Content-Type", "application/json"}}, body.size(), false));
  Enqueue(std::move(body));
  reply_complete_ = true;
  StartWrite();
}

// ---- Replies ---------------------------------------------------------------------------------

void Connection::WriteResponse(const std::shared_ptr<ExchangeState>& state, Response response) {
  if (phase_ != Phase::kWaiting || state != current_) return;
  phase_ = Phase::kResponding;
  int status = response.status;
  if (status < 200 || status > 599) status = 500;
  if (core_->draining.load() || draining_) keep_alive_ = false;
  const bool has_body = StatusHasBody(status);
  Enqueue(FormatHead(status, response.headers,
                     has_body ? std::optional<size_t>(response.body.size()) : std::nullopt,
                     false));
  if (has_body && !head_request_ && !response.body.empty()) Enqueue(std::move(response.body));
  reply_complete_ = true;
  StartWrite();
}

void Connection::BeginStream(const std::shared_ptr<ExchangeState>& state, int status,
                             Headers headers) {
  if (phase_ != Phase::kWaiting || state != current_) return;
  phase_ = Phase::kStreaming;
  if (status < 200 || status > 599) status = 500;
  chunked_ = version_ >= 11;
  if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the body ends when the connection closes
  if (core_->draining.load() || draining_) keep_alive_ = false;
  if (!HasHeader(headers, "content-type")) headers.emplace_back("Content-Type", "text/event-stream");
  if (!HasHeader(headers, "cache-control")) headers.emplace_back("Cache-Control", "no-cache");
  if (!HasHeader(headers, "x-accel-buffering")) headers.emplace_back("X-Accel-Buffering", "no");
  Enqueue(FormatHead(status, headers, std::nullopt, chunked_));
  core_->open_streams.fetch_add(1);
  stream_counted_ = true;
  StartWrite();
}

void Connection::FlushStream(const std::shared_ptr<ExchangeState>& state) {
  std::string data;
  bool finish = false;
  {
    std::lock_guard lock(state->mu);
    data = std::move(state->pending);
    state->pending.clear();
    state->flush_posted = false;
    finish = state->finish_requested;
  }
  if (phase_ != Phase::kStreaming || state != current_ || reply_complete_) return;
  if (!data.empty()) {
    const size_t size = data.size();
    if (chunked_) {
      Enqueue(absl::StrFormat("%x\r\n", size));
      Enqueue(std::move(data), size);
      Enqueue("\r\n");
    } else {
      Enqueue(std::move(data), size);
    }
  }
  if (finish) {
    if (chunked_) Enqueue("0\r\n\r\n");
    reply_complete_ = true;
  }
  StartWrite();
}

void Connection::AbortStream(const std::shared_ptr<ExchangeState>& state) {
  if (state == current_) Close();
}

void Connection::FinishExchange() {
  if (stream_counted_) {
    stream_counted_ = false;
    core_->open_streams.fetch_sub(1);
  }
  current_.reset();
  if (!keep_alive_ || peer_eof_ || draining_ || core_->draining.load()) {
    CloseAfterReply(linger_on_close_ || input_.size() > 0);
    return;
  }
  phase_ = Phase::kReading;
  request_started_ = input_.size() > 0;
  ArmReadDeadline(core_->options.idle_timeout);
  ProcessInput();  // a pipelined request may already be here
  DoRead();
}

void Connection::CloseAfterReply(bool linger) {
  if (!linger) {
    Close();
    return;
  }
  // Stop sending, then discard what the client still sends for a moment so that closing does
  // not reset the connection before the client has read the reply.
  error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  phase_ = Phase::kLingering;
  parser_.reset();
  input_ = beast::flat_buffer();
  ArmReadDeadline(std::min<Clock::duration>(kLingerTime, core_->options.idle_timeout));
  DoRead();
}

std::string Connection::FormatHead(int status, const Headers& headers,
                                   std::optional<size_t> content_length, bool chunked) {
  const auto reason = bhttp::obsolete_reason(bhttp::int_to_status(status));
  std::string head = absl::StrCat("HTTP/1.1 ", status, " ",
                                  absl::string_view(reason.data(), reason.size()), "\r\n");
  for (const auto& [name, value] : headers) {
    if (!ValidHeaderName(name) || !ValidHeaderValue(value)) continue;
    if (absl::EqualsIgnoreCase(name, "content-length") ||
        absl::EqualsIgnoreCase(name, "transfer-encoding") ||
        absl::EqualsIgnoreCase(name, "connection")) {
      continue;
    }
    absl::StrAppend(&head, name, ": ", value, "\r\n");
  }
  if (content_length) absl::StrAppend(&head, "Content-Length: ", *content_length, "\r\n");
  if (chunked) head += "Transfer-Encoding: chunked\r\n";
  if (!keep_alive_) {
    head += "Connection: close\r\n";
  } else if (version_ < 11) {
    head += "Connection: keep-alive\r\n";
  }
  head += "\r\n";
  return head;
}

// ---- Writing ---------------------------------------------------------------------------------

void Connection::Enqueue(std::string bytes, size_t stream_bytes) {
  out_.push_back(Out{std::move(bytes), stream_bytes});
}

void Connection::StartWrite() {
  if (writing_ || out_.empty() || phase_ == Phase::kClosed || phase_ == Phase::kLingering) return;
  writing_ = true;
  in_flight_.clear();
  write_buffers_.clear();
  while (!out_.empty()) {
    in_flight_.push_back(std::move(out_.front()));
    out_.pop_front();
  }
  for (const auto& out : in_flight_) write_buffers_.push_back(net::buffer(out.bytes));
  // A client that stops reading must not hold the connection forever.
  const uint64_t generation = ++write_timer_generation_;
  write_timer_.expires_after(core_->options.idle_timeout);
  write_timer_.async_wait([self = shared_from_this(), generation](const error_code& ec) {
    if (ec || generation != self->write_timer_generation_ || !self->writing_) return;
    self->Close();
  });
  net::async_write(socket_, write_buffers_,
                   [self = shared_from_this()](const error_code& ec, size_t) {
                     self->OnWrite(ec);
                   });
}

void Connection::OnWrite(const error_code& ec) {
  writing_ = false;
  ++write_timer_generation_;
  write_timer_.cancel();
  size_t stream_bytes = 0;
  for (const auto& out : in_flight_) stream_bytes += out.stream_bytes;
  in_flight_.clear();
  write_buffers_.clear();
  if (phase_ == Phase::kClosed) return;
  if (ec) {
    Close();
    return;
  }
  if (stream_bytes > 0 && current_) {
    std::lock_guard lock(current_->mu);
    current_->unsent_bytes -= std::min(stream_bytes, current_->unsent_bytes);
  }
  if (!out_.empty()) {
    StartWrite();
    return;
  }
  if (reply_complete_ && (phase_ == Phase::kResponding || phase_ == Phase::kStreaming)) {
    reply_complete_ = false;
    FinishExchange();
  }
}

// ---- Deadlines -------------------------------------------------------------------------------

void Connection::ArmReadDeadline(Clock::duration timeout) {
  read_deadline_ = Clock::now() + timeout;
  read_deadline_active_ = true;
  ++read_timer_generation_;
  WaitReadDeadline();
}

void Connection::WaitReadDeadline() {
  const uint64_t generation = read_timer_generation_;
  read_timer_.expires_at(read_deadline_);
  read_timer_.async_wait([self = shared_from_this(), generation](const error_code& ec) {
    if (ec || generation != self->read_timer_generation_ || !self->read_deadline_active_) return;
    if (Clock::now() < self->read_deadline_) {
      self->WaitReadDeadline();  // extended while the body was arriving
      return;
    }
    self->OnReadDeadline();
  });
}

void Connection::CancelReadDeadline() {
  read_deadline_active_ = false;
  ++read_timer_generation_;
  read_timer_.cancel();
}

void Connection::OnReadDeadline() {
  read_deadline_active_ = false;
  if (phase_ == Phase::kReading) {
    if (request_started_ || input_.size() > 0) {
      FailRequest(408, absl::StrFormat("no complete request within %d ms",
                                       core_->options.idle_timeout.count()));
    } else {
      Close();  // idle keep-alive connection
    }
    return;
  }
  if (phase_ == Phase::kLingering) Close();
}

}  // namespace glm::http::internal
