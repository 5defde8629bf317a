#include "controller/gateway/jinja/template.h"

#include <utility>

#include "controller/gateway/jinja/interpreter.h"
#include "controller/gateway/jinja/parser.h"
#include "nlohmann/json.hpp"

namespace glm::jinja {

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  absl::StatusOr<std::shared_ptr<const Program>> program = ParseProgram(source);
  if (!program.ok()) return program.status();
  return Template(*std::move(program));
}

absl::StatusOr<std::string> Template::Render(const nlohmann::ordered_json& context) const {
  return Render(context, RenderOptions{});
}

absl::StatusOr<std::string> Template::Render(const nlohmann::ordered_json& context,
                                             const RenderOptions& options) const {
  try {
    Renderer renderer(*program_, options);
    return renderer.Render(context);
  } catch (const RenderError& e) {
    return absl::Status(e.code, e.message);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory while rendering the chat template");
  }
}

}  // namespace glm::jinja
