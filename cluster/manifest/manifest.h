// The weight manifest: built once on the source node, it lists every file of the checkpoint
// directory with its size and XXH3-128, plus the tensor → file map from
// model.safetensors.index.json, so each agent can tell which files its shard needs and whether
// the copies it holds are right.
//
// JSON form: {"num_hidden_layers": 78, "files": [{"path", "size", "xxh3_128"}...],
//             "weight_map": {"model.layers.0.mlp.gate.weight": "model-00001-of-00282.safetensors"}}
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace glm::cluster {

struct ManifestFile {
  std::string path;      // relative to the model directory, '/'-separated, no "..".
  uint64_t size = 0;
  std::string xxh3_128;  // 32 hex digits.
};

struct Manifest {
  int num_hidden_layers = -1;  // from config.json; -1 when absent. The MTP layer has this index.
  std::vector<ManifestFile> files;                   // sorted by path.
  std::map<std::string, std::string> weight_map;     // tensor name → file path.

  const ManifestFile* Find(const std::string& path) const;
  uint64_t TotalBytes(const std::vector<std::string>& paths) const;
  nlohmann::json ToJson() const;
  // Validates paths (relative, no "..", no duplicates), hashes (32 hex) and that every weight_map
  // target is a listed file. Errors name the entry.
  static absl::StatusOr<Manifest> FromJson(const nlohmann::json& json);
};

class FileHasher;

// Walks `model_dir` (regular files, recursively; skips *.partial and dot-files), hashes each
// through `hasher` (null: HashFile; a HashCache skips files that did not change), reads
// model.safetensors.index.json's weight_map and config.json's num_hidden_layers.
absl::StatusOr<Manifest> BuildManifest(const std::string& model_dir, FileHasher* hasher = nullptr);

// Which part of the model a node's shard holds. Layers [layer_begin, layer_end) of the decoder;
// the first PP stage also holds the embedding, the last holds model.norm and lm_head (and, with
// `include_mtp`, the MTP layer, which reuses embed_tokens and lm_head).
struct ShardSpec {
  int layer_begin = 0;
  int layer_end = 0;
  bool first_stage = true;
  bool last_stage = true;
  bool include_mtp = true;
};

// The files the shard needs: every non-.safetensors file (config, tokenizer, index), plus each
// .safetensors file holding at least one tensor of the shard. Tensors the classifier does not
// recognise are needed by every shard (conservative). Without an index, every .safetensors file.
// Sorted.
std::vector<std::string> FilesForShard(const Manifest& manifest, const ShardSpec& shard);

}  // namespace glm::cluster
