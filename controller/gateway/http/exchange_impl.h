// Internal to glm_http_server: the Exchange and Stream a handler gets. Both only lock the shared
// ExchangeState and post work onto their connection's strand, so any thread may call them.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "controller/gateway/http/connection.h"
#include "controller/gateway/http/http_server.h"
#include "controller/gateway/http/server_core.h"

namespace glm::http::internal {

// Runs `on_close` once for a state that is already closed: on the strand when the server still
// runs, else here.
void RunClosedCallback(const std::shared_ptr<ServerCore>& core, const Strand& strand,
                       std::function<void()> on_close);

class StreamImpl final : public Stream {
 public:
  StreamImpl(std::shared_ptr<ServerCore> core, std::shared_ptr<Connection> connection,
             std::shared_ptr<ExchangeState> state);

  bool Send(std::string data) override;
  void Finish() override;
  void OnClose(std::function<void()> on_close) override;
  bool closed() const override;

 private:
  // Declared first: the connection (and its socket) dies before the io_context can.
  const std::shared_ptr<ServerCore> core_;
  const std::shared_ptr<Connection> connection_;
  const std::shared_ptr<ExchangeState> state_;
};

class ExchangeImpl final : public Exchange {
 public:
  ExchangeImpl(std::shared_ptr<ServerCore> core, std::shared_ptr<Connection> connection,
               std::shared_ptr<ExchangeState> state, Request request_in);
  // Answers 500 when the handler dropped the exchange without a reply.
  ~ExchangeImpl() override;

  void Respond(Response response) override;
  std::shared_ptr<Stream> StartStream(int status, Headers headers) override;
  void OnClose(std::function<void()> on_close) override;
  bool client_gone() const override;

 private:
  // The first answer wins: it is written on the connection's strand unless the client is gone.
  // nullopt: the handler dropped the exchange unanswered, the client gets 500.
  void Answer(std::optional<Response> response);

  const std::shared_ptr<ServerCore> core_;
  const std::shared_ptr<Connection> connection_;
  const std::shared_ptr<ExchangeState> state_;
};

// The OpenAI-shaped error body: {"error":{"message":...,"type":...,"param":null,"code":N}}.
std::string ErrorBody(int status, const std::string& message);

}  // namespace glm::http::internal
