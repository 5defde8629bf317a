// Parsing ServerOptions::listen: "host:port", "[v6]:port", ":port" (all interfaces).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace glm::http {

struct ListenAddress {
  std::string host;  // without brackets; "0.0.0.0" for ":port"
  int port = 0;      // 0 = pick a free one
};

// Errors (InvalidArgument) quote the text and show the accepted forms.
absl::StatusOr<ListenAddress> ParseListenAddress(std::string_view text);

}  // namespace glm::http
