#include "engine/weights/weight_store.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "engine/weights/safetensors_index.h"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kWeightSuffix = ".weight";
constexpr std::string_view kScaleSuffix = ".weight_scale_inv";

bool EndsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read; stage the checkpoint "
                                                  "completely"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return text.str();
}

// Opens `paths` on up to `num_threads` threads; the first error (in path order) wins.
absl::StatusOr<std::vector<std::unique_ptr<SafetensorsFile>>> OpenAll(
    const std::vector<std::string>& paths, int num_threads) {
  std::vector<absl::StatusOr<std::unique_ptr<SafetensorsFile>>> results;
  results.reserve(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) results.emplace_back(absl::UnknownError("not opened"));
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < paths.size(); i = next++) {
      results[i] = SafetensorsFile::Open(paths[i]);
    }
  };
  const size_t count = std::min<size_t>(paths.size(), static_cast<size_t>(std::max(num_threads, 1)));
  std::vector<std::thread> threads;
  for (size_t t = 1; t < count; ++t) threads.emplace_back(worker);
  worker();
  for (auto& thread : threads) thread.join();

  std::vector<std::unique_ptr<SafetensorsFile>> files;
  files.reserve(paths.size());
  for (auto& result : results) {
    if (!result.ok()) return result.status();
    files.push_back(std::move(result).value());
  }
  return files;
}

}  // namespace

WeightStore::~WeightStore() = default;

absl::StatusOr<std::unique_ptr<WeightStore>> WeightStore::Open(const std::string& path,
                                                              WeightStoreOptions options) {
  auto store = std::unique_ptr<WeightStore>(new WeightStore());
  store->path_ = path;
  store->options_ = std::move(options);
  if (store->options_.open_threads <= 0) {
    store->options_.open_threads =
        static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  }
  std::error_code error;
  if (fs::is_regular_file(path, error)) {
    GLM_RETURN_IF_ERROR(store->OpenSingle(path));
    return store;
  }
  if (!fs::is_directory(path, error)) {
    return absl::NotFoundError(absl::StrCat(
        path, ": no such checkpoint directory or .safetensors file; check --model and that "
              "the weights were staged"));
  }
  const std::string index_path = (fs::path(path) / kSafetensorsIndexName).string();
  if (fs::exists(index_path, error)) {
    GLM_RETURN_IF_ERROR(store->OpenSharded(path, index_path));
    return store;
  }
  const std::string single_path = (fs::path(path) / kSingleSafetensorsName).string();
  if (fs::exists(single_path, error)) {
    GLM_RETURN_IF_ERROR(store->OpenSingle(single_path));
    return store;
  }
  return absl::NotFoundError(absl::StrCat(
      path, ": neither ", ToAbsl(kSafetensorsIndexName), " nor ", ToAbsl(kSingleSafetensorsName),
      " found; is this an HF checkpoint directory? stage the weights completely"));
}

bool WeightStore::Selected(std::string_view name) const {
  if (!options_.filter) return true;
  if (options_.filter(name)) return true;
  if (EndsWith(name, kScaleSuffix)) {
    // "<x>.weight_scale_inv" follows "<x>.weight".
    const std::string weight(name.substr(0, name.size() - std::string_view("_scale_inv").size()));
    return options_.filter(weight);
  }
  return false;
}

absl::Status WeightStore::OpenSingle(const std::string& path) {
  GLM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  for (const SafetensorsEntry& entry : file->tensors()) {
    if (Selected(entry.name)) tensors_.emplace(entry.name, Location{file.get(), &entry});
  }
  files_.push_back(std::move(file));
  return absl::OkStatus();
}

absl::Status WeightStore::OpenSharded(const std::string& dir, const std::string& index_path) {
  GLM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(index_path));
  GLM_ASSIGN_OR_RETURN(SafetensorsIndex index, ParseSafetensorsIndex(text, index_path));

  // Shards to open: those holding a selected tensor (all of them without a filter).
  std::map<std::string, std::vector<const std::string*>> names_by_shard;
  for (const auto& [name, shard] : index.weight_map) {
    if (Selected(name)) names_by_shard[shard].push_back(&name);
  }
  std::vector<std::string> paths;
  std::vector<const std::string*> shard_names;
  for (const auto& [shard, names] : names_by_shard) {
    const std::string shard_path = (fs::path(dir) / shard).string();
    std::error_code error;
    if (!fs::exists(shard_path, error)) {
      return absl::NotFoundError(absl::StrCat(
          index_path, ": tensor '", *names.front(), "' is in shard '", shard, "' but ",
          shard_path, " does not exist; the checkpoint is incompletely staged: restage it"));
    }
    paths.push_back(shard_path);
    shard_names.push_back(&shard);
  }
  GLM_ASSIGN_OR_RETURN(files_, OpenAll(paths, options_.open_threads));

  uint64_t tensor_bytes = 0;
  uint64_t file_bytes = 0;
  size_t shard_idx = 0;
  for (const auto& [shard, names] : names_by_shard) {
    const SafetensorsFile* file = files_[shard_idx++].get();
    file_bytes += file->file_size();
    for (const std::string* name : names) {
      const SafetensorsEntry* entry = file->Find(*name);
      if (entry == nullptr) {
        return absl::NotFoundError(absl::StrCat(
            index_path, ": tensor '", *name, "' is listed in shard '", shard, "' but ",
            file->path(), " does not contain it; the index and shards are from different "
            "revisions or the shard is damaged: re-download/restage the checkpoint"));
      }
      tensor_bytes += entry->end - entry->begin;
      tensors_.emplace(*name, Location{file, entry});
    }
  }

  if (options_.verify_total_size && !options_.filter && index.total_size &&
      *index.total_size != tensor_bytes && *index.total_size != file_bytes) {
    return absl::DataLossError(absl::StrCat(
        index_path, ": metadata.total_size is ", *index.total_size, " but the shards hold ",
        tensor_bytes, " tensor bytes (", file_bytes, " bytes in files); a shard is stale or "
        "truncated: re-download/restage the checkpoint (or open with verify_total_size=false "
        "if the index was written by a tool that counts differently)"));
  }
  return absl::OkStatus();
}

const WeightStore::Location* WeightStore::Locate(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

bool WeightStore::Contains(std::string_view name) const { return Locate(name) != nullptr; }

absl::StatusOr<TensorView> WeightStore::Get(std::string_view name) const {
  const Location* location = Locate(name);
  if (location == nullptr) {
    const bool excluded = options_.filter && !files_.empty() && !Selected(name);
    return absl::NotFoundError(absl::StrCat(
        path_, ": tensor '", ToAbsl(name), "' is not in the checkpoint",
        excluded ? " selection (excluded by the layer filter)" : "",
        "; check the name against the checkpoint's index/header and the model config"));
  }
  return location->file->View(*location->entry);
}

std::optional<TensorView> WeightStore::ScaleFor(std::string_view weight_name) const {
  if (!EndsWith(weight_name, kWeightSuffix)) return std::nullopt;
  const std::string scale_name = absl::StrCat(ToAbsl(weight_name), "_scale_inv");
  if (const Location* location = Locate(scale_name)) {
    return location->file->View(*location->entry);
  }
  // An index that forgets a scale must not turn into silently unscaled weights: look in the
  // weight's own shard too.
  if (const Location* weight = Locate(weight_name)) {
    if (const SafetensorsEntry* entry = weight->file->Find(scale_name)) {
      return weight->file->View(*entry);
    }
  }
  return std::nullopt;
}

std::string WeightStore::FileOf(std::string_view name) const {
  const Location* location = Locate(name);
  return location == nullptr ? std::string() : location->file->path();
}

std::pair<const SafetensorsFile*, const SafetensorsEntry*> WeightStore::FindEntry(
    std::string_view name) const {
  if (const Location* location = Locate(name)) return {location->file, location->entry};
  if (EndsWith(name, kScaleSuffix)) {  // a scale the index forgot: in its weight's shard
    const std::string weight_name(name.substr(0, name.size() - kScaleSuffix.size() +
                                                  kWeightSuffix.size()));
    if (const Location* weight = Locate(weight_name)) {
      if (const SafetensorsEntry* entry = weight->file->Find(name)) return {weight->file, entry};
    }
  }
  return {nullptr, nullptr};
}

std::optional<WeightStore::TensorLocation> WeightStore::LocationOf(std::string_view name) const {
  auto [file, entry] = FindEntry(name);
  if (file == nullptr) return std::nullopt;
  return TensorLocation{file->path(), file->FileOffset(*entry), entry->end - entry->begin};
}

void WeightStore::ReleaseMappedPages(std::string_view name) const {
  auto [file, entry] = FindEntry(name);
  if (file != nullptr) file->ReleaseMappedRange(file->FileOffset(*entry), entry->end - entry->begin);
}

std::optional<uint64_t> WeightStore::DataOffsetOf(std::string_view path) const {
  for (const auto& file : files_) {
    if (file->path() == path) return file->header().data_offset;
  }
  return std::nullopt;
}

void WeightStore::ReleaseMappedRange(std::string_view path, uint64_t offset,
                                     uint64_t length) const {
  for (const auto& file : files_) {
    if (file->path() == path) file->ReleaseMappedRange(offset, length);
  }
}

std::vector<std::string> WeightStore::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, location] : tensors_) names.push_back(name);
  return names;
}

uint64_t WeightStore::total_tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, location] : tensors_) total += location.entry->end - location.entry->begin;
  return total;
}

std::vector<std::string> WeightStore::files() const {
  std::vector<std::string> paths;
  for (const auto& file : files_) paths.push_back(file->path());
  return paths;
}

absl::StatusOr<std::vector<float>> WeightStore::ReadRegion(std::string_view name, bool by_rows,
                                                           int64_t begin, int64_t end) const {
  GLM_ASSIGN_OR_RETURN(TensorView tensor, Get(name));
  std::optional<TensorView> scale = ScaleFor(name);
  if (tensor.dtype == DType::kF8E4M3 && !scale && EndsWith(name, kWeightSuffix)) {
    // Per-tensor FP8 scales (compressed-tensors "<x>.weight_scale") are another format; decoding
    // the codes without them would give wrong weights.
    const Location* location = Locate(name);
    const std::string per_tensor = absl::StrCat(ToAbsl(name), "_scale");
    if (Contains(per_tensor) || location->file->Find(per_tensor) != nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          FileOf(name), ": tensor '", ToAbsl(name), "' has a per-tensor scale '", per_tensor,
          "'; only 128x128 block-scaled FP8 (weight_scale_inv) is supported: use the "
          "block-quantized FP8 or the BF16 checkpoint"));
    }
  }
  const MatrixExtent extent = AsMatrix(tensor.shape);
  if (!by_rows && tensor.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        FileOf(name), ": tensor '", ToAbsl(name), "' has shape ", ShapeToString(tensor.shape),
        "; column slices need a 2-D tensor"));
  }
  auto result = by_rows
                    ? DecodeRegion(tensor, scale ? &*scale : nullptr, options_.block, begin, end,
                                   0, extent.cols)
                    : DecodeRegion(tensor, scale ? &*scale : nullptr, options_.block, 0,
                                   extent.rows, begin, end);
  if (!result.ok()) return Annotate(result.status(), FileOf(name));
  return result;
}

absl::StatusOr<std::vector<float>> WeightStore::ReadFloat(std::string_view name) const {
  GLM_ASSIGN_OR_RETURN(TensorView tensor, Get(name));
  return ReadRegion(name, /*by_rows=*/true, 0, AsMatrix(tensor.shape).rows);
}

absl::StatusOr<std::vector<float>> WeightStore::ReadFloat(
    std::string_view name, const std::vector<int64_t>& expected_shape) const {
  GLM_ASSIGN_OR_RETURN(TensorView tensor, Get(name));
  if (tensor.shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        FileOf(name), ": tensor '", ToAbsl(name), "' has shape ", ShapeToString(tensor.shape),
        " but the model config expects ", ShapeToString(expected_shape),
        "; config.json and the weights disagree: use the config.json that came with them"));
  }
  return ReadRegion(name, /*by_rows=*/true, 0, AsMatrix(tensor.shape).rows);
}

absl::StatusOr<std::vector<float>> WeightStore::ReadRowSlice(std::string_view name,
                                                             int64_t row_begin,
                                                             int64_t row_end) const {
  return ReadRegion(name, /*by_rows=*/true, row_begin, row_end);
}

absl::StatusOr<std::vector<float>> WeightStore::ReadColSlice(std::string_view name,
                                                             int64_t col_begin,
                                                             int64_t col_end) const {
  return ReadRegion(name, /*by_rows=*/false, col_begin, col_end);
}

}  // namespace glm::engine
