#include "controller/gateway/model_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace glm::gateway {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot be read"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Reads an optional JSON file: null when it does not exist, an error when it does not parse.
absl::StatusOr<Json> ReadJsonIfPresent(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Json();
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": not valid JSON; fix or replace the file"));
  }
  return j;
}

// tokenizer_config.json's bos_token / eos_token: a string or an AddedToken object.
std::string TokenText(const Json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return "";
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

std::vector<int32_t> EosIds(const Json& config) {
  std::vector<int32_t> ids;
  if (!config.is_object() || !config.contains("eos_token_id")) return ids;
  const Json& v = config["eos_token_id"];
  if (v.is_number_integer()) ids.push_back(v.get<int32_t>());
  if (v.is_array()) {
    for (const Json& e : v) {
      if (e.is_number_integer()) ids.push_back(e.get<int32_t>());
    }
  }
  return ids;
}

}  // namespace

absl::StatusOr<ModelFiles> ModelFiles::Load(const std::string& dir) {
  ModelFiles files;
  files.dir = dir;
  const fs::path root(dir);
  const fs::path tokenizer_path = root / "tokenizer.json";
  auto tok = tokenizer::Tokenizer::FromFile(tokenizer_path.string());
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat("the gateway needs the checkpoint's tokenizer: ",
                                     tok.status().message(), "; fix: put tokenizer.json in ",
                                     dir, " (model.path in cluster.yaml)"));
  }
  files.tokenizer = std::move(*tok);
  files.think_id = files.tokenizer->TokenToId("<think>").value_or(-1);

  absl::StatusOr<Json> tokenizer_config = ReadJsonIfPresent(root / "tokenizer_config.json");
  if (!tokenizer_config.ok()) return tokenizer_config.status();
  files.bos_token = TokenText(*tokenizer_config, "bos_token");
  files.eos_token = TokenText(*tokenizer_config, "eos_token");

  std::string template_text;
  std::error_code ec;
  const fs::path jinja_path = root / "chat_template.jinja";
  if (fs::exists(jinja_path, ec)) {
    absl::StatusOr<std::string> text = ReadFile(jinja_path);
    if (!text.ok()) return text.status();
    template_text = std::move(*text);
    files.chat_template_source = jinja_path.string();
  } else if (tokenizer_config->is_object() && tokenizer_config->contains("chat_template")) {
    const Json& t = (*tokenizer_config)["chat_template"];
    if (t.is_string()) {
      template_text = t.get<std::string>();
    } else if (t.is_array()) {
      for (const Json& entry : t) {
        if (entry.is_object() && entry.value("name", "") == "default" &&
            entry.contains("template") && entry["template"].is_string()) {
          template_text = entry["template"].get<std::string>();
        }
      }
    }
    if (template_text.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          (root / "tokenizer_config.json").string(),
          ": chat_template must be a string or a list with a {\"name\": \"default\"} entry"));
    }
    files.chat_template_source = (root / "tokenizer_config.json").string() + " chat_template";
  }
  if (!template_text.empty()) {
    absl::StatusOr<jinja::Template> parsed = jinja::Template::Parse(template_text);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(files.chat_template_source, ": ",
                                                     parsed.status().message()));
    }
    files.chat_template = std::make_shared<const jinja::Template>(std::move(*parsed));
  }

  absl::StatusOr<Json> generation_config = ReadJsonIfPresent(root / "generation_config.json");
  if (!generation_config.ok()) return generation_config.status();
  files.stop_token_ids = EosIds(*generation_config);
  if (files.stop_token_ids.empty()) {
    absl::StatusOr<Json> config = ReadJsonIfPresent(root / "config.json");
    if (!config.ok()) return config.status();
    files.stop_token_ids = EosIds(*config);
  }
  return files;
}

}  // namespace glm::gateway
