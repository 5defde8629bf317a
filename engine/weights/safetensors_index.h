// model.safetensors.index.json: which shard holds each tensor of a sharded checkpoint.
//   {"metadata": {"total_size": 755617140416}, "weight_map": {"lm_head.weight":
//    "model-00141-of-00141.safetensors", ...}}
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace glm::engine {

inline constexpr std::string_view kSafetensorsIndexName = "model.safetensors.index.json";
inline constexpr std::string_view kSingleSafetensorsName = "model.safetensors";

struct SafetensorsIndex {
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file (relative path)
  std::optional<uint64_t> total_size;             // metadata.total_size, if present
};

// Parses index JSON; `label` (the path) prefixes errors. Shard names must be relative paths
// without ".." components. kDataLoss when malformed.
absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(std::string_view json_text,
                                                       std::string_view label);

}  // namespace glm::engine
