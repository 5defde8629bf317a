#include "engine/model/kv_storage.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace glm::engine {

absl::Status ParseKvDType(const std::string& s, KvDType* out) {
  if (s == "fp32") {
    *out = KvDType::kF32;
  } else if (s == "fp8") {
    *out = KvDType::kFp8;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache dtype `", s, "` is not one of fp32, fp8 (--kv-dtype / kv_dtype)"));
  }
  return absl::OkStatus();
}

const char* KvDTypeName(KvDType dtype) { return dtype == KvDType::kFp8 ? "fp8" : "fp32"; }

int64_t KvBytesPerTokenOfLayer(const ModelConfig& config, KvDType dtype, bool has_indexer) {
  if (dtype == KvDType::kFp8) {
    return kv_fp8::LatentRowBytes(config.kv_lora_rank, config.qk_rope_head_dim) +
           (has_indexer ? kv_fp8::IndexBytesPerToken(config.index_head_dim) : 0);
  }
  return (config.kv_lora_rank + config.qk_rope_head_dim +
          (has_indexer ? config.index_head_dim : 0)) *
         static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<std::unique_ptr<PagedKvStorage>> PagedKvStorage::Create(
    Backend* backend, const ModelConfig& config, const KvCacheGeometry& geometry,
    const std::vector<int>& layers) {
  if (geometry.block_size <= 0 || geometry.num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache geometry block_size=", geometry.block_size, " num_blocks=", geometry.num_blocks,
        " is empty; set ModelLoadOptions.kv to a positive block size and block count"));
  }
  // Slot ids (block * block_size + offset) are int32 in every table and kernel.
  const int64_t positions = int64_t{geometry.block_size} * geometry.num_blocks;
  if (positions > int64_t{0x7fffffff}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache geometry block_size=", geometry.block_size, " num_blocks=", geometry.num_blocks,
        " holds ", positions, " positions; slot ids are int32, so a shard holds at most ",
        int64_t{0x7fffffff}, ": use fewer blocks (or a smaller memory fraction)"));
  }
  const bool fp8 = geometry.dtype == KvDType::kFp8;
  if (fp8 && (!kv_fp8::LatentShapeOk(config.kv_lora_rank, config.qk_rope_head_dim) ||
              !kv_fp8::IndexShapeOk(config.index_head_dim))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp8 KV cache needs kv_lora_rank % 4 == 0 (", config.kv_lora_rank,
        "), qk_rope_head_dim even (", config.qk_rope_head_dim, ") and index_head_dim % 4 == 0 (",
        config.index_head_dim, "); use --kv-dtype fp32 for this model"));
  }
  auto kv = std::unique_ptr<PagedKvStorage>(new PagedKvStorage());
  kv->geometry_ = geometry;
  const int64_t slots = kv->num_slots();
  const int64_t latent_width = config.kv_lora_rank + config.qk_rope_head_dim;
  const int64_t latent_bytes =
      kv_fp8::LatentRowBytes(config.kv_lora_rank, config.qk_rope_head_dim);
  const int64_t index_bytes = kv_fp8::IndexBytesPerToken(config.index_head_dim);
  int max_layer = 0;
  for (int l : layers) max_layer = std::max(max_layer, l);
  kv->layer_pos_.assign(max_layer + 1, -1);
  for (int l : layers) {
    LayerKv lk;
    lk.dtype = geometry.dtype;
    const bool indexer = config.HasIndexer(l);
    if (fp8) {
      // [num_slots, LatentRowBytes] (kv_fp8_layout.h)
      kv->buffers_.push_back(backend->Allocate(slots * latent_bytes));
      lk.latent_fp8 = {static_cast<uint8_t*>(kv->buffers_.back()->data()), slots,
                       static_cast<int32_t>(config.kv_lora_rank),
                       static_cast<int32_t>(config.qk_rope_head_dim)};
      if (indexer) {
        // num_blocks blocks of block_size * (index_head_dim + 4) bytes
        kv->buffers_.push_back(backend->Allocate(slots * index_bytes));
        lk.index_fp8 = {static_cast<uint8_t*>(kv->buffers_.back()->data()), slots,
                        static_cast<int32_t>(config.index_head_dim), geometry.block_size};
      }
    } else {
      // [num_slots, kv_lora_rank + qk_rope_head_dim]
      kv->buffers_.push_back(backend->Allocate(slots * latent_width * sizeof(float)));
      lk.latent = {kv->buffers_.back()->f32(), slots, latent_width, latent_width};
      if (indexer) {
        // [num_slots, index_head_dim]
        kv->buffers_.push_back(backend->Allocate(slots * config.index_head_dim * sizeof(float)));
        lk.index_keys = {kv->buffers_.back()->f32(), slots, config.index_head_dim,
                         config.index_head_dim};
      }
    }
    kv->bytes_per_token_ += KvBytesPerTokenOfLayer(config, geometry.dtype, indexer);
    kv->layer_pos_[l] = static_cast<int>(kv->layers_.size());
    kv->layers_.push_back(lk);
  }
  return kv;
}

void PagedKvStorage::FillRandom(Backend* backend, uint64_t seed) const {
  constexpr int64_t kChunk = 8192;
  int64_t width = 1;
  for (const LayerKv& lk : layers_) {
    width = std::max<int64_t>({width, lk.latent.cols, lk.index_keys.cols,
                               int64_t{lk.latent_fp8.kv_lora_rank} + lk.latent_fp8.rope_dim,
                               int64_t{lk.index_fp8.dim}});
  }
  const int64_t slots = num_slots();
  std::vector<float> base(static_cast<size_t>(kChunk * width));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& v : base) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(x >> 40) * (1.0f / 16777216.0f) - 0.5f;  // [-0.5, 0.5)
  }
  std::vector<int32_t> ids(static_cast<size_t>(slots));
  for (int64_t i = 0; i < slots; ++i) ids[i] = static_cast<int32_t>(i);
  std::unique_ptr<Buffer> d_base = backend->Allocate(base.size() * sizeof(float));
  std::unique_ptr<Buffer> d_rows = backend->Allocate(base.size() * sizeof(float));
  std::unique_ptr<Buffer> d_shift = backend->Allocate(base.size() * sizeof(float));
  std::unique_ptr<Buffer> d_ids = backend->Allocate(ids.size() * sizeof(int32_t));
  backend->CopyToDevice(d_base->data(), base.data(), base.size() * sizeof(float));
  backend->CopyToDevice(d_ids->data(), ids.data(), ids.size() * sizeof(int32_t));
  const int32_t* all = static_cast<const int32_t*>(d_ids->data());
  for (int64_t b = 0, chunk = 0; b < slots; b += kChunk, ++chunk) {
    const int64_t n = std::min(kChunk, slots - b);
    const MatView rows{d_rows->f32(), n, width, width};
    const MatView shift{d_shift->f32(), n, width, width};
    backend->Copy(MatView{d_base->f32(), n, width, width}, rows);
    // A different constant per chunk (golden-ratio steps in [-0.5, 0.5)): no two chunks repeat.
    const double c = std::fmod(static_cast<double>(chunk) * 0.6180339887498949, 1.0) - 0.5;
    backend->Fill(shift, static_cast<float>(c));
    backend->Add(shift, rows);
    for (const LayerKv& lk : layers_) {
      if (lk.dtype == KvDType::kFp8) {
        const int64_t lw = int64_t{lk.latent_fp8.kv_lora_rank} + lk.latent_fp8.rope_dim;
        backend->WriteLatentFp8(rows.Cols(0, lw), all + b, lk.latent_fp8);
        if (lk.index_fp8.num_slots > 0) {
          backend->WriteIndexKeysFp8(rows.Cols(0, lk.index_fp8.dim), all + b, lk.index_fp8);
        }
      } else {
        backend->ScatterRows(rows.Cols(0, lk.latent.cols), all + b, lk.latent);
        if (lk.index_keys.rows > 0) {
          backend->ScatterRows(rows.Cols(0, lk.index_keys.cols), all + b, lk.index_keys);
        }
      }
    }
  }
  backend->Synchronize();  // the scratch buffers are freed on return
}

}  // namespace glm::engine
