// Loopback tests of the HTTP server through raw sockets: every wait is bounded by a deadline.
#include "controller/gateway/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::http {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kWait{5000};  // the bound on every wait that should succeed at once

// Polls `done` until it holds or `timeout` passes.
template <class Pred>
bool WaitUntil(Pred done, milliseconds timeout = kWait) {
  const auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

struct ParsedResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-cased names
  std::string body;
  bool terminated = false;  // chunked: the terminator arrived
};

// A blocking loopback client whose reads all take a deadline.
class Client {
 public:
  explicit Client(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      connect_errno_ = errno;
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~Client() { Close(); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool connected() const { return fd_ >= 0; }
  int connect_errno() const { return connect_errno_; }
  bool eof() const { return eof_; }
  std::string& buffer() { return buffer_; }

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Closes with a reset (SO_LINGER 0), as a crashing client would.
  void Reset() {
    linger option{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &option, sizeof(option));
    Close();
  }

  bool Send(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Receives once; false on timeout, EOF or error.
  bool ReadMore(Clock::time_point deadline) {
    if (eof_ || fd_ < 0) return false;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char chunk[16384];
    const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  // True when the server closes the connection before `timeout`.
  bool WaitForEof(milliseconds timeout = kWait) {
    const auto deadline = Clock::now() + timeout;
    while (!eof_) {
      if (!ReadMore(deadline) && !eof_) return false;
    }
    return true;
  }

  // The status line and headers of the next response (1xx included).
  std::optional<ParsedResponse> ReadHead(milliseconds timeout = kWait) {
    const auto deadline = Clock::now() + timeout;
    size_t end;
    while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!ReadMore(deadline)) return std::nullopt;
    }
    ParsedResponse response;
    std::vector<std::string> lines = absl::StrSplit(buffer_.substr(0, end), "\r\n");
    buffer_.erase(0, end + 4);
    std::vector<std::string> status_line = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
    if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &response.status)) {
      return std::nullopt;
    }
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == std::string::npos) return std::nullopt;
      response.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
    return response;
  }

  // The data of the next chunk; "" for the terminator; nullopt on timeout or EOF.
  std::optional<std::string> ReadChunk(milliseconds timeout = kWait) {
    const auto deadline = Clock::now() + timeout;
    size_t line_end;
    while ((line_end = buffer_.find("\r\n")) == std::string::npos) {
      if (!ReadMore(deadline)) return std::nullopt;
    }
    size_t size = 0;
    if (!absl::SimpleHexAtoi(buffer_.substr(0, line_end), &size)) return std::nullopt;
    const size_t need = line_end + 2 + size + 2;
    while (buffer_.size() < need) {
      if (!ReadMore(deadline)) return std::nullopt;
    }
    std::string data = buffer_.substr(line_end + 2, size);
    buffer_.erase(0, need);
    return data;
  }

  // A whole response: Content-Length, chunked or close-delimited.
  std::optional<ParsedResponse> ReadResponse(milliseconds timeout = kWait) {
    const auto deadline = Clock::now() + timeout;
    auto response = ReadHead(timeout);
    if (!response) return std::nullopt;
    const auto encoding = response->headers.find("transfer-encoding");
    if (encoding != response->headers.end() && encoding->second == "chunked") {
      for (;;) {
        auto chunk = ReadChunk(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
        if (!chunk) return std::nullopt;
        if (chunk->empty()) break;
        response->body += *chunk;
      }
      response->terminated = true;
    } else if (response->headers.count("content-length")) {
      size_t length = 0;
      if (!absl::SimpleAtoi(response->headers["content-length"], &length)) return std::nullopt;
      while (buffer_.size() < length) {
        if (!ReadMore(deadline)) return std::nullopt;
      }
      response->body = buffer_.substr(0, length);
      buffer_.erase(0, length);
    } else {
      while (ReadMore(deadline)) {
      }
      if (!eof_) return std::nullopt;
      response->body = std::move(buffer_);
      buffer_.clear();
    }
    return response;
  }

 private:
  int fd_ = -1;
  int connect_errno_ = 0;
  bool eof_ = false;
  std::string buffer_;
};

std::string Get(absl::string_view target, absl::string_view extra_headers = "") {
  return absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: test\r\n", extra_headers, "\r\n");
}

std::string Post(absl::string_view target, absl::string_view body) {
  return absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: test\r\nContent-Type: text/plain\r\n",
                      "Content-Length: ", body.size(), "\r\n\r\n", body);
}

// Answers "<method> <target> ?<query> x-test=<header> body=<body>".
void Echo(std::shared_ptr<Exchange> exchange) {
  const Request& request = exchange->request;
  const std::string* header = request.Header("x-test");
  Response response;
  response.headers = {{"Content-Type", "text/plain"}, {"X-Remote", request.remote}};
  response.body = absl::StrCat(request.method, " ", request.target, " ?", request.query,
                               " x-test=", header ? *header : "(none)", " body=", request.body);
  exchange->Respond(std::move(response));
}

// Streams handed out by a handler, for the test thread to drive.
class StreamBox {
 public:
  void Add(std::shared_ptr<Stream> stream) {
    std::lock_guard lock(mu_);
    streams_.push_back(std::move(stream));
  }
  size_t size() {
    std::lock_guard lock(mu_);
    return streams_.size();
  }
  std::shared_ptr<Stream> at(size_t i) {
    std::lock_guard lock(mu_);
    return streams_.at(i);
  }
  std::vector<std::shared_ptr<Stream>> all() {
    std::lock_guard lock(mu_);
    return streams_;
  }

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<Stream>> streams_;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions options, Handler handler) {
    auto server = Server::Start(std::move(options), std::move(handler));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  int port() const { return server_->port(); }

  std::unique_ptr<Server> server_;
};

TEST_F(HttpServerTest, AnswersGetAndPost) {
  StartServer({}, Echo);
  ASSERT_GT(port(), 0);
  Client client(port());
  ASSERT_TRUE(client.connected());

  ASSERT_TRUE(client.Send(Get("/v1/models?limit=2&x=%20", "X-Test: Hello\r\n")));
  auto get = client.ReadResponse();
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 200);
  EXPECT_EQ(get->body, "GET /v1/models ?limit=2&x=%20 x-test=Hello body=");
  EXPECT_EQ(get->headers["content-type"], "text/plain");
  EXPECT_THAT(get->headers["x-remote"], HasSubstr("127.0.0.1:"));

  ASSERT_TRUE(client.Send(Post("/v1/chat/completions", R"({"model":"glm"})")));
  auto post = client.ReadResponse();
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 200);
  EXPECT_EQ(post->body, R"(POST /v1/chat/completions ? x-test=(none) body={"model":"glm"})");
}

TEST_F(HttpServerTest, KeepsAliveAndAnswersPipelinedRequestsInOrder) {
  StartServer({}, Echo);
  Client client(port());
  ASSERT_TRUE(client.Send(Get("/first")));
  auto first = client.ReadResponse();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->body, "GET /first ? x-test=(none) body=");
  EXPECT_EQ(first->headers.count("connection"), 0u);

  // Three requests in one packet, the middle one chunked.
  ASSERT_TRUE(client.Send(absl::StrCat(
      Get("/a"),
      "POST /b HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n"
      "0\r\n\r\n",
      Get("/c", "Connection: close\r\n"))));
  for (const char* expected :
       {"GET /a ? x-test=(none) body=", "POST /b ? x-test=(none) body=abcde",
        "GET /c ? x-test=(none) body="}) {
    auto response = client.ReadResponse();
    ASSERT_TRUE(response) << expected;
    EXPECT_EQ(response->body, expected);
  }
  EXPECT_TRUE(client.WaitForEof());
  EXPECT_TRUE(WaitUntil([&] { return server_->open_connections() == 0; }));
}

TEST_F(HttpServerTest, Http10ClosesAfterTheReplyUnlessKeepAlive) {
  StartServer({}, Echo);
  Client close_client(port());
  ASSERT_TRUE(close_client.Send("GET /old HTTP/1.0\r\n\r\n"));
  auto response = close_client.ReadResponse();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->headers["connection"], "close");
  EXPECT_TRUE(close_client.WaitForEof());

  Client keep_client(port());
  ASSERT_TRUE(keep_client.Send("GET /1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  auto first = keep_client.ReadResponse();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->headers["connection"], "keep-alive");
  ASSERT_TRUE(keep_client.Send("GET /2 HTTP/1.0\r\n\r\n"));
  auto second = keep_client.ReadResponse();
  ASSERT_TRUE(second);
  EXPECT_EQ(second->body, "GET /2 ? x-test=(none) body=");
}

TEST_F(HttpServerTest, BodyOverTheLimitAnswers413) {
  ServerOptions options;
  options.max_body_bytes = 1024;
  StartServer(options, Echo);
  const std::string expected =
      R"({"error":{"message":"request body is larger than 1024 bytes","type":"BadRequestError",)"
      R"("param":null,"code":413}})";

  Client declared(port());  // Content-Length over the limit: answered before the body is read
  ASSERT_TRUE(declared.Send(
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2048\r\n\r\n"));
  auto response = declared.ReadResponse();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 413);
  EXPECT_EQ(response->headers["content-type"], "application/json");
  EXPECT_EQ(response->body, expected);
  EXPECT_TRUE(declared.WaitForEof());

  Client chunked(port());  // chunked: answered when the body passes the limit
  ASSERT_TRUE(chunked.Send(absl::StrCat(
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n",
      "400\r\n", std::string(1024, 'x'), "\r\n10\r\n", std::string(16, 'y'), "\r\n0\r\n\r\n")));
  auto chunked_response = chunked.ReadResponse();
  ASSERT_TRUE(chunked_response);
  EXPECT_EQ(chunked_response->status, 413);
  EXPECT_EQ(chunked_response->body, expected);

  Client at_limit(port());
  ASSERT_TRUE(at_limit.Send(Post("/ok", std::string(1024, 'z'))));
  auto ok = at_limit.ReadResponse();
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST_F(HttpServerTest, HeaderOverTheLimitAnswers431) {
  ServerOptions options;
  options.max_header_bytes = 1024;
  StartServer(options, Echo);
  Client client(port());
  ASSERT_TRUE(client.Send(Get("/", absl::StrCat("X-Big: ", std::string(4096, 'h'), "\r\n"))));
  auto response = client.ReadResponse();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 431);
  EXPECT_THAT(response->body, HasSubstr("request header is larger than 1024 bytes"));
  EXPECT_TRUE(client.WaitForEof());
}

TEST_F(HttpServerTest, MalformedRequestAnswers400AndCloses) {
  StartServer({}, Echo);
  for (const char* garbage :
       {"HELLO WORLD\r\n\r\n", "GET / HTTP/9.9\r\n\r\n", "GET / HTTP/1.1\r\nNo colon here\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"}) {
    Client client(port());
    ASSERT_TRUE(client.Send(garbage));
    auto response = client.ReadResponse();
    ASSERT_TRUE(response) << garbage;
    EXPECT_EQ(response->status, 400) << garbage;
    EXPECT_THAT(response->body, HasSubstr("malformed HTTP request")) << garbage;
    EXPECT_TRUE(client.WaitForEof()) << garbage;
  }
  Client after(port());
  ASSERT_TRUE(after.Send(Get("/still-up")));
  auto response = after.ReadResponse();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
}

TEST_F(HttpServerTest, RandomBytesNeverCrashTheServer) {
  StartServer({}, Echo);
  std::mt19937 random(1234);  // fixed seed: reproducible
  const std::string alphabet = "GET POST HTTP/1.1\r\n:0123456789abcdef \t;chunked-Length\x01\xff";
  for (int i = 0; i < 100; ++i) {
    Client client(port());
    ASSERT_TRUE(client.connected());
    std::string input = i % 2 ? "POST / HTTP/1.1\r\n" : "";
    const int length = static_cast<int>(random() % 300);
    for (int j = 0; j < length; ++j) input += alphabet[random() % alphabet.size()];
    client.Send(input);
    if (i % 3 == 0) client.Reset();
  }
  Client after(port());
  ASSERT_TRUE(after.Send(Get("/alive")));
  auto response = after.ReadResponse();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
}

TEST_F(HttpServerTest, Expect100ContinueGetsAnInterimReply) {
  StartServer({}, Echo);
  Client client(port());
  ASSERT_TRUE(client.Send(
      "POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  auto interim = client.ReadHead();
  ASSERT_TRUE(interim);
  EXPECT_EQ(interim->status, 100);
  ASSERT_TRUE(client.Send("hello"));
  auto response = client.ReadResponse();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "POST /up ? x-test=(none) body=hello");
}

TEST_F(HttpServerTest, AnswersFromAnotherThreadLater) {
  std::vector<std::thread> responders;
  std::mutex mu;
  StartServer({}, [&](std::shared_ptr<Exchange> exchange) {
    std::lock_guard lock(mu);
    responders.emplace_back([exchange] {
      std::this_thread::sleep_for(milliseconds(50));  // the delay is what this test is about
      exchange->Respond({.status = 201, .headers = {{"Content-Type", "application/json"}},
                         .body = R"({"late":true})"});
    });
  });
  Client client(port());
  const auto start = Clock::now();
  ASSERT_TRUE(client.Send(Post("/late", "x")));
  auto response = client.ReadResponse();
  ASSERT_TRUE(response);
  EXPECT_GE(Clock::now() - start, milliseconds(50));
  EXPECT_EQ(response->status, 201);
  EXPECT_EQ(response->body, R"({"late":true})");
  // The connection is still good for the next request.
  ASSERT_TRUE(client.Send(Get("/again")));
  EXPECT_TRUE(client.ReadResponse());
  std::lock_guard lock(mu);
  for (auto& thread : responders) thread.join();
}

TEST_F(HttpServerTest, DroppedOrThrowingHandlerAnswers500) {
  StartServer({}, [](std::shared_ptr<Exchange> exchange) {
    if (exchange->request.target == "/throw") throw std::runtime_error("boom");
  });
  Client client(port());
  ASSERT_TRUE(client.Send(Get("/drop")));
  auto dropped = client.ReadResponse();
  ASSERT_TRUE(dropped);
  EXPECT_EQ(dropped->status, 500);
  EXPECT_THAT(dropped->body, HasSubstr("InternalServerError"));
  ASSERT_TRUE(client.Send(Get("/throw")));
  auto thrown = client.ReadResponse();
  ASSERT_TRUE(thrown);
  EXPECT_EQ(thrown->status, 500);
}

TEST_F(HttpServerTest, StreamsEventsInOrderAndKeepsTheConnection) {
  StreamBox box;
  StartServer({}, [&](std::shared_ptr<Exchange> exchange) {
    if (exchange->request.target == "/plain") return Echo(exchange);
    box.Add(exchange->StartStream(200, {{"X-Request-Id", "r1"}}));
  });
  Client client(port());
  ASSERT_TRUE(client.Send(Post("/v1/chat/completions", R"({"stream":true})")));
  auto head = client.ReadHead();
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->headers["content-type"], "text/event-stream");
  EXPECT_EQ(head->headers["cache-control"], "no-cache");
  EXPECT_EQ(head->headers["transfer-encoding"], "chunked");
  EXPECT_EQ(head->headers["x-request-id"], "r1");
  ASSERT_TRUE(WaitUntil([&] { return box.size() == 1; }));
  EXPECT_EQ(server_->open_streams(), 1);

  std::thread producer([stream = box.at(0)] {
    for (int i = 0; i < 100; ++i) EXPECT_TRUE(stream->Send(absl::StrCat("data: ", i, "\n\n")));
    stream->Finish();
    EXPECT_FALSE(stream->Send("data: late\n\n"));
    EXPECT_TRUE(stream->closed());
  });
  std::string events;
  for (;;) {
    auto chunk = client.ReadChunk();
    ASSERT_TRUE(chunk) << "stream ended without its terminator after: " << events;
    if (chunk->empty()) break;
    events += *chunk;
  }
  producer.join();
  std::string expected;
  for (int i = 0; i < 100; ++i) absl::StrAppend(&expected, "data: ", i, "\n\n");
  EXPECT_EQ(events, expected);
  EXPECT_TRUE(WaitUntil([&] { return server_->open_streams() == 0; }));

  ASSERT_TRUE(client.Send(Get("/plain")));
  auto next = client.ReadResponse();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->body, "GET /plain ? x-test=(none) body=");
}

TEST_F(HttpServerTest, Http10StreamIsCloseDelimited) {
  StartServer({}, [](std::shared_ptr<Exchange> exchange) {
    auto stream = exchange->StartStream(200, {});
    stream->Send("data: 1\n\n");
    stream->Send("data: 2\n\n");
    stream->Finish();
  });
  Client client(port());
  ASSERT_TRUE(client.Send("GET /s HTTP/1.0\r\n\r\n"));
  auto response = client.ReadResponse();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->headers.count("transfer-encoding"), 0u);
  EXPECT_EQ(response->body, "data: 1\n\ndata: 2\n\n");
}

TEST_F(HttpServerTest, ClientDisconnectMidStreamFiresOnCloseWhileQuiet) {
  StreamBox box;
  std::atomic<int> on_close_runs{0};
  StartServer({}, [&](std::shared_ptr<Exchange> exchange) {
    auto stream = exchange->StartStream(200, {});
    stream->OnClose([&] { ++on_close_runs; });
    EXPECT_TRUE(stream->Send("data: first\n\n"));
    box.Add(std::move(stream));
  });
  int round = 0;
  for (bool reset : {false, true}) {
    ++round;
    Client client(port());
    ASSERT_TRUE(client.Send(Get("/stream")));
    ASSERT_TRUE(client.ReadHead());
    auto first = client.ReadChunk();
    ASSERT_TRUE(first);
    EXPECT_EQ(*first, "data: first\n\n");
    ASSERT_TRUE(WaitUntil([&] { return server_->open_streams() == 1; }));
    // Nothing more is sent: only the pending read can notice the client leaving.
    reset ? client.Reset() : client.Close();
    EXPECT_TRUE(WaitUntil([&] { return on_close_runs == round; }, milliseconds(1000)))
        << "reset=" << reset;
    auto stream = box.at(box.size() - 1);
    EXPECT_TRUE(stream->closed());
    EXPECT_FALSE(stream->Send("data: after\n\n"));
    stream->Finish();  // harmless
    EXPECT_TRUE(WaitUntil([&] { return server_->open_streams() == 0; }));
    EXPECT_TRUE(WaitUntil([&] { return server_->open_connections() == 0; }));
  }
  EXPECT_EQ(on_close_runs, 2);
}

TEST_F(HttpServerTest, ClientDisconnectBeforeTheReplyFiresExchangeOnClose) {
  std::shared_ptr<Exchange> held;
  std::mutex mu;
  absl::Notification closed;
  StartServer({}, [&](std::shared_ptr<Exchange> exchange) {
    exchange->OnClose([&closed] { closed.Notify(); });
    std::lock_guard lock(mu);
    held = std::move(exchange);
  });
  {
    Client client(port());
    ASSERT_TRUE(client.Send(Post("/v1/completions", "{}")));
    ASSERT_TRUE(WaitUntil([&] {
      std::lock_guard lock(mu);
      return held != nullptr;
    }));
  }
  ASSERT_TRUE(closed.WaitForNotificationWithTimeout(absl::Seconds(1)));
  std::lock_guard lock(mu);
  EXPECT_TRUE(held->client_gone());
  held->Respond({.status = 200, .body = "too late"});  // harmless
  EXPECT_TRUE(held->StartStream(200, {})->closed());  // answered already: a closed stream
  EXPECT_TRUE(WaitUntil([&] { return server_->open_connections() == 0; }));
}

TEST_F(HttpServerTest, GracefulShutdownLetsAnOpenStreamFinish) {
  StreamBox box;
  std::atomic<bool> on_close_ran{false};
  StartServer({}, [&](std::shared_ptr<Exchange> exchange) {
    auto stream = exchange->StartStream(200, {});
    stream->OnClose([&] { on_close_ran = true; });
    box.Add(std::move(stream));
  });
  const int server_port = port();
  Client client(server_port);
  ASSERT_TRUE(client.Send(Get("/stream")));
  ASSERT_TRUE(client.ReadHead());
  ASSERT_TRUE(WaitUntil([&] { return box.size() == 1; }));
  auto stream = box.at(0);
  ASSERT_TRUE(stream->Send("data: 0\n\n"));
  Client idle(server_port);  // an idle keep-alive connection closes at once
  ASSERT_TRUE(WaitUntil([&] { return server_->open_connections() == 2; }));

  const auto start = Clock::now();
  std::thread shutdown([&] { server_->Shutdown(milliseconds(10000)); });
  // Shutdown has begun once new connections are refused.
  EXPECT_TRUE(WaitUntil([&] { return Client(server_port).connect_errno() == ECONNREFUSED; }));
  EXPECT_TRUE(idle.WaitForEof());
  for (int i = 1; i <= 10; ++i) EXPECT_TRUE(stream->Send(absl::StrCat("data: ", i, "\n\n")));
  stream->Finish();
  shutdown.join();
  EXPECT_LT(Clock::now() - start, milliseconds(5000));

  std::string events;
  for (;;) {
    auto chunk = client.ReadChunk();
    ASSERT_TRUE(chunk) << "no terminator after: " << events;
    if (chunk->empty()) break;
    events += *chunk;
  }
  std::string expected;
  for (int i = 0; i <= 10; ++i) absl::StrAppend(&expected, "data: ", i, "\n\n");
  EXPECT_EQ(events, expected);
  EXPECT_TRUE(client.WaitForEof());
  EXPECT_FALSE(on_close_ran);
  EXPECT_EQ(server_->open_streams(), 0);
  EXPECT_EQ(server_->open_connections(), 0);
}

TEST_F(HttpServerTest, ShutdownWithoutGraceClosesStreams) {
  StreamBox box;
  std::atomic<int> on_close_runs{0};
  StartServer({}, [&](std::shared_ptr<Exchange> exchange) {
    auto stream = exchange->StartStream(200, {});
    stream->OnClose([&] { ++on_close_runs; });
    stream->Send("data: 0\n\n");
    box.Add(std::move(stream));
  });
  Client client(port());
  ASSERT_TRUE(client.Send(Get("/stream")));
  ASSERT_TRUE(client.ReadHead());
  ASSERT_TRUE(client.ReadChunk());
  server_->Shutdown(milliseconds(0));
  EXPECT_EQ(on_close_runs, 1);
  auto stream = box.at(0);
  EXPECT_TRUE(stream->closed());
  EXPECT_FALSE(stream->Send("data: 1\n\n"));
  EXPECT_FALSE(client.ReadChunk().has_value());  // no terminator: the connection just ends
  EXPECT_TRUE(client.eof());
  EXPECT_EQ(server_->open_streams(), 0);
  server_->Shutdown(milliseconds(0));  // idempotent
}

TEST_F(HttpServerTest, RepliesAfterTheServerIsGoneAreHarmless) {
  std::shared_ptr<Exchange> held;
  std::mutex mu;
  StartServer({}, [&](std::shared_ptr<Exchange> exchange) {
    std::lock_guard lock(mu);
    held = std::move(exchange);
  });
  Client client(port());
  ASSERT_TRUE(client.Send(Get("/slow")));
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard lock(mu);
    return held != nullptr;
  }));
  server_.reset();  // Shutdown(0)
  std::lock_guard lock(mu);
  EXPECT_TRUE(held->client_gone());
  auto stream = held->StartStream(200, {});
  EXPECT_TRUE(stream->closed());
  EXPECT_FALSE(stream->Send("data: x\n\n"));
  bool ran = false;
  stream->OnClose([&] { ran = true; });  // closed and the server stopped: runs here, once
  EXPECT_TRUE(ran);
  held->Respond({});
  stream->Finish();
  held.reset();
}

TEST_F(HttpServerTest, StreamOfAClientThatStopsReadingIsClosedAtTheBound) {
  ServerOptions options;
  options.max_stream_buffer_bytes = 256 << 10;
  StreamBox box;
  absl::Notification closed;
  StartServer(options, [&](std::shared_ptr<Exchange> exchange) {
    auto stream = exchange->StartStream(200, {});
    stream->OnClose([&closed] { closed.Notify(); });
    box.Add(std::move(stream));
  });
  Client client(port());  // never reads
  ASSERT_TRUE(client.Send(Get("/stream")));
  ASSERT_TRUE(WaitUntil([&] { return box.size() == 1; }));
  auto stream = box.at(0);
  const std::string piece(64 << 10, 'x');
  int sent = 0;
  while (sent < 4000 && stream->Send(piece)) ++sent;  // 4000 pieces = 256 MiB: far past buffers
  EXPECT_LT(sent, 4000);
  EXPECT_TRUE(closed.WaitForNotificationWithTimeout(absl::Seconds(1)));
  EXPECT_FALSE(stream->Send("data: more\n\n"));
  EXPECT_TRUE(WaitUntil([&] { return server_->open_streams() == 0; }));
}

TEST_F(HttpServerTest, SlowOrIdleClientsAreClosedAfterTheIdleTimeout) {
  ServerOptions options;
  options.idle_timeout = milliseconds(200);
  StartServer(options, Echo);
  Client slow(port());
  Client idle(port());
  ASSERT_TRUE(slow.Send("GET / HTTP/1.1\r\nHost: t\r\n"));  // never finishes its header
  auto response = slow.ReadResponse(milliseconds(3000));
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 408);
  EXPECT_TRUE(slow.WaitForEof(milliseconds(3000)));
  EXPECT_TRUE(idle.WaitForEof(milliseconds(3000)));
  EXPECT_TRUE(idle.buffer().empty());
  EXPECT_TRUE(WaitUntil([&] { return server_->open_connections() == 0; }));
}

TEST_F(HttpServerTest, ConnectionsOverTheLimitAnswer503) {
  ServerOptions options;
  options.max_connections = 2;
  StartServer(options, Echo);
  auto first = std::make_unique<Client>(port());
  Client second(port());
  ASSERT_TRUE(WaitUntil([&] { return server_->open_connections() == 2; }));

  Client over(port());
  ASSERT_TRUE(over.Send(Get("/")));
  auto response = over.ReadResponse();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 503);
  EXPECT_EQ(response->headers["retry-after"], "1");
  EXPECT_THAT(response->body, HasSubstr("connection limit (2)"));
  EXPECT_TRUE(over.WaitForEof());
  EXPECT_EQ(server_->open_connections(), 2);

  first.reset();
  ASSERT_TRUE(WaitUntil([&] { return server_->open_connections() == 1; }));
  Client fits(port());
  ASSERT_TRUE(fits.Send(Get("/")));
  auto ok = fits.ReadResponse();
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST_F(HttpServerTest, HoldsAThousandStreamsOnTwoThreads) {
  constexpr int kStreams = 1000;
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  const rlim_t need = 2 * kStreams + 200;  // both ends live in this process
  if (limit.rlim_cur < need && limit.rlim_max >= need) {
    limit.rlim_cur = need;
    ::setrlimit(RLIMIT_NOFILE, &limit);
    ::getrlimit(RLIMIT_NOFILE, &limit);
  }
  if (limit.rlim_cur < need) GTEST_SKIP() << "needs " << need << " descriptors (ulimit -n)";

  StreamBox box;
  std::mutex mu;
  std::set<std::thread::id> handler_threads;
  ServerOptions options;
  options.io_threads = 2;
  StartServer(options, [&](std::shared_ptr<Exchange> exchange) {
    {
      std::lock_guard lock(mu);
      handler_threads.insert(std::this_thread::get_id());
    }
    box.Add(exchange->StartStream(200, {}));
  });
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.push_back(std::make_unique<Client>(port()));
    ASSERT_TRUE(clients.back()->connected()) << i;
    ASSERT_TRUE(clients.back()->Send(Get(absl::StrCat("/stream/", i))));
  }
  ASSERT_TRUE(WaitUntil([&] { return server_->open_streams() == kStreams; }, milliseconds(30000)))
      << server_->open_streams();
  EXPECT_EQ(server_->open_connections(), kStreams);
  {
    std::lock_guard lock(mu);
    EXPECT_LE(handler_threads.size(), 2u);
  }
  for (const auto& stream : box.all()) {
    EXPECT_TRUE(stream->Send("data: hello\n\n"));
    stream->Finish();
  }
  for (int i = 0; i < kStreams; ++i) {
    auto response = clients[i]->ReadResponse();
    ASSERT_TRUE(response) << i;
    EXPECT_EQ(response->body, "data: hello\n\n");
    EXPECT_TRUE(response->terminated);
  }
  EXPECT_TRUE(WaitUntil([&] { return server_->open_streams() == 0; }));
}

TEST_F(HttpServerTest, BindErrorsNameTheAddressAndTheFix) {
  StartServer({}, Echo);
  ServerOptions options;
  options.listen = absl::StrCat("127.0.0.1:", port());
  auto second = Server::Start(options, Echo);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr(options.listen));
  EXPECT_THAT(second.status().message(), HasSubstr("another port"));

  options.listen = "127.0.0.1";
  auto bad = Server::Start(options, Echo);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);

  options.listen = "127.0.0.1:0";
  options.io_threads = 0;
  EXPECT_FALSE(Server::Start(options, Echo).ok());
}

TEST_F(HttpServerTest, ListensOnIpv6Loopback) {
  ServerOptions options;
  options.listen = "[::1]:0";
  auto server = Server::Start(options, Echo);
  if (!server.ok()) GTEST_SKIP() << "no IPv6 loopback: " << server.status();
  const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_port = htons(static_cast<uint16_t>((*server)->port()));
  address.sin6_addr = in6addr_loopback;
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const std::string request = Get("/six");
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string received;
  const auto deadline = Clock::now() + kWait;
  while (received.find("[::1]:") == std::string::npos && Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) break;
    received.append(chunk, static_cast<size_t>(n));
  }
  ::close(fd);
  EXPECT_THAT(received, HasSubstr("X-Remote: [::1]:"));
}

}  // namespace
}  // namespace glm::http
