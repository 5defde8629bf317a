// Request and tool-call ids: prefix + 32 random lowercase hex digits, the shape of vLLM's
// `random_uuid()` ids ("chatcmpl-…", "cmpl-…", "chatcmpl-tool-…").
//
// Thread-safe (a per-thread generator seeded from std::random_device). Tests that need fixed
// ids inject them (ResponseMeta.id, ParserOptions.new_tool_call_id) rather than seeding this.
#pragma once

#include <string>
#include <string_view>

namespace glm::openai {

std::string NewId(std::string_view prefix);

}  // namespace glm::openai
