// WeightStore: the tensors of an HF checkpoint directory, memory-mapped, looked up by name.
//
// Quantized linear weights are read by their module's "<m>.weight" name whatever the encoding
// (ShapeOf gives the logical [out, in] shape, ReadFloat the dequantized values):
//   fp8 block      "<m>.weight" F8_E4M3 + "<m>.weight_scale_inv"
//   pack-quantized "<m>.weight_packed" I32 + "<m>.weight_scale" + "<m>.weight_shape" (no
//                  "<m>.weight" on disk)
//   NVFP4          "<m>.weight" U8 + "<m>.weight_scale" F8_E4M3 + "<m>.weight_scale_2" F32
//                  (+ "<m>.input_scale", read by nobody: weight-only)
// Tensors describe themselves; with options.quantization the store also checks them against
// the checkpoint's config (bits, group size, ignore / exclude lists) and refuses a mismatch.
//
// Layouts: `<dir>/model.safetensors.index.json` + shards (preferred when present), a single
// `<dir>/model.safetensors`, or a path to one .safetensors file. Only headers are read at Open;
// tensor bytes are paged in when used. With a filter, only the shards holding selected tensors
// are opened (a pipeline stage may have only its own shards staged).
//
// Thread-safety: immutable after Open; every const method may be called concurrently.
// Lifetime: TensorViews and their data pointers stay valid while the store lives.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config/quantization_config.h"
#include "engine/weights/dequantize.h"
#include "engine/weights/safetensors.h"
#include "engine/weights/tensor_filter.h"
#include "engine/weights/tensor_view.h"

namespace glm::engine {

struct WeightStoreOptions {
  // Tensors to make available (empty = all). The companions of "<m>.weight" (weight_scale_inv,
  // weight_packed, weight_scale, weight_scale_2, weight_shape, input_scale) are selected
  // whenever "<m>.weight" is.
  TensorFilter filter;
  // FP8 block size: pass ModelConfig::quantization->{block_rows, block_cols}.
  BlockSize block;
  // The checkpoint's declared quantization (ModelConfig::quantization); quantized tensors are
  // checked against it. Without it they are decoded from their own shapes alone.
  std::optional<QuantizationConfig> quantization;
  // Without a filter, compare the index's metadata.total_size (if present) with the sum of
  // tensor bytes (the HF convention) or of shard file sizes; a mismatch fails Open.
  bool verify_total_size = true;
  // Threads opening shards (header parsing); 0 = min(8, hardware threads).
  int open_threads = 0;
};

class WeightStore {
 public:
  // Errors: kNotFound (directory without a checkpoint, shard missing, tensor missing from its
  // shard), kDataLoss (corrupt header or index), kUnimplemented (unsupported dtype). Messages
  // name the file and tensor and say how to fix it.
  static absl::StatusOr<std::unique_ptr<WeightStore>> Open(const std::string& path,
                                                          WeightStoreOptions options = {});

  ~WeightStore();
  WeightStore(const WeightStore&) = delete;
  WeightStore& operator=(const WeightStore&) = delete;

  // How a readable weight is stored.
  enum class Encoding { kPlain, kFp8Block, kPackedInt, kNvfp4 };

  // True for stored tensors and for "<m>.weight" of a pack-quantized module.
  bool Contains(std::string_view name) const;
  // The logical shape of `name` ([out, in] for a quantized weight). kNotFound when absent;
  // kInvalidArgument for inconsistent quantized tensors.
  absl::StatusOr<std::vector<int64_t>> ShapeOf(std::string_view name) const;
  // How `name` is stored (kNotFound when absent; kInvalidArgument when its tensors or the
  // config disagree).
  absl::StatusOr<Encoding> EncodingOf(std::string_view name) const;
  // The stored tensors of a pack-quantized or NVFP4 weight `name` ("<m>.weight"), checked as
  // ReadFloat checks them: for a backend that keeps the weight as stored. kInvalidArgument naming
  // the tensor when it is stored otherwise.
  struct QuantizedParts {
    Encoding encoding = Encoding::kPackedInt;  // kPackedInt or kNvfp4
    TensorView data;                           // weight_packed (I32) or weight (U8)
    TensorView scale;                          // weight_scale
    std::optional<TensorView> scale_2;         // kNvfp4: weight_scale_2
    PackedIntLayout layout;                    // kPackedInt: bits and group size
    std::vector<int64_t> shape;                // logical [rows, cols]
  };
  absl::StatusOr<QuantizedParts> QuantizedPartsOf(std::string_view name) const;
  // The stored tensors that make up `name` (the weight and its scales), for byte accounting and
  // page-cache release. Empty when absent.
  std::vector<std::string> PartsOf(std::string_view name) const;
  // Raw bytes (any dtype). kNotFound when the tensor is absent or filtered out.
  absl::StatusOr<TensorView> Get(std::string_view name) const;
  // The block scale of "<x>.weight" ("<x>.weight_scale_inv"), or nullopt.
  std::optional<TensorView> ScaleFor(std::string_view weight_name) const;
  // The file holding `name` ("" when absent), for messages.
  std::string FileOf(std::string_view name) const;

  // Where a tensor's bytes are on disk, for page-cache management (a loader drops each range
  // from the cache once the tensor is on the device).
  struct TensorLocation {
    std::string path;     // the .safetensors file
    uint64_t offset = 0;  // byte offset of the tensor's data in that file
    uint64_t length = 0;  // bytes
  };
  // nullopt when the tensor is absent or filtered out. A block scale missing from the index is
  // found in its weight's shard, as ScaleFor does.
  std::optional<TensorLocation> LocationOf(std::string_view name) const;
  // Unmaps the store's pages of `name` (SafetensorsFile::ReleaseMappedRange) so that
  // posix_fadvise(DONTNEED) on LocationOf(name) can evict them. Reading the tensor again later
  // still works (the bytes fault back in). No-op when absent. Thread-safe.
  void ReleaseMappedPages(std::string_view name) const;
  // The data section's start in the opened file `path` (8 + header length: the bytes before it
  // are the header, read once at Open), or nullopt when the store did not open `path`.
  std::optional<uint64_t> DataOffsetOf(std::string_view path) const;
  // Unmaps the store's pages of [offset, offset + length) of the opened file `path`
  // (SafetensorsFile::ReleaseMappedRange). No-op for a file the store did not open.
  void ReleaseMappedRange(std::string_view path, uint64_t offset, uint64_t length) const;

  // Selected tensor names, sorted.
  std::vector<std::string> TensorNames() const;
  size_t num_tensors() const { return tensors_.size(); }
  // Sum of the selected tensors' bytes.
  uint64_t total_tensor_bytes() const;
  // Paths of the opened files.
  std::vector<std::string> files() const;
  const WeightStoreOptions& options() const { return options_; }

  // The tensor as fp32 in its logical shape, row-major. F32, F16, BF16, F8_E4M3; an F8_E4M3
  // weight with a "<x>.weight_scale_inv" is dequantized with options().block; pack-quantized and
  // NVFP4 weights are dequantized exactly. Other integer tensors: kUnimplemented.
  absl::StatusOr<std::vector<float>> ReadFloat(std::string_view name) const;
  // Same, after checking the shape is `expected_shape` (kInvalidArgument naming both shapes).
  absl::StatusOr<std::vector<float>> ReadFloat(std::string_view name,
                                               const std::vector<int64_t>& expected_shape) const;
  // TP slicing. Rows [row_begin, row_end) along dim 0 (any rank; the result is
  // [row_end - row_begin, <remaining dims>]) and columns [col_begin, col_end) of a 2-D tensor
  // (result [rows, col_end - col_begin]), as fp32, dequantized like ReadFloat. Only the slice is
  // decoded; a column slice of a pack-quantized or NVFP4 weight that splits a quantization group
  // is kInvalidArgument.
  absl::StatusOr<std::vector<float>> ReadRowSlice(std::string_view name, int64_t row_begin,
                                                  int64_t row_end) const;
  absl::StatusOr<std::vector<float>> ReadColSlice(std::string_view name, int64_t col_begin,
                                                  int64_t col_end) const;

 private:
  struct Location {
    const SafetensorsFile* file = nullptr;
    const SafetensorsEntry* entry = nullptr;
  };

  WeightStore() = default;
  absl::Status OpenSingle(const std::string& path);
  absl::Status OpenSharded(const std::string& dir, const std::string& index_path);
  bool Selected(std::string_view name) const;
  const Location* Locate(std::string_view name) const;
  // Locate, plus a block scale missing from the index found in its weight's shard.
  std::pair<const SafetensorsFile*, const SafetensorsEntry*> FindEntry(std::string_view name) const;
  // A companion "<m><suffix>" of weight module `module`: in the index, else in the shard of the
  // module's weight (an index that forgets a scale must not give silently unscaled weights).
  std::optional<TensorView> Companion(std::string_view module, std::string_view suffix) const;
  struct Resolved;
  absl::StatusOr<Resolved> Resolve(std::string_view name) const;
  absl::StatusOr<std::vector<float>> ReadRegion(std::string_view name, bool by_rows,
                                                int64_t begin, int64_t end) const;

  std::string path_;  // as given to Open, for messages
  WeightStoreOptions options_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Location, std::less<>> tensors_;
};

}  // namespace glm::engine
