// Compares glm_tokenizer with a reference implementation's output.
//   tokenizer_compare --tokenizer tokenizer.json --reference ref.json [--max-report N]
//                     [--add-special-tokens true|false]   (default for items that do not say;
//                     false unless given - Python's Tokenizer.encode defaults to true)
// ref.json: a JSON array (or an object holding one under "items", "lines" or "cases"), or JSON
// lines, of {"text": str, "ids": [int], "decoded": str (optional),
// "add_special_tokens": bool (optional, default false), "decoded_skip_special": str (optional),
// "tokens": [str] (optional)}.
// For every item: Encode(text) must equal ids; Decode(ids) must equal decoded (and
// Decode(ids, skip_special_tokens=true) decoded_skip_special) when given; IdToToken(ids[i])
// must equal tokens[i] when given; the stream decoder fed ids one by one must reproduce
// Decode(ids). Prints each mismatch (up to
// --max-report) and a summary; exits 0 only when everything matches and there was >= 1 item.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;

std::string Show(const std::string& text) {
  std::string s = json(glm::tokenizer::Utf8Lossy(text)).dump();
  if (s.size() > 160) s = s.substr(0, 157) + "...";
  return s;
}

std::string ShowIds(const std::vector<int32_t>& ids, size_t from) {
  std::string s = "[";
  for (size_t i = from; i < ids.size() && i < from + 12; ++i) {
    if (i > from) s += ",";
    s += std::to_string(ids[i]);
  }
  if (ids.size() > from + 12) s += ",...";
  return s + "] (" + std::to_string(ids.size()) + " ids)";
}

bool LoadItems(const std::string& path, std::vector<json>* items) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  try {
    json root = json::parse(text);
    if (root.is_object()) {
      for (const char* key : {"items", "lines", "cases"}) {
        if (root.contains(key)) {
          root = root[key];
          break;
        }
      }
    }
    if (root.is_array()) {
      for (json& item : root) items->push_back(std::move(item));
      return true;
    }
    if (root.is_object()) {
      items->push_back(std::move(root));
      return true;
    }
  } catch (const json::exception&) {
    // Not one JSON document: JSON lines.
  }
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      items->push_back(json::parse(line));
    } catch (const json::exception& e) {
      std::fprintf(stderr, "%s: line %zu is not JSON: %s\n", path.c_str(), items->size() + 1,
                   e.what());
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path;
  std::string reference_path;
  int max_report = 20;
  bool default_add_special = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokenizer") {
      tokenizer_path = argv[i + 1];
    } else if (flag == "--reference") {
      reference_path = argv[i + 1];
    } else if (flag == "--max-report") {
      max_report = std::atoi(argv[i + 1]);
    } else if (flag == "--add-special-tokens") {
      default_add_special = std::string(argv[i + 1]) == "true";
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (tokenizer_path.empty() || reference_path.empty()) {
    std::fprintf(stderr, "usage: tokenizer_compare --tokenizer FILE --reference FILE "
                         "[--max-report N] [--add-special-tokens true|false]\n");
    return 2;
  }
  auto tok = glm::tokenizer::Tokenizer::FromFile(tokenizer_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  std::vector<json> items;
  if (!LoadItems(reference_path, &items)) {
    std::fprintf(stderr, "cannot read reference %s\n", reference_path.c_str());
    return 1;
  }
  size_t checked = 0, id_mismatches = 0, decode_mismatches = 0, stream_mismatches = 0;
  size_t token_mismatches = 0;
  size_t num_ids = 0;
  int reported = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const json& item = items[i];
    if (!item.is_object() || !item.contains("text") || !item["text"].is_string() ||
        !item.contains("ids") || !item["ids"].is_array()) {
      std::fprintf(stderr, "%s item %zu: needs \"text\" (string) and \"ids\" (array)\n",
                   reference_path.c_str(), i);
      return 1;
    }
    const std::string text = item["text"].get<std::string>();
    const std::vector<int32_t> expected = item["ids"].get<std::vector<int32_t>>();
    const bool add_special = item.value("add_special_tokens", default_add_special);
    ++checked;
    num_ids += expected.size();
    const std::vector<int32_t> got = (*tok)->Encode(text, add_special);
    if (got != expected) {
      ++id_mismatches;
      if (reported++ < max_report) {
        size_t at = 0;
        while (at < got.size() && at < expected.size() && got[at] == expected[at]) ++at;
        std::printf("item %zu ids differ at %zu: text %s\n  reference %s\n  ours      %s\n", i,
                    at, Show(text).c_str(), ShowIds(expected, at).c_str(),
                    ShowIds(got, at).c_str());
      }
    }
    const std::string decoded = (*tok)->Decode(expected);
    if (item.contains("decoded") && item["decoded"].is_string() &&
        decoded != item["decoded"].get<std::string>()) {
      ++decode_mismatches;
      if (reported++ < max_report) {
        std::printf("item %zu decode differs:\n  reference %s\n  ours      %s\n", i,
                    Show(item["decoded"].get<std::string>()).c_str(), Show(decoded).c_str());
      }
    }
    if (item.contains("decoded_skip_special") && item["decoded_skip_special"].is_string()) {
      const std::string skipped = (*tok)->Decode(expected, /*skip_special_tokens=*/true);
      if (skipped != item["decoded_skip_special"].get<std::string>()) {
        ++decode_mismatches;
        if (reported++ < max_report) {
          std::printf("item %zu decode(skip_special_tokens) differs:\n  reference %s\n  ours"
                      "      %s\n",
                      i, Show(item["decoded_skip_special"].get<std::string>()).c_str(),
                      Show(skipped).c_str());
        }
      }
    }
    if (item.contains("tokens") && item["tokens"].is_array() &&
        item["tokens"].size() == expected.size()) {
      for (size_t k = 0; k < expected.size(); ++k) {
        const auto token = (*tok)->IdToToken(expected[k]);
        if (!item["tokens"][k].is_string() || !token ||
            *token != item["tokens"][k].get<std::string>()) {
          ++token_mismatches;
          if (reported++ < max_report) {
            std::printf("item %zu IdToToken(%d) differs: reference %s, ours %s\n", i,
                        expected[k], item["tokens"][k].dump().c_str(),
                        token ? Show(*token).c_str() : "(none)");
          }
          break;
        }
      }
    }
    glm::tokenizer::StreamDecoder stream(**tok);
    std::string streamed;
    for (int32_t id : expected) streamed += stream.Step(id);
    streamed += stream.Flush();
    if (streamed != decoded) {
      ++stream_mismatches;
      if (reported++ < max_report) {
        std::printf("item %zu stream decode differs from Decode: %s vs %s\n", i,
                    Show(streamed).c_str(), Show(decoded).c_str());
      }
    }
  }
  std::printf("%s vs %s: %zu items, %zu reference ids; id mismatches %zu, decode mismatches "
              "%zu, token-string mismatches %zu, stream mismatches %zu\n",
              tokenizer_path.c_str(), reference_path.c_str(), checked, num_ids, id_mismatches,
              decode_mismatches, token_mismatches, stream_mismatches);
  if (checked == 0) {
    std::printf("FAIL: no items to compare\n");
    return 1;
  }
  return id_mismatches + decode_mismatches + token_mismatches + stream_mismatches == 0 ? 0 : 1;
}
