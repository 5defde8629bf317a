#include "engine/model/kv_storage.h"

#include "absl/strings/str_cat.h"

namespace glm::engine {

absl::StatusOr<std::unique_ptr<PagedKvStorage>> PagedKvStorage::Create(
    Backend* backend, const ModelConfig& config, const KvCacheGeometry& geometry,
    const std::vector<int>& layers) {
  if (geometry.block_size <= 0 || geometry.num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache geometry block_size=", geometry.block_size, " num_blocks=", geometry.num_blocks,
        " is empty; set ModelLoadOptions.kv to a positive block size and block count"));
  }
  auto kv = std::unique_ptr<PagedKvStorage>(new PagedKvStorage());
  kv->geometry_ = geometry;
  const int64_t slots = kv->num_slots();
  const int64_t latent_width = config.kv_lora_rank + config.qk_rope_head_dim;
  int max_layer = 0;
  for (int l : layers) max_layer = std::max(max_layer, l);
  kv->layer_pos_.assign(max_layer + 1, -1);
  for (int l : layers) {
    LayerKv lk;
    // [num_slots, kv_lora_rank + qk_rope_head_dim]
    kv->buffers_.push_back(backend->Allocate(slots * latent_width * sizeof(float)));
    lk.latent = {kv->buffers_.back()->f32(), slots, latent_width, latent_width};
    kv->bytes_per_token_ += latent_width * static_cast<int64_t>(sizeof(float));
    if (config.HasIndexer(l)) {
      // [num_slots, index_head_dim]
      kv->buffers_.push_back(backend->Allocate(slots * config.index_head_dim * sizeof(float)));
      lk.index_keys = {kv->buffers_.back()->f32(), slots, config.index_head_dim,
                       config.index_head_dim};
      kv->bytes_per_token_ += config.index_head_dim * static_cast<int64_t>(sizeof(float));
    }
    kv->layer_pos_[l] = static_cast<int>(kv->layers_.size());
    kv->layers_.push_back(lk);
  }
  return kv;
}

}  // namespace glm::engine
