// Paged KV storage owned by the model: for every layer this shard holds (including the MTP
// layer), the MLA latent rows and, on full-indexer layers, the indexer keys, both indexed by
// slot = block_id * block_size + offset. Block ids come from the scheduler's block manager.
// KvCacheGeometry::dtype picks fp32 rows or the fp8 layouts of engine/backend/kv_fp8_layout.h.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/config/model_config.h"
#include "engine/model/forward_batch.h"
#include "engine/model/layers.h"

namespace glm::engine {

// Bytes of paged KV per token position of one layer: fp32 4 * (kv_lora_rank + rope
// [+ index_head_dim]); fp8 LatentRowBytes [+ index_head_dim + 4] (GLM-5: 656 + 132).
int64_t KvBytesPerTokenOfLayer(const ModelConfig& config, KvDType dtype, bool has_indexer);

class PagedKvStorage {
 public:
  // layers: global layer indices held by this shard, in order (MTP = num_hidden_layers).
  // InvalidArgument when the geometry is empty or not representable.
  static absl::StatusOr<std::unique_ptr<PagedKvStorage>> Create(Backend* backend,
                                                                const ModelConfig& config,
                                                                const KvCacheGeometry& geometry,
                                                                const std::vector<int>& layers);

  const KvCacheGeometry& geometry() const { return geometry_; }
  int64_t num_slots() const { return static_cast<int64_t>(geometry_.block_size) * geometry_.num_blocks; }
  // The storage of global layer `layer_idx`; must be one of the layers given to Create.
  const LayerKv& layer(int layer_idx) const { return layers_[layer_pos_.at(layer_idx)]; }
  // Bytes of KV per token over all layers held (KvBytesPerTokenOfLayer summed).
  int64_t bytes_per_token() const { return bytes_per_token_; }

  // Benches: every slot of every layer gets random values (rows uniform in [-0.5, 0.5) plus a
  // constant that differs from one 8192-slot chunk to the next), written through the cache's own
  // write ops (ScatterRows, or WriteLatentFp8 / WriteIndexKeysFp8: valid e4m3 rows with their
  // scales), so that the indexer's scores and the attention weights differ from key to key as in
  // a real context instead of all tying over a zero cache. Enqueued on the backend's stream.
  void FillRandom(Backend* backend, uint64_t seed) const;

 private:
  KvCacheGeometry geometry_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<LayerKv> layers_;
  std::vector<int> layer_pos_;  // global layer index -> index into layers_, -1 if not held
  int64_t bytes_per_token_ = 0;
};

}  // namespace glm::engine
