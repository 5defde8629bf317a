// Hashing files for manifests without re-reading what did not change: the controller builds the
// source's manifest on every `glmctl up`, and hashing a 700 GB checkpoint takes hours. HashCache
// keeps each file's XXH3-128 keyed by (absolute path, size, mtime_ns, inode) in a JSON file in the
// controller's state directory and re-hashes only files whose key changed.
//
// Store form: {"version": 1, "files": {"/abs/path": {"size", "mtime_ns", "inode", "xxh3_128"}}}
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/manifest/file_hash.h"

namespace glm::cluster {

// Hashes one file. Implementations are thread-safe.
class FileHasher {
 public:
  virtual ~FileHasher() = default;
  // Errors name the path.
  virtual absl::StatusOr<FileHash> Hash(const std::string& path) = 0;
};

// HashFile every time; counts the files it read (tests inject it into HashCache).
class DirectHasher : public FileHasher {
 public:
  absl::StatusOr<FileHash> Hash(const std::string& path) override;
  int files_hashed() const { return files_hashed_.load(); }

 private:
  std::atomic<int> files_hashed_{0};
};

class HashCache : public FileHasher {
 public:
  // `store`: the JSON file ("" = memory only). `inner` hashes on a miss (null = a DirectHasher);
  // not owned, must outlive the cache.
  explicit HashCache(std::string store, FileHasher* inner = nullptr);

  // Reads the store. A missing store is an empty cache; an unreadable or corrupt one is
  // discarded (logged) so a bad cache can only cost time, never a wrong hash.
  void Load();
  // Writes the store atomically (temp file + rename), dropping entries of files that are gone.
  // Errors name the path; the caller may ignore them (the cache is an optimisation).
  absl::Status Save();

  // The cached hash when (size, mtime_ns, inode) still match; otherwise hashes the file and
  // remembers the result (unless the file changed while being hashed).
  absl::StatusOr<FileHash> Hash(const std::string& path) override;

  int misses() const { return misses_.load(); }  // files hashed since construction
  int hits() const { return hits_.load(); }

 private:
  struct Entry {
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    uint64_t inode = 0;
    std::string xxh3_128;
  };
  const std::string store_;
  DirectHasher direct_;
  FileHasher* const inner_;
  std::mutex mu_;
  std::mutex save_mu_;  // one Save at a time (one temp file)
  std::map<std::string, Entry> entries_;
  std::atomic<int> misses_{0};
  std::atomic<int> hits_{0};
};

}  // namespace glm::cluster
