// OpenAI-style API errors (../shared/specs/serving.md §4): the envelope
// {"error":{"message","type","param","code"}} that vLLM sends, with `code` the HTTP status integer
// and `type` the openai-python exception name for that status. The 401 body of `--api-key`
// (`{"error":"Unauthorized"}`, not the envelope) is the gateway's business, not this file's.
//
// Pure values, no I/O; thread-compatible.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "nlohmann/json.hpp"

namespace glm::openai {

struct ApiError {
  int status = 400;     // HTTP status, also the envelope's `code`
  std::string type;     // "BadRequestError", ...; ErrorTypeForStatus(status) when made by the helpers
  std::string message;  // what was wrong and what is accepted, for a person
  std::string param;    // the request parameter at fault ("messages[2].content"); empty → null
};

// 400 BadRequestError, 401 AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError,
// 409 ConflictError, 413 BadRequestError (vLLM reports an oversized body as a bad request),
// 422 UnprocessableEntityError, 429 RateLimitError, 503 ServiceUnavailableError, any other 5xx
// InternalServerError, any other 4xx BadRequestError.
std::string ErrorTypeForStatus(int status);

ApiError MakeError(int status, std::string message, std::string param = "");
ApiError BadRequest(std::string param, std::string message);            // 400
ApiError NotFound(std::string param, std::string message);              // 404 (e.g. param "model")
ApiError PayloadTooLarge(std::string message);                          // 413
ApiError RateLimited(std::string message);                              // 429; add Retry-After
ApiError InternalError(std::string message);                            // 500
ApiError Unavailable(std::string message);                              // 503

// {"error":{"message":…,"type":…,"param":…|null,"code":<status>}}
nlohmann::ordered_json ErrorJson(const ApiError& error);
std::string ErrorBody(const ApiError& error);

// A value or the ApiError that stopped it: what every request parser returns.
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(ApiError error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  // Precondition for value(): ok(); for error(): !ok().
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const ApiError& error() const { return std::get<ApiError>(v_); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  std::variant<T, ApiError> v_;
};

}  // namespace glm::openai
