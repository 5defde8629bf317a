#include "cluster/manifest/manifest.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cluster/manifest/file_hash.h"
#include "cluster/manifest/hash_cache.h"

namespace glm::cluster {
namespace {

namespace fs = std::filesystem;

bool SafeRelativePath(const std::string& p) {
  if (p.empty() || p[0] == '/' || absl::StrContains(p, "\\")) return false;
  for (const auto& part : fs::path(p)) {
    if (part == ".." || part == ".") return false;
  }
  return true;
}

bool IsHex32(const std::string& s) {
  return s.size() == 32 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Who needs tensor `name`: returns true when the shard does.
bool ShardNeedsTensor(const std::string& name, const ShardSpec& shard, int num_hidden_layers) {
  absl::string_view n(name);
  if (absl::StartsWith(n, "model.layers.")) {
    n.remove_prefix(13);
    size_t dot = n.find('.');
    int layer = 0;
    if (dot == absl::string_view::npos || !absl::SimpleAtoi(n.substr(0, dot), &layer)) return true;
    if (num_hidden_layers >= 0 && layer >= num_hidden_layers) {
      return shard.last_stage && shard.include_mtp;  // MTP layer(s)
    }
    return layer >= shard.layer_begin && layer < shard.layer_end;
  }
  if (absl::StartsWith(n, "model.embed_tokens.")) {
    return shard.first_stage || (shard.last_stage && shard.include_mtp);
  }
  if (absl::StartsWith(n, "model.norm.") || absl::StartsWith(n, "lm_head.")) {
    return shard.last_stage;
  }
  return true;
}

}  // namespace

const ManifestFile* Manifest::Find(const std::string& path) const {
  auto it = std::lower_bound(files.begin(), files.end(), path,
                             [](const ManifestFile& f, const std::string& p) { return f.path < p; });
  return it != files.end() && it->path == path ? &*it : nullptr;
}

uint64_t Manifest::TotalBytes(const std::vector<std::string>& paths) const {
  uint64_t total = 0;
  for (const std::string& p : paths) {
    if (const ManifestFile* f = Find(p)) total += f->size;
  }
  return total;
}

nlohmann::json Manifest::ToJson() const {
  nlohmann::json j;
  j["num_hidden_layers"] = num_hidden_layers;
  nlohmann::json list = nlohmann::json::array();
  for (const ManifestFile& f : files) {
    list.push_back({{"path", f.path}, {"size", f.size}, {"xxh3_128", f.xxh3_128}});
  }
  j["files"] = std::move(list);
  j["weight_map"] = weight_map;
  return j;
}

absl::StatusOr<Manifest> Manifest::FromJson(const nlohmann::json& j) {
  Manifest m;
  try {
    if (!j.is_object() || !j.contains("files") || !j["files"].is_array()) {
      return absl::InvalidArgumentError("manifest: expected an object with a 'files' array");
    }
    if (j.contains("num_hidden_layers")) m.num_hidden_layers = j["num_hidden_layers"].get<int>();
    std::set<std::string> seen;
    for (size_t i = 0; i < j["files"].size(); ++i) {
      const nlohmann::json& e = j["files"][i];
      ManifestFile f{e.at("path").get<std::string>(), e.at("size").get<uint64_t>(),
                     e.at("xxh3_128").get<std::string>()};
      if (!SafeRelativePath(f.path)) {
        return absl::InvalidArgumentError(absl::StrCat("manifest files[", i, "]: path '", f.path,
                                                       "' must be relative without '..'"));
      }
      if (!IsHex32(f.xxh3_128)) {
        return absl::InvalidArgumentError(absl::StrCat("manifest files[", i, "] (", f.path,
                                                       "): xxh3_128 must be 32 lowercase hex digits"));
      }
      if (!seen.insert(f.path).second) {
        return absl::InvalidArgumentError(absl::StrCat("manifest: duplicate path '", f.path, "'"));
      }
      m.files.push_back(std::move(f));
    }
    std::sort(m.files.begin(), m.files.end(),
              [](const ManifestFile& a, const ManifestFile& b) { return a.path < b.path; });
    if (j.contains("weight_map")) {
      for (const auto& [tensor, file] : j["weight_map"].items()) {
        std::string path = file.get<std::string>();
        if (m.Find(path) == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("manifest weight_map: tensor '", tensor,
                                                         "' maps to unlisted file '", path, "'"));
        }
        m.weight_map[tensor] = path;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("manifest: ", e.what()));
  }
  return m;
}

absl::StatusOr<Manifest> BuildManifest(const std::string& model_dir, FileHasher* hasher) {
  Manifest m;
  std::error_code ec;
  fs::recursive_directory_iterator it(model_dir, ec), end;
  if (ec) return absl::NotFoundError(absl::StrCat(model_dir, ": ", ec.message()));
  for (; it != end; it.increment(ec)) {
    if (ec) return absl::UnavailableError(absl::StrCat(model_dir, ": ", ec.message()));
    const fs::directory_entry& entry = *it;
    std::string name = entry.path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (entry.is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (!entry.is_regular_file() || absl::EndsWith(name, ".partial")) continue;
    std::string rel = fs::relative(entry.path(), model_dir).generic_string();
    absl::StatusOr<FileHash> h =
        hasher != nullptr ? hasher->Hash(entry.path().string()) : HashFile(entry.path().string());
    if (!h.ok()) return h.status();
    m.files.push_back(ManifestFile{rel, h->size, h->xxh3_128});
  }
  std::sort(m.files.begin(), m.files.end(),
            [](const ManifestFile& a, const ManifestFile& b) { return a.path < b.path; });

  fs::path index = fs::path(model_dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    try {
      nlohmann::json j = nlohmann::json::parse(std::ifstream(index));
      for (const auto& [tensor, file] : j.at("weight_map").items()) {
        std::string path = file.get<std::string>();
        if (m.Find(path) == nullptr) {
          return absl::FailedPreconditionError(absl::StrCat(
              index.string(), ": tensor '", tensor, "' is in '", path,
              "', which is not in the directory; the checkpoint is incomplete"));
        }
        m.weight_map[tensor] = path;
      }
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(index.string(), ": ", e.what()));
    }
  }
  fs::path config = fs::path(model_dir) / "config.json";
  if (fs::exists(config)) {
    try {
      nlohmann::json j = nlohmann::json::parse(std::ifstream(config));
      if (j.contains("num_hidden_layers")) m.num_hidden_layers = j["num_hidden_layers"].get<int>();
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(config.string(), ": ", e.what()));
    }
  }
  return m;
}

std::vector<std::string> FilesForShard(const Manifest& manifest, const ShardSpec& shard) {
  std::set<std::string> needed;
  for (const ManifestFile& f : manifest.files) {
    if (!absl::EndsWith(f.path, ".safetensors")) {
      needed.insert(f.path);
    } else if (manifest.weight_map.empty()) {
      needed.insert(f.path);
    }
  }
  for (const auto& [tensor, file] : manifest.weight_map) {
    if (ShardNeedsTensor(tensor, shard, manifest.num_hidden_layers)) needed.insert(file);
  }
  return std::vector<std::string>(needed.begin(), needed.end());
}

}  // namespace glm::cluster
