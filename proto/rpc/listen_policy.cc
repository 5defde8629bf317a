#include "proto/rpc/listen_policy.h"

#include <arpa/inet.h>

#include <string>

#include "grpcpp/server_builder.h"

namespace glm::rpc {

void LimitRequestSizes(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
}

bool IsLoopbackListen(std::string_view listen) {
  if (listen.substr(0, 5) == "unix:") return true;
  std::string_view host = listen;
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    host = host.substr(1, close - 1);
  } else {
    const size_t colon = host.rfind(':');
    // "host:port"; a bare IPv6 address without brackets has several colons and no port.
    if (colon != std::string_view::npos && host.find(':') == colon) host = host.substr(0, colon);
  }
  if (host == "localhost") return true;
  const std::string h(host);
  in_addr v4{};
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

}  // namespace glm::rpc
