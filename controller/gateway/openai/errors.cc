#include "controller/gateway/openai/errors.h"

#include <utility>

#include "controller/gateway/openai/responses.h"

namespace glm::openai {

std::string ErrorTypeForStatus(int status) {
  switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 403: return "PermissionDeniedError";
    case 404: return "NotFoundError";
    case 409: return "ConflictError";
    case 413: return "BadRequestError";
    case 422: return "UnprocessableEntityError";
    case 429: return "RateLimitError";
    case 503: return "ServiceUnavailableError";
    default: break;
  }
  return status >= 500 ? "InternalServerError" : "BadRequestError";
}

ApiError MakeError(int status, std::string message, std::string param) {
  return ApiError{status, ErrorTypeForStatus(status), std::move(message), std::move(param)};
}

ApiError BadRequest(std::string param, std::string message) {
  return MakeError(400, std::move(message), std::move(param));
}
ApiError NotFound(std::string param, std::string message) {
  return MakeError(404, std::move(message), std::move(param));
}
ApiError PayloadTooLarge(std::string message) { return MakeError(413, std::move(message)); }
ApiError RateLimited(std::string message) { return MakeError(429, std::move(message)); }
ApiError InternalError(std::string message) { return MakeError(500, std::move(message)); }
ApiError Unavailable(std::string message) { return MakeError(503, std::move(message)); }

nlohmann::ordered_json ErrorJson(const ApiError& error) {
  nlohmann::ordered_json inner = nlohmann::ordered_json::object();
  inner["message"] = error.message;
  inner["type"] = error.type.empty() ? ErrorTypeForStatus(error.status) : error.type;
  inner["param"] = error.param.empty() ? nlohmann::ordered_json(nullptr)
                                       : nlohmann::ordered_json(error.param);
  inner["code"] = error.status;
  nlohmann::ordered_json body = nlohmann::ordered_json::object();
  body["error"] = std::move(inner);
  return body;
}

std::string ErrorBody(const ApiError& error) { return DumpJson(ErrorJson(error)); }

}  // namespace glm::openai
