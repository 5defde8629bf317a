// Small helpers around absl::Status used everywhere errors cross a boundary.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace glm {

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define GLM_RETURN_IF_ERROR(expr)                 \
  do {                                            \
    if (auto glm_status_ = (expr); !glm_status_.ok()) return glm_status_; \
  } while (0)

#define GLM_CONCAT_INNER_(a, b) a##b
#define GLM_CONCAT_(a, b) GLM_CONCAT_INNER_(a, b)

// `GLM_ASSIGN_OR_RETURN(auto x, F());` assigns the value of an absl::StatusOr or returns its error.
#define GLM_ASSIGN_OR_RETURN(lhs, expr) \
  GLM_ASSIGN_OR_RETURN_IMPL_(GLM_CONCAT_(glm_statusor_, __LINE__), lhs, expr)
#define GLM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

// Debian 12's Abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW=0),
// which does not convert implicitly from std::string_view. These bridge the two.
inline absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view ToStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

// Prefixes the message of a non-OK status with `context` ("context: message"), keeping its code.
absl::Status Annotate(const absl::Status& status, std::string_view context);

// Edit distance (Levenshtein), for "did you mean" suggestions.
size_t EditDistance(std::string_view a, std::string_view b);

}  // namespace glm
