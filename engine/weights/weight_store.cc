#include "engine/weights/weight_store.h"

#include <algorithm>
#include <cstring>
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
constexpr std::string_view kPackedSuffix = ".weight_packed";
constexpr std::string_view kQuantScaleSuffix = ".weight_scale";
constexpr std::string_view kQuantShapeSuffix = ".weight_shape";
constexpr std::string_view kGlobalScaleSuffix = ".weight_scale_2";
constexpr std::string_view kInputScaleSuffix = ".input_scale";
// Tensors stored beside "<m>.weight" (or instead of it, for weight_packed).
constexpr std::string_view kCompanionSuffixes[] = {kScaleSuffix,      kPackedSuffix,
                                                   kGlobalScaleSuffix, kQuantScaleSuffix,
                                                   kQuantShapeSuffix,  kInputScaleSuffix};

bool EndsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// "<m>" of a companion "<m><suffix>", or nullopt for other names.
std::optional<std::string_view> CompanionModule(std::string_view name) {
  for (std::string_view suffix : kCompanionSuffixes) {
    if (EndsWith(name, suffix)) return name.substr(0, name.size() - suffix.size());
  }
  return std::nullopt;
}

// weight_shape: I32 or I64 [2] = (out, in), both positive.
absl::StatusOr<std::vector<int64_t>> ReadWeightShape(const TensorView& t) {
  if ((t.dtype != DType::kI32 && t.dtype != DType::kI64) || t.num_elements() != 2 ||
      t.nbytes != 2 * DTypeSize(t.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t.name, "' is ", ToAbsl(DTypeName(t.dtype)), " ", ShapeToString(t.shape),
        "; weight_shape must be I32 or I64 [2] = (out, in): re-export the checkpoint"));
  }
  std::vector<int64_t> shape(2);
  for (int i = 0; i < 2; ++i) {
    if (t.dtype == DType::kI64) {
      std::memcpy(&shape[i], t.data + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, t.data + 4 * i, 4);
      shape[i] = v;
    }
    if (shape[i] <= 0 || shape[i] > (int64_t{1} << 31)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' holds dimension ", shape[i],
          "; weight_shape must hold two positive sizes: re-export the checkpoint"));
    }
  }
  return shape;
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
  // A companion follows its weight "<m>.weight".
  if (std::optional<std::string_view> module = CompanionModule(name)) {
    return options_.filter(absl::StrCat(ToAbsl(*module), ToAbsl(kWeightSuffix)));
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

bool WeightStore::Contains(std::string_view name) const {
  if (Locate(name) != nullptr) return true;
  return EndsWith(name, kWeightSuffix) &&
         Locate(absl::StrCat(ToAbsl(name), "_packed")) != nullptr;
}

struct WeightStore::Resolved {
  Encoding encoding = Encoding::kPlain;
  TensorView main;                    // the weight; weight_packed for kPackedInt
  std::optional<TensorView> scale;    // weight_scale_inv (fp8) or weight_scale
  std::optional<TensorView> scale_2;  // NVFP4 weight_scale_2
  PackedIntLayout layout;             // kPackedInt
  std::vector<int64_t> shape;         // logical shape
};

std::optional<TensorView> WeightStore::Companion(std::string_view module,
                                                 std::string_view suffix) const {
  const std::string name = absl::StrCat(ToAbsl(module), ToAbsl(suffix));
  if (const Location* location = Locate(name)) return location->file->View(*location->entry);
  for (std::string_view owner : {kWeightSuffix, kPackedSuffix}) {
    if (const Location* weight = Locate(absl::StrCat(ToAbsl(module), ToAbsl(owner)))) {
      if (const SafetensorsEntry* entry = weight->file->Find(name)) {
        return weight->file->View(*entry);
      }
    }
  }
  return std::nullopt;
}

absl::StatusOr<WeightStore::Resolved> WeightStore::Resolve(std::string_view name) const {
  Resolved r;
  const bool is_weight = EndsWith(name, kWeightSuffix);
  const std::string_view module =
      is_weight ? name.substr(0, name.size() - kWeightSuffix.size()) : name;
  const std::optional<QuantizationConfig>& config = options_.quantization;
  auto where = [&](const TensorView& t) {
    const std::string file = FileOf(t.name);
    return file.empty() ? path_ : file;
  };
  // The config group for a module stored quantized as `kind`; errors when the config says
  // otherwise.
  auto config_groups = [&](QuantMethod kind, const TensorView& t, std::string_view described)
      -> absl::StatusOr<std::vector<const QuantGroup*>> {
    if (!config.has_value()) return std::vector<const QuantGroup*>();
    if (config->method != kind) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(t), ": tensor '", t.name, "' is ", ToAbsl(described), " but ", config->source,
          " declares ", config->Describe(), " quantization; the config and the weights are from "
          "different checkpoints: use the config files that came with the weights"));
    }
    std::vector<const QuantGroup*> groups = config->GroupsOf(module);
    if (groups.empty()) {
      const ModulePattern* ignored = config->IgnoredBy(module);
      return absl::InvalidArgumentError(absl::StrCat(
          where(t), ": module '", ToAbsl(module), "' is stored ", ToAbsl(described), " but ",
          config->source, ignored != nullptr
                              ? absl::StrCat(" ignores it (pattern \"", ignored->text(), "\")")
                              : std::string(" has no quantization group targeting it"),
          "; the config and the weights disagree: use the config files that came with the "
          "weights"));
    }
    return groups;
  };

  if (is_weight && Locate(name) == nullptr) {
    std::optional<TensorView> packed = Companion(module, kPackedSuffix);
    if (!packed.has_value()) {
      GLM_ASSIGN_OR_RETURN(r.main, Get(name));  // the NotFound message
      return r;
    }
    r.encoding = Encoding::kPackedInt;
    r.main = *packed;
    r.scale = Companion(module, kQuantScaleSuffix);
    std::optional<TensorView> shape_tensor = Companion(module, kQuantShapeSuffix);
    if (!r.scale.has_value() || !shape_tensor.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(r.main), ": pack-quantized weight '", r.main.name, "' has no '",
          ToAbsl(module), !r.scale.has_value() ? ToAbsl(kQuantScaleSuffix) : ToAbsl(kQuantShapeSuffix),
          "'; the checkpoint is incomplete: restage or re-export it"));
    }
    GLM_ASSIGN_OR_RETURN(r.shape, ReadWeightShape(*shape_tensor));
    r.layout.rows = r.shape[0];
    r.layout.cols = r.shape[1];
    GLM_ASSIGN_OR_RETURN(std::vector<const QuantGroup*> groups,
                         config_groups(QuantMethod::kPackQuantized, r.main, "pack-quantized"));
    if (!groups.empty()) {
      // The first targeting group the tensors agree with; else the first one's mismatch.
      absl::Status first;
      for (const QuantGroup* group : groups) {
        PackedIntLayout layout = r.layout;
        layout.num_bits = group->num_bits;
        layout.group_size = group->group_size;
        absl::Status s = CheckPackedInt(r.main, *r.scale, layout);
        if (s.ok()) {
          r.layout = layout;
          return r;
        }
        if (first.ok()) {
          first = Annotate(s, absl::StrCat(where(r.main), ": config group '", group->name, "' (",
                                           group->num_bits, "-bit, ",
                                           group->group_size > 0
                                               ? absl::StrCat("group_size ", group->group_size)
                                               : std::string("per channel"),
                                           ")"));
        }
      }
      return first;
    } else {
      // No config: the bit width from the packed width, the group from the scale width.
      const int64_t words = r.main.shape.size() == 2 ? r.main.shape[1] : -1;
      const bool fits4 = words == (r.layout.cols * 4 + 31) / 32;
      const bool fits8 = words == (r.layout.cols * 8 + 31) / 32;
      const int64_t scale_cols = r.scale->shape.size() == 2 ? r.scale->shape[1] : -1;
      if (fits4 == fits8 || scale_cols <= 0 ||
          (scale_cols > 1 && r.layout.cols % scale_cols != 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(r.main), ": cannot tell the bit width / group size of '", r.main.name, "' ",
            ShapeToString(r.main.shape), " (scale ", ShapeToString(r.scale->shape),
            ") from its shapes; open the store with the checkpoint's quantization_config"));
      }
      r.layout.num_bits = fits4 ? 4 : 8;
      r.layout.group_size = scale_cols == 1 ? 0 : r.layout.cols / scale_cols;
    }
    GLM_RETURN_IF_ERROR(CheckPackedInt(r.main, *r.scale, r.layout));
    return r;
  }

  GLM_ASSIGN_OR_RETURN(r.main, Get(name));
  r.shape = r.main.shape;
  if (!is_weight) return r;
  if (r.main.dtype == DType::kU8) {
    std::optional<TensorView> scale = Companion(module, kQuantScaleSuffix);
    std::optional<TensorView> scale_2 = Companion(module, kGlobalScaleSuffix);
    const bool declared = config.has_value() && config->method == QuantMethod::kNvfp4 &&
                          config->GroupOf(module) != nullptr;
    if (!scale.has_value() && !scale_2.has_value() && !declared) return r;  // a raw U8 tensor
    if (!scale.has_value() || !scale_2.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(r.main), ": NVFP4 weight '", ToAbsl(name), "' has no '", ToAbsl(module),
          !scale.has_value() ? ToAbsl(kQuantScaleSuffix) : ToAbsl(kGlobalScaleSuffix),
          "'; the checkpoint is incomplete: restage or re-export it"));
    }
    GLM_RETURN_IF_ERROR(config_groups(QuantMethod::kNvfp4, r.main, "NVFP4").status());
    r.encoding = Encoding::kNvfp4;
    r.scale = scale;
    r.scale_2 = scale_2;
    GLM_RETURN_IF_ERROR(CheckNvfp4(r.main, *r.scale, *r.scale_2));
    r.shape = {r.main.shape[0], r.main.shape[1] * 2};
    return r;
  }
  if (r.main.dtype == DType::kF8E4M3) {
    r.scale = ScaleFor(name);
    if (r.scale.has_value()) r.encoding = Encoding::kFp8Block;
  }
  return r;
}

absl::StatusOr<std::vector<int64_t>> WeightStore::ShapeOf(std::string_view name) const {
  GLM_ASSIGN_OR_RETURN(Resolved r, Resolve(name));
  return r.shape;
}

absl::StatusOr<WeightStore::Encoding> WeightStore::EncodingOf(std::string_view name) const {
  GLM_ASSIGN_OR_RETURN(Resolved r, Resolve(name));
  return r.encoding;
}

absl::StatusOr<WeightStore::QuantizedParts> WeightStore::QuantizedPartsOf(
    std::string_view name) const {
  GLM_ASSIGN_OR_RETURN(Resolved r, Resolve(name));
  if ((r.encoding != Encoding::kPackedInt && r.encoding != Encoding::kNvfp4) ||
      !r.scale.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", ToAbsl(name), " in ", FileOf(r.main.name),
        " is not a pack-quantized INT4 / INT8 or NVFP4 weight; read it with ReadFloat"));
  }
  QuantizedParts p;
  p.encoding = r.encoding;
  p.data = r.main;
  p.scale = *r.scale;
  p.scale_2 = r.scale_2;
  p.layout = r.layout;
  p.shape = r.shape;
  return p;
}

std::vector<std::string> WeightStore::PartsOf(std::string_view name) const {
  std::vector<std::string> parts;
  absl::StatusOr<Resolved> r = Resolve(name);
  if (!r.ok()) {
    if (Contains(name)) parts.emplace_back(name);
    return parts;
  }
  parts.push_back(r->main.name);
  if (r->scale) parts.push_back(r->scale->name);
  if (r->scale_2) parts.push_back(r->scale_2->name);
  if (r->encoding == Encoding::kPackedInt || r->encoding == Encoding::kNvfp4) {
    const std::string_view module = name.substr(0, name.size() - kWeightSuffix.size());
    for (std::string_view suffix : {kQuantShapeSuffix, kInputScaleSuffix}) {
      if (std::optional<TensorView> t = Companion(module, suffix)) parts.push_back(t->name);
    }
  }
  return parts;
}

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
  // A companion the index forgot: in its weight's shard.
  if (std::optional<std::string_view> module = CompanionModule(name)) {
    for (std::string_view owner : {kWeightSuffix, kPackedSuffix}) {
      if (const Location* weight = Locate(absl::StrCat(ToAbsl(*module), ToAbsl(owner)))) {
        if (const SafetensorsEntry* entry = weight->file->Find(name)) return {weight->file, entry};
      }
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
  GLM_ASSIGN_OR_RETURN(Resolved r, Resolve(name));
  const TensorView& tensor = r.main;
  if (r.encoding == Encoding::kPlain && tensor.dtype == DType::kF8E4M3 &&
      EndsWith(name, kWeightSuffix)) {
    // Per-tensor FP8 scales (compressed-tensors "<x>.weight_scale") are another format; decoding
    // the codes without them would give wrong weights.
    const std::string per_tensor = absl::StrCat(ToAbsl(name), "_scale");
    if (Companion(name.substr(0, name.size() - kWeightSuffix.size()), kQuantScaleSuffix)) {
      return absl::UnimplementedError(absl::StrCat(
          FileOf(name), ": tensor '", ToAbsl(name), "' has a per-tensor scale '", per_tensor,
          "'; only 128x128 block-scaled FP8 (weight_scale_inv) is supported: use the "
          "block-quantized FP8 or the BF16 checkpoint"));
    }
  }
  const MatrixExtent extent = AsMatrix(r.shape);
  if (!by_rows && r.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        FileOf(tensor.name), ": tensor '", ToAbsl(name), "' has shape ", ShapeToString(r.shape),
        "; column slices need a 2-D tensor"));
  }
  const int64_t row_begin = by_rows ? begin : 0;
  const int64_t row_end = by_rows ? end : extent.rows;
  const int64_t col_begin = by_rows ? 0 : begin;
  const int64_t col_end = by_rows ? extent.cols : end;
  absl::StatusOr<std::vector<float>> result;
  switch (r.encoding) {
    case Encoding::kPackedInt:
      result = DecodePackedIntRegion(tensor, *r.scale, r.layout, row_begin, row_end, col_begin,
                                     col_end);
      break;
    case Encoding::kNvfp4:
      result = DecodeNvfp4Region(tensor, *r.scale, *r.scale_2, row_begin, row_end, col_begin,
                                 col_end);
      break;
    default:
      result = DecodeRegion(tensor, r.scale ? &*r.scale : nullptr, options_.block, row_begin,
                            row_end, col_begin, col_end);
  }
  if (!result.ok()) return Annotate(result.status(), FileOf(tensor.name));
  return result;
}

absl::StatusOr<std::vector<float>> WeightStore::ReadFloat(std::string_view name) const {
  GLM_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ShapeOf(name));
  return ReadRegion(name, /*by_rows=*/true, 0, AsMatrix(shape).rows);
}

absl::StatusOr<std::vector<float>> WeightStore::ReadFloat(
    std::string_view name, const std::vector<int64_t>& expected_shape) const {
  GLM_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ShapeOf(name));
  if (shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        FileOf(name), ": tensor '", ToAbsl(name), "' has shape ", ShapeToString(shape),
        " but the model config expects ", ShapeToString(expected_shape),
        "; config.json and the weights disagree: use the config.json that came with them"));
  }
  return ReadRegion(name, /*by_rows=*/true, 0, AsMatrix(shape).rows);
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
