// Fakes of http::Exchange and http::Stream for handler tests without sockets: they record what
// the handler answered, and CloseClient() plays a client that goes away (runs on_close inline).
// Thread-safe like the real ones.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "controller/gateway/http/http_server.h"

namespace glm::http {

class FakeStream final : public Stream {
 public:
  bool Send(std::string data) override {
    std::lock_guard lock(mu_);
    if (closed_ || finished_) return false;
    sent_.push_back(std::move(data));
    return true;
  }
  void Finish() override {
    std::lock_guard lock(mu_);
    if (!closed_) finished_ = true;
  }
  void OnClose(std::function<void()> on_close) override {
    std::unique_lock lock(mu_);
    if (finished_ || fired_) return;
    if (!closed_) {
      on_close_ = std::move(on_close);
      return;
    }
    fired_ = true;
    lock.unlock();
    if (on_close) on_close();
  }
  bool closed() const override {
    std::lock_guard lock(mu_);
    return closed_ || finished_;
  }

  // The client goes away: Send returns false from now on; on_close runs here, once, if the
  // stream was not finished.
  void CloseClient() {
    std::function<void()> on_close;
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      closed_ = true;
      if (!finished_ && !fired_ && on_close_) {
        fired_ = true;
        on_close = std::move(on_close_);
      }
    }
    if (on_close) on_close();
  }

  std::vector<std::string> sent() const {
    std::lock_guard lock(mu_);
    return sent_;
  }
  std::string joined() const {
    std::lock_guard lock(mu_);
    std::string all;
    for (const auto& data : sent_) all += data;
    return all;
  }
  bool finished() const {
    std::lock_guard lock(mu_);
    return finished_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> sent_;
  bool finished_ = false;
  bool closed_ = false;
  bool fired_ = false;
  std::function<void()> on_close_;
};

class FakeExchange final : public Exchange {
 public:
  explicit FakeExchange(Request request_in = {}) { request = std::move(request_in); }

  void Respond(Response response) override {
    std::lock_guard lock(mu_);
    if (answered_) return;
    answered_ = true;
    response_ = std::move(response);
  }
  std::shared_ptr<Stream> StartStream(int status, Headers headers) override {
    std::lock_guard lock(mu_);
    auto stream = std::make_shared<FakeStream>();
    if (answered_) {
      stream->CloseClient();
      return stream;
    }
    answered_ = true;
    stream_status_ = status;
    stream_headers_ = std::move(headers);
    stream_ = stream;
    if (client_gone_) stream->CloseClient();
    if (on_close_) stream->OnClose(std::move(on_close_));
    return stream;
  }
  void OnClose(std::function<void()> on_close) override {
    std::unique_lock lock(mu_);
    if (stream_) {
      auto stream = stream_;
      lock.unlock();
      stream->OnClose(std::move(on_close));
      return;
    }
    if (response_) return;
    if (!client_gone_) {
      on_close_ = std::move(on_close);
      return;
    }
    lock.unlock();
    if (on_close) on_close();
  }
  bool client_gone() const override {
    std::lock_guard lock(mu_);
    return client_gone_;
  }

  // The client goes away before the reply; on_close runs here.
  void CloseClient() {
    std::function<void()> on_close;
    std::shared_ptr<FakeStream> stream;
    {
      std::lock_guard lock(mu_);
      if (client_gone_) return;
      client_gone_ = true;
      stream = stream_;
      if (!stream && !response_) on_close = std::move(on_close_);
    }
    if (stream) stream->CloseClient();
    if (on_close) on_close();
  }

  std::optional<Response> response() const {
    std::lock_guard lock(mu_);
    return response_;
  }
  std::shared_ptr<FakeStream> stream() const {
    std::lock_guard lock(mu_);
    return stream_;
  }
  int stream_status() const {
    std::lock_guard lock(mu_);
    return stream_status_;
  }
  Headers stream_headers() const {
    std::lock_guard lock(mu_);
    return stream_headers_;
  }

 private:
  mutable std::mutex mu_;
  bool answered_ = false;
  bool client_gone_ = false;
  std::optional<Response> response_;
  std::shared_ptr<FakeStream> stream_;
  int stream_status_ = 0;
  Headers stream_headers_;
  std::function<void()> on_close_;
};

}  // namespace glm::http
