#include "controller/gateway/http/exchange_impl.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace glm::http::internal {
namespace {

std::string JsonEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

const char* ErrorType(int status) {
  if (status == 503) return "ServiceUnavailableError";
  if (status >= 500) return "InternalServerError";
  return "BadRequestError";
}

}  // namespace

std::string ErrorBody(int status, const std::string& message) {
  return absl::StrFormat(R"({"error":{"message":"%s","type":"%s","param":null,"code":%d}})",
                         JsonEscape(message), ErrorType(status), status);
}

void RunClosedCallback(const std::shared_ptr<ServerCore>& core, const Strand& strand,
                       std::function<void()> on_close) {
  auto shared = std::make_shared<std::function<void()>>(std::move(on_close));
  if (!core->PostIfRunning(strand, [shared] { (*shared)(); })) (*shared)();
}

StreamImpl::StreamImpl(std::shared_ptr<ServerCore> core, std::shared_ptr<Connection> connection,
                       std::shared_ptr<ExchangeState> state)
    : core_(std::move(core)), connection_(std::move(connection)), state_(std::move(state)) {}

bool StreamImpl::Send(std::string data) {
  std::unique_lock lock(state_->mu);
  if (state_->closed || state_->finish_requested) return false;
  if (data.empty()) return true;
  if (state_->unsent_bytes + data.size() > core_->options.max_stream_buffer_bytes) {
    // The client stopped reading: close rather than grow without bound.
    state_->closed = true;
    state_->pending.clear();
    lock.unlock();
    core_->PostIfRunning(connection_->strand(), [connection = connection_, state = state_] {
      connection->AbortStream(state);
    });
    return false;
  }
  state_->unsent_bytes += data.size();
  if (state_->pending.empty()) {
    state_->pending = std::move(data);
  } else {
    state_->pending += data;
  }
  if (state_->flush_posted) return true;
  state_->flush_posted = true;
  lock.unlock();
  if (!core_->PostIfRunning(connection_->strand(), [connection = connection_, state = state_] {
        connection->FlushStream(state);
      })) {
    std::lock_guard relock(state_->mu);
    state_->closed = true;
    return false;
  }
  return true;
}

void StreamImpl::Finish() {
  {
    std::lock_guard lock(state_->mu);
    if (state_->finish_requested || state_->closed) return;
    state_->finish_requested = true;
    state_->done = true;
    state_->on_close = nullptr;
    if (state_->flush_posted) return;
    state_->flush_posted = true;
  }
  core_->PostIfRunning(connection_->strand(), [connection = connection_, state = state_] {
    connection->FlushStream(state);
  });
}

void StreamImpl::OnClose(std::function<void()> on_close) {
  std::unique_lock lock(state_->mu);
  if (state_->done || state_->close_fired) return;
  if (!state_->closed) {
    state_->on_close = std::move(on_close);
    return;
  }
  // Closed, and the connection's close has not run a callback (none was set then, or the
  // overflow abort is still queued and will find close_fired set).
  state_->close_fired = true;
  state_->on_close = nullptr;
  lock.unlock();
  if (on_close) RunClosedCallback(core_, connection_->strand(), std::move(on_close));
}

bool StreamImpl::closed() const {
  std::lock_guard lock(state_->mu);
  return state_->closed || state_->finish_requested;
}

ExchangeImpl::ExchangeImpl(std::shared_ptr<ServerCore> core,
                           std::shared_ptr<Connection> connection,
                           std::shared_ptr<ExchangeState> state, Request request_in)
    : core_(std::move(core)), connection_(std::move(connection)), state_(std::move(state)) {
  request = std::move(request_in);
}

ExchangeImpl::~ExchangeImpl() { Answer(std::nullopt); }

void ExchangeImpl::Respond(Response response) { Answer(std::move(response)); }

void ExchangeImpl::Answer(std::optional<Response> given) {
  {
    std::lock_guard lock(state_->mu);
    if (state_->answered) return;
    state_->answered = true;
    state_->done = true;
    state_->on_close = nullptr;
    if (state_->closed) return;
  }
  Response response;
  if (given) {
    response = std::move(*given);
  } else {
    response.status = 500;
    response.headers = {{"Content-Type", "application/json"}};
    response.body = ErrorBody(500, "the server dropped the request without a reply");
  }
  core_->PostIfRunning(connection_->strand(), [connection = connection_, state = state_,
                                               response = std::move(response)]() mutable {
    connection->WriteResponse(state, std::move(response));
  });
}

std::shared_ptr<Stream> ExchangeImpl::StartStream(int status, Headers headers) {
  auto stream = std::make_shared<StreamImpl>(core_, connection_, state_);
  {
    std::lock_guard lock(state_->mu);
    if (state_->answered) {
      // Not this exchange's stream: hand back one that is already closed.
      auto orphan = std::make_shared<ExchangeState>();
      orphan->answered = orphan->done = orphan->closed = true;
      return std::make_shared<StreamImpl>(core_, connection_, std::move(orphan));
    }
    state_->answered = true;
    if (state_->closed) return stream;
  }
  if (!core_->PostIfRunning(connection_->strand(),
                            [connection = connection_, state = state_, status,
                             headers = std::move(headers)]() mutable {
                              connection->BeginStream(state, status, std::move(headers));
                            })) {
    std::lock_guard lock(state_->mu);
    state_->closed = true;
  }
  return stream;
}

void ExchangeImpl::OnClose(std::function<void()> on_close) {
  StreamImpl(core_, connection_, state_).OnClose(std::move(on_close));
}

bool ExchangeImpl::client_gone() const {
  std::lock_guard lock(state_->mu);
  return state_->closed;
}

}  // namespace glm::http::internal
