// A WeightSource over a WeightStore (mmap'd safetensors) that drops every tensor's byte range
// from the page cache once the model has it: the range of tensor N is released when the loader
// asks for tensor N+1 (by then N was converted and uploaded), the last one in Finish(). On GB10
// the page cache competes with the GPU for the same memory (agent/pagecache), so a load must not
// leave the checkpoint cached behind it.
//
// Release = the store's own mapping of the pages is dropped (WeightStore::ReleaseMappedPages; a
// mapped page is never evicted), then PageCacheManager::ReleaseRange (posix_fadvise DONTNEED,
// bytes freed measured with mincore). The kernel evicts only whole folios inside the range, and
// page-cache folios reach 2 MiB, so a tensor smaller than its folio would never be freed on its
// own: the range passed is the tensor widened to 2 MiB boundaries, clipped to the contiguous
// span of the file already loaded and released (tracked per file; the header counts as released
// from the start). The stored parts of a weight (WeightStore::PartsOf: block scales
// "<x>.weight_scale_inv", pack-quantized "<x>.weight_packed" / "_scale" / "_shape", NVFP4
// "<x>.weight_scale" / "_scale_2" / "<x>.input_scale") are released with it.
//
// Counts tensors and checkpoint bytes read; `on_tensor` runs after each read (progress, page-cache
// policy ticks). Not thread-safe: one loader thread, like the model's Load.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/pagecache/page_cache_manager.h"
#include "engine/model/weight_source.h"
#include "engine/weights/weight_store.h"

namespace glm::agent {

class ReleasingWeights : public engine::WeightSource {
 public:
  // Called after each tensor is read: its name and the totals so far.
  using TensorFn =
      std::function<void(const std::string& name, int64_t tensors_read, uint64_t bytes_read)>;

  // `store` and `pages` must outlive this object. `pages` null: nothing is released (counting
  // only).
  ReleasingWeights(const engine::WeightStore* store, pagecache::PageCacheManager* pages,
                   TensorFn on_tensor = nullptr);
  ~ReleasingWeights() override;

  bool Has(const std::string& name) const override;
  absl::StatusOr<std::vector<float>> ReadFloat(const std::string& name,
                                               std::vector<int64_t>* shape) override;

  // Releases what is still pending (the last tensor) and closes the files. Call once the model
  // is loaded (also on failure: whatever was read is released). Returns the first release error
  // (the load itself is still good; the caller logs it).
  absl::Status Finish();

  int64_t tensors_read() const { return tensors_read_; }
  uint64_t bytes_read() const { return bytes_read_; }       // checkpoint bytes (incl. scales)
  uint64_t fp32_bytes() const { return fp32_bytes_; }       // what the model holds as fp32
  uint64_t ranges_released() const { return ranges_released_; }

 private:
  struct FileState {
    int fd = -1;                           // O_RDONLY, for posix_fadvise
    std::map<uint64_t, uint64_t> released; // merged [begin, end) spans already released
  };
  absl::Status ReleasePending();
  absl::StatusOr<FileState*> File(const std::string& path);

  const engine::WeightStore* const store_;
  pagecache::PageCacheManager* const pages_;
  TensorFn on_tensor_;
  std::vector<std::string> pending_;   // read, not yet released (the last tensor and its scale)
  std::map<std::string, FileState> files_;  // by path
  int64_t tensors_read_ = 0;
  uint64_t bytes_read_ = 0;
  uint64_t fp32_bytes_ = 0;
  uint64_t ranges_released_ = 0;
  absl::Status release_error_;
};

}  // namespace glm::agent
