// Safetensors files: header parsing/validation and a memory-mapped reader.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// then the data section; offsets are relative to its start (byte 8 + N).
//
// Only the header is read when a file is opened; tensor bytes are touched on demand through the
// mapping (checkpoints are hundreds of GB). All errors name the file and, where there is one, the
// tensor, and say how to fix it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/weights/dtype.h"
#include "engine/weights/tensor_view.h"

namespace glm::engine {

// Headers larger than this are rejected as corrupt (GLM-5.2 shards have headers of ~100 KB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull * 1000 * 1000;

// One validated header entry.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section, end - begin == numel * dtype size
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t header_size = 0;  // N, the JSON length
  uint64_t data_offset = 0;  // 8 + N: where the data section starts in the file
  uint64_t data_size = 0;    // file size - data_offset
  std::vector<SafetensorsEntry> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;  // "__metadata__", if present
};

// Parses and validates the header of a safetensors file whose complete contents are `file`
// (usually a memory mapping: only the first 8 + N bytes are read). `file_label` (the path)
// prefixes every error. Checks: N fits the file and is at most kMaxSafetensorsHeaderBytes; the
// JSON is one object with no duplicate names; each entry has a supported dtype, a shape of
// non-negative integers whose element and byte counts fit in 64 bits, data_offsets [begin, end]
// with begin <= end <= data size and end - begin == numel * dtype size; no two tensors overlap;
// "__metadata__", if present, maps strings to strings. Returns kDataLoss for a corrupt file and
// kUnimplemented for a dtype this reader does not support.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> file,
                                                         std::string_view file_label);

// A safetensors file mapped read-only (MAP_PRIVATE). Immutable after Open; thread-safe.
// TensorViews it returns are valid while it lives.
class SafetensorsFile {
 public:
  // Maps `path` and validates its header (ParseSafetensorsHeader). kNotFound if it is missing.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Wraps bytes the caller keeps alive (tests, fuzzing). `label` names it in errors.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBuffer(
      std::span<const std::byte> bytes, std::string label);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_.size(); }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<SafetensorsEntry>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }

  // nullptr when the file has no tensor `name`.
  const SafetensorsEntry* Find(std::string_view name) const;
  TensorView View(const SafetensorsEntry& entry) const;
  // kNotFound naming the file when absent.
  absl::StatusOr<TensorView> Get(std::string_view name) const;

  // Byte offset of `entry`'s data in the file (header.data_offset + entry.begin).
  uint64_t FileOffset(const SafetensorsEntry& entry) const {
    return header_.data_offset + entry.begin;
  }
  // Drops this file's own mapping of the pages covering [offset, offset + length) of the file
  // (madvise MADV_DONTNEED, widened to whole pages; neighbouring tensors on those pages simply
  // fault back in when read). The mapping is read-only and private, so nothing is lost: later
  // reads fault the bytes back from the file. The kernel never evicts a mapped page, so this is
  // what lets posix_fadvise(POSIX_FADV_DONTNEED) free a loaded range from the page cache.
  // No-op for FromBuffer files. Thread-safe.
  void ReleaseMappedRange(uint64_t offset, uint64_t length) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::span<const std::byte> file_;  // the whole file
  void* mapping_ = nullptr;          // non-null when we own an mmap of file_.size() bytes
  SafetensorsHeader header_;
};

}  // namespace glm::engine
