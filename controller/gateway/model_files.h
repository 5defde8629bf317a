// The files of a Hugging Face checkpoint that the gateway reads (never the weights): the
// tokenizer, the chat template, the special tokens the template refers to and the stop ids.
//   tokenizer.json                     the tokenizer (engine/tokenizer)
//   chat_template.jinja                the chat template, or else
//   tokenizer_config.json              "chat_template" (a string, or a list of {name, template}
//                                      whose "default" entry is used), "bos_token", "eos_token"
//   generation_config.json, config.json  "eos_token_id" (an int or a list): the stop ids
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/gateway/jinja/template.h"
#include "engine/tokenizer/tokenizer.h"

namespace glm::gateway {

struct ModelFiles {
  std::string dir;
  // Null only in a ModelFiles made by Missing(): the routes that need text then answer 500 with
  // `missing`, the others (health, metrics, models) work.
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;
  std::string missing;
  // Null when the checkpoint ships no chat template: /v1/chat/completions then answers 400.
  std::shared_ptr<const jinja::Template> chat_template;
  std::string chat_template_source;  // which file it came from, for messages
  std::string bos_token;             // as the template sees them ("" when not set)
  std::string eos_token;
  // generation_config.json's eos_token_id, else config.json's; the engine also stops on the
  // model's own eos ids, these are sent so every replica stops on the same set.
  std::vector<int32_t> stop_token_ids;
  // Token ids of markers the gateway's parsers key on, -1 when the vocabulary lacks them.
  int32_t think_id = -1;  // "<think>"

  // Reads `dir`. Errors name the file and the fix (a missing tokenizer.json, a template that
  // does not parse with the line).
  static absl::StatusOr<ModelFiles> Load(const std::string& dir);
  // The files could not be read (`why`): a gateway that says so on every text route.
  static ModelFiles Missing(const std::string& dir, std::string why) {
    ModelFiles files;
    files.dir = dir;
    files.missing = std::move(why);
    return files;
  }
};

}  // namespace glm::gateway
