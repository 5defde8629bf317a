#include "cluster/manifest/hash_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "nlohmann/json.hpp"

namespace glm::cluster {
namespace {

namespace fs = std::filesystem;

struct Key {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  bool operator==(const Key& o) const {
    return size == o.size && mtime_ns == o.mtime_ns && inode == o.inode;
  }
};

bool StatKey(const std::string& path, Key* key) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  key->size = static_cast<uint64_t>(st.st_size);
  key->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  key->inode = static_cast<uint64_t>(st.st_ino);
  return true;
}

}  // namespace

absl::StatusOr<FileHash> DirectHasher::Hash(const std::string& path) {
  ++files_hashed_;
  return HashFile(path);
}

HashCache::HashCache(std::string store, FileHasher* inner)
    : store_(std::move(store)), inner_(inner != nullptr ? inner : &direct_) {}

void HashCache::Load() {
  if (store_.empty()) return;
  std::ifstream in(store_);
  if (!in) return;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::map<std::string, Entry> loaded;
  try {
    if (j.is_discarded() || j.value("version", 0) != 1 || !j["files"].is_object()) {
      throw std::runtime_error("not a version-1 hash cache");
    }
    for (const auto& [path, e] : j["files"].items()) {
      Entry entry{e.at("size").get<uint64_t>(), e.at("mtime_ns").get<int64_t>(),
                  e.at("inode").get<uint64_t>(), e.at("xxh3_128").get<std::string>()};
      if (entry.xxh3_128.size() != 32) throw std::runtime_error("bad xxh3_128");
      loaded[path] = std::move(entry);
    }
  } catch (const std::exception& e) {
    GLM_LOG_WARN("hash cache {} ignored ({}); files will be hashed again", store_, e.what());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  entries_ = std::move(loaded);
}

absl::Status HashCache::Save() {
  if (store_.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> save_lock(save_mu_);
  nlohmann::json files = nlohmann::json::object();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [path, e] : entries_) {
      Key now;
      if (!StatKey(path, &now)) continue;  // gone
      files[path] = {{"size", e.size}, {"mtime_ns", e.mtime_ns}, {"inode", e.inode},
                     {"xxh3_128", e.xxh3_128}};
    }
  }
  std::error_code ec;
  fs::create_directories(fs::path(store_).parent_path(), ec);
  const std::string tmp = absl::StrCat(store_, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << nlohmann::json{{"version", 1}, {"files", std::move(files)}}.dump() << "\n";
    if (!out.flush()) {
      fs::remove(tmp, ec);
      return absl::UnavailableError(absl::StrCat("cannot write the hash cache ", tmp));
    }
  }
  fs::rename(tmp, store_, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return absl::UnavailableError(absl::StrCat("cannot replace the hash cache ", store_, ": ",
                                               ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<FileHash> HashCache::Hash(const std::string& path) {
  std::error_code ec;
  const std::string abs = fs::absolute(path, ec).lexically_normal().string();
  Key before;
  if (StatKey(abs, &before)) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(abs);
    if (it != entries_.end() &&
        Key{it->second.size, it->second.mtime_ns, it->second.inode} == before) {
      ++hits_;
      return FileHash{it->second.xxh3_128, it->second.size};
    }
  }
  ++misses_;
  absl::StatusOr<FileHash> h = inner_->Hash(abs);
  if (!h.ok()) return h;
  Key after;
  // Remember it only when the file did not change while it was read.
  if (StatKey(abs, &after) && after == before && after.size == h->size) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_[abs] = Entry{after.size, after.mtime_ns, after.inode, h->xxh3_128};
  }
  return h;
}

}  // namespace glm::cluster
