// A blocking HTTP/1.1 client for the gateway's tests: one request per connection
// (Connection: close), Content-Length and chunked bodies, a receive timeout on every read, SSE
// events split out of the body. Loopback only; never use it outside tests.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace glm::gateway::testing {

struct HttpResult {
  int status = 0;  // 0: no answer (connect failed, timeout, malformed)
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;                                           // de-chunked
  std::string Header(const std::string& lower_name) const {
    for (const auto& [k, v] : headers)
      if (k == lower_name) return v;
    return "";
  }
  // The `data:` payloads of an SSE body, in order ("[DONE]" included).
  std::vector<std::string> Events() const {
    std::vector<std::string> out;
    size_t at = 0;
    while (at < body.size()) {
      size_t end = body.find("\n\n", at);
      if (end == std::string::npos) end = body.size();
      std::string event = body.substr(at, end - at);
      if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
      at = end + 2;
    }
    return out;
  }
};

// A connected socket to 127.0.0.1:port with a receive timeout; -1 on failure.
inline int ConnectLoopback(int port, std::chrono::milliseconds timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline std::string RequestText(const std::string& method, const std::string& path,
                               const std::string& body,
                               const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  if (!body.empty() || method == "POST") {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n";
  }
  req += "\r\n" + body;
  return req;
}

inline bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Parses a complete response (the connection was closed by the server).
inline HttpResult ParseResponse(const std::string& raw) {
  HttpResult r;
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos || raw.rfind("HTTP/1.", 0) != 0) return r;
  r.status = std::atoi(raw.c_str() + 9);
  size_t at = raw.find("\r\n") + 2;
  bool chunked = false;
  while (at < head_end) {
    const size_t eol = raw.find("\r\n", at);
    const std::string line = raw.substr(at, eol - at);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      std::string value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      if (name == "transfer-encoding" && value.find("chunked") != std::string::npos) {
        chunked = true;
      }
      r.headers.emplace_back(std::move(name), std::move(value));
    }
    at = eol + 2;
  }
  std::string body = raw.substr(head_end + 4);
  if (!chunked) {
    r.body = std::move(body);
    return r;
  }
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t eol = body.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t size = std::strtoul(body.substr(pos, eol - pos).c_str(), nullptr, 16);
    if (size == 0) break;
    r.body += body.substr(eol + 2, size);
    pos = eol + 2 + size + 2;
  }
  return r;
}

// One request on a fresh connection; reads until the server closes it (or the timeout).
inline HttpResult Http(int port, const std::string& method, const std::string& path,
                       const std::string& body = "",
                       const std::vector<std::pair<std::string, std::string>>& headers = {},
                       std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const int fd = ConnectLoopback(port, timeout);
  if (fd < 0) return {};
  std::string raw;
  if (SendAll(fd, RequestText(method, path, body, headers))) {
    char buf[16384];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      raw.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return ParseResponse(raw);
}

}  // namespace glm::gateway::testing
