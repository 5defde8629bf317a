// Fuzz target: arbitrary bytes as a request body for every parser. Each must return a value or
// a 400 naming what was wrong, never crash, and the results must serialise.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "controller/gateway/openai/requests.h"
#include "controller/gateway/openai/responses.h"

namespace {

template <typename T>
void CheckError(const glm::openai::Result<T>& result) {
  if (result.ok()) return;
  const glm::openai::ApiError& error = result.error();
  if (error.status != 400 || error.type != "BadRequestError" || error.message.empty()) std::abort();
  (void)glm::openai::ErrorBody(error);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  auto chat = glm::openai::ParseChatRequest(body);
  CheckError(chat);
  if (chat.ok()) {
    (void)glm::openai::DumpJson(chat->messages);
    (void)glm::openai::DumpJson(chat->tools);
    (void)glm::openai::DumpJson(chat->chat_template_kwargs);
    if (chat->messages.empty()) std::abort();
    if (chat->sampling.max_tokens && *chat->sampling.max_tokens < 1) std::abort();
    if (!chat->sampling.stream && chat->sampling.include_usage) std::abort();
  }
  auto completion = glm::openai::ParseCompletionRequest(body);
  CheckError(completion);
  auto tokenize = glm::openai::ParseTokenizeRequest(body);
  CheckError(tokenize);
  auto detokenize = glm::openai::ParseDetokenizeRequest(body);
  CheckError(detokenize);
  return 0;
}
