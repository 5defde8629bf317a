#include "controller/gateway/http/listen_address.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace glm::http {
namespace {

absl::Status Invalid(std::string_view text_in, std::string_view why_in) {
  const absl::string_view text(text_in.data(), text_in.size());
  const absl::string_view why(why_in.data(), why_in.size());
  return absl::InvalidArgumentError(absl::StrCat(
      "listen address '", text, "': ", why,
      "; write it as host:port, e.g. 127.0.0.1:8000, 0.0.0.0:8000 or [::1]:8000 (port 0 picks a "
      "free port)"));
}

}  // namespace

absl::StatusOr<ListenAddress> ParseListenAddress(std::string_view text) {
  ListenAddress address;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) return Invalid(text, "'[' without ']'");
    address.host = std::string(text.substr(1, close - 1));
    if (address.host.empty()) return Invalid(text, "empty IPv6 address");
    if (close + 1 >= text.size() || text[close + 1] != ':') {
      return Invalid(text, "no ':port' after the bracketed address");
    }
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return Invalid(text, "no ':port'");
    address.host = std::string(text.substr(0, colon));
    if (address.host.find(':') != std::string::npos) {
      return Invalid(text, "an IPv6 address needs brackets");
    }
    if (address.host.empty()) address.host = "0.0.0.0";
    port_text = text.substr(colon + 1);
  }
  int port = -1;
  if (port_text.empty() || port_text.find_first_not_of("0123456789") != std::string_view::npos ||
      port_text.size() > 5 || !absl::SimpleAtoi(absl::string_view(port_text.data(), port_text.size()), &port) || port > 65535) {
    return Invalid(text, absl::StrCat("port '", absl::string_view(port_text.data(), port_text.size()),
                                      "' is not a number from 0 to 65535"));
  }
  address.port = port;
  return address;
}

}  // namespace glm::http
