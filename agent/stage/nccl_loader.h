// Loading a pinned NCCL build with dlopen and checking its version (the community recipes pin
// 2.30.4; a different build with the same version string once fixed multi-node wedges on GB10,
// vllm-project/vllm#42354, so the hash is checked too, by the stager).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/dist/nccl_table.h"

namespace glm::stage {

// "2.30.4" → 23004 (NCCL_VERSION_CODE for >= 2.9: major*10000 + minor*100 + patch).
absl::StatusOr<int> ParseNcclVersion(const std::string& version);
// 23004 → "2.30.4"; codes below 10000 use the pre-2.9 scheme (major*1000 + minor*100 + patch).
std::string FormatNcclVersion(int code);

// An open NCCL library. Move-only; dlclose on destruction, after which the table is invalid.
class NcclLibrary {
 public:
  ~NcclLibrary();
  NcclLibrary(const NcclLibrary&) = delete;
  NcclLibrary& operator=(const NcclLibrary&) = delete;

  // dlopen(path, RTLD_NOW | RTLD_LOCAL), resolve every FunctionTable symbol (all required but
  // CommInitRankConfig, left null for NCCL < 2.14), call ncclGetVersion. When
  // `expected_version` is not empty the version must equal it. Errors name the file, the
  // missing symbol / dlerror text, or both versions, and the fix.
  static absl::StatusOr<std::unique_ptr<NcclLibrary>> Load(const std::string& path,
                                                           const std::string& expected_version);

  const nccl::FunctionTable& table() const { return table_; }
  int version_code() const { return version_code_; }
  std::string version() const { return FormatNcclVersion(version_code_); }
  const std::string& path() const { return path_; }

 private:
  NcclLibrary() = default;
  void* handle_ = nullptr;
  nccl::FunctionTable table_{};
  int version_code_ = 0;
  std::string path_;
};

}  // namespace glm::stage
