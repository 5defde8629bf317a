#include "agent/stage/nccl_stage.h"

#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cluster/manifest/file_hash.h"

namespace glm::stage {

absl::StatusOr<NcclStageResult> StageAndLoadNccl(const NcclStageOptions& options) {
  namespace fs = std::filesystem;
  std::string expected = options.expected_hash;
  if (expected.empty()) {
    if (options.source_path.empty()) {
      return absl::InvalidArgumentError(
          "NCCL staging needs the source's hash or a readable source_path");
    }
    absl::StatusOr<cluster::FileHash> source = cluster::HashFile(options.source_path);
    if (!source.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot read the NCCL source ", options.source_path, ": ", source.status().message()));
    }
    expected = source->xxh3_128;
  }
  NcclStageResult result;
  absl::StatusOr<cluster::FileHash> present = cluster::HashFile(options.dest_path);
  if (!present.ok() || present->xxh3_128 != expected) {
    std::string partial = options.dest_path + ".partial";
    std::error_code ec;
    fs::create_directories(fs::path(options.dest_path).parent_path(), ec);
    fs::remove(partial, ec);
    absl::Status fetched;
    if (options.fetch) {
      fetched = options.fetch(partial);
    } else if (!fs::copy_file(options.source_path, partial, fs::copy_options::overwrite_existing, ec)) {
      fetched = absl::UnavailableError(absl::StrCat("copy ", options.source_path, " → ", partial,
                                                    ": ", ec.message()));
    }
    if (!fetched.ok()) {
      fs::remove(partial, ec);
      return absl::UnavailableError(absl::StrCat("staging NCCL to ", options.dest_path,
                                                 " failed: ", fetched.message()));
    }
    absl::StatusOr<cluster::FileHash> got = cluster::HashFile(partial);
    if (!got.ok() || got->xxh3_128 != expected) {
      fs::remove(partial, ec);
      return absl::DataLossError(absl::StrCat(
          "staged NCCL library hash ", got.ok() ? got->xxh3_128 : std::string("unreadable"),
          " differs from the source's ", expected, "; the copy was discarded, re-run staging"));
    }
    fs::rename(partial, options.dest_path, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("rename ", partial, " → ", options.dest_path,
                                                 ": ", ec.message()));
    }
    result.copied = true;
  }
  result.hash = expected;
  absl::StatusOr<std::unique_ptr<NcclLibrary>> lib =
      NcclLibrary::Load(options.dest_path, options.expected_version);
  if (!lib.ok()) return lib.status();
  result.library = std::move(*lib);
  return result;
}

}  // namespace glm::stage
