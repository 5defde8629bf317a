// The fp8 KV cache on the CPU backend: the reference for the layouts and the quantization rule
// of engine/backend/kv_fp8_layout.h (Backend::WriteLatentFp8 / WriteIndexKeysFp8 /
// GatherLatentFp8, and Attention / IndexerTopK over fp8 caches).
//
// Attention and IndexerTopK over fp8 caches dequantize the rows they read (exact: e4m3 value
// times a power-of-two scale, bf16 k_pe widened) into host scratch laid out per query row and
// run the backend's fp32 op on it, so the fp8 path differs from the fp32 path only by the
// quantization of the cache.
#pragma once

#include <cstdint>

#include "engine/backend/backend.h"

namespace glm::engine::cpu_kv_fp8 {

// One latent row: x [kv_lora_rank + rope_dim] fp32 -> out [LatentRowBytes] bytes.
void QuantizeLatentRow(const float* x, int kv_lora_rank, int rope_dim, uint8_t* out);
// out [kv_lora_rank + rope_dim] fp32 from one row of LatentRowBytes bytes.
void DequantizeLatentRow(const uint8_t* row, int kv_lora_rank, int rope_dim, float* out);
// One indexer key x [dim] -> values [dim] e4m3 bytes and its scale.
void QuantizeIndexKey(const float* x, int dim, uint8_t* values, float* scale);
// Key of `slot` from an fp8 indexer cache, dequantized: out [dim].
void DequantizeIndexKey(const Fp8IndexCache& cache, int64_t slot, float* out);

// The Backend ops (host memory).
void WriteLatent(const MatView& src, const int32_t* slots, const Fp8LatentCache& dst);
void WriteIndexKeys(const MatView& src, const int32_t* slots, const Fp8IndexCache& dst);
void GatherLatent(const Fp8LatentCache& src, const int32_t* slots, const MatView& out);
// Run `backend`'s fp32 Attention / IndexerTopK on dequantized copies of the rows args read.
void Attention(Backend& backend, const AttentionArgs& args);
void IndexerTopK(Backend& backend, const IndexerTopKArgs& args);

}  // namespace glm::engine::cpu_kv_fp8
