#include "engine/weights/safetensors_index.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

using nlohmann::json;

absl::Status BadIndex(std::string_view label, std::string_view problem) {
  return absl::DataLossError(absl::StrCat(ToAbsl(label), ": ", ToAbsl(problem),
                                          "; the index is corrupt: re-download/restage it"));
}

bool IsSafeRelativePath(std::string_view path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string_view::npos) {
    return false;
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    const std::string_view part = path.substr(start, slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = slash + 1;
  }
  return true;
}

}  // namespace

absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(std::string_view json_text,
                                                       std::string_view label) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return BadIndex(label, absl::StrCat("not valid JSON (", e.what(), ")"));
  }
  if (!root.is_object()) return BadIndex(label, "must be a JSON object");
  SafetensorsIndex index;

  auto metadata = root.find("metadata");
  if (metadata != root.end() && !metadata->is_null()) {
    if (!metadata->is_object()) return BadIndex(label, "\"metadata\" must be an object");
    auto total = metadata->find("total_size");
    if (total != metadata->end() && !total->is_null()) {
      if (total->is_number_unsigned()) {
        index.total_size = total->get<uint64_t>();
      } else if (total->is_number_float() && total->get<double>() >= 0 &&
                 total->get<double>() < 1.8e19 &&
                 std::floor(total->get<double>()) == total->get<double>()) {
        // Some exporters write 1234.0.
        index.total_size = static_cast<uint64_t>(total->get<double>());
      } else {
        return BadIndex(label, "\"metadata.total_size\" must be a non-negative integer");
      }
    }
  }

  auto weight_map = root.find("weight_map");
  if (weight_map == root.end() || !weight_map->is_object()) {
    return BadIndex(label, "missing \"weight_map\" object (tensor name -> shard file)");
  }
  for (const auto& [name, file] : weight_map->items()) {
    if (!file.is_string()) {
      return BadIndex(label, absl::StrCat("weight_map[\"", name, "\"] must be a file name"));
    }
    const auto& file_name = file.get_ref<const std::string&>();
    if (!IsSafeRelativePath(file_name)) {
      return BadIndex(label, absl::StrCat("weight_map[\"", name, "\"] = \"", file_name,
                                          "\" is not a relative path inside the checkpoint"));
    }
    index.weight_map.emplace(name, file_name);
  }
  if (index.weight_map.empty()) {
    return BadIndex(label, "\"weight_map\" is empty: the index lists no tensors");
  }
  return index;
}

}  // namespace glm::engine
