// fp8 KV cache ops (layouts and the quantization rule in kv_fp8_layout.h): the quantizing writes
// of new MLA latent rows and DSA indexer keys into their paged caches, and the prefill gather that
// dequantizes latent rows back to fp32. Bytes bit-identical to the host rule of kv_fp8_layout.h
// (the engine's CPU backend). One launch each, enqueued on `stream`; nothing allocates, so every
// call is graph-capturable. Slot ids are trusted (checked by the caller at setup).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace glm::kernels {

// An MLA latent cache: [num_slots] rows of kv_fp8::LatentRowBytes(kv_lora_rank, rope_dim) bytes,
// 16-byte aligned; kv_lora_rank % 4 == 0, rope_dim even (kv_fp8::LatentShapeOk).
struct LatentFp8Cache {
  uint8_t* data = nullptr;
  int64_t num_slots = 0;
  int32_t kv_lora_rank = 0;
  int32_t rope_dim = 0;
};

// A DSA indexer key cache: num_slots / block_size blocks of block_size * (dim + 4) bytes;
// dim % 4 == 0 (kv_fp8::IndexShapeOk).
struct IndexFp8Cache {
  uint8_t* data = nullptr;
  int64_t num_slots = 0;
  int32_t dim = 0;
  int32_t block_size = 0;
};

// cache row slots[r] = quantized src row r for r < rows. src: [rows, cols] fp32, row stride
// src_ld, cols == kv_lora_rank + rope_dim (c_kv | roped k_pe). slots: [rows] int32.
absl::Status WriteLatentFp8(const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                            const int32_t* slots, const LatentFp8Cache& dst, cudaStream_t stream);

// Key slot slots[r] = quantized src row r (one scale per key). src: [rows, cols], cols == dim.
absl::Status WriteIndexKeysFp8(const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                               const int32_t* slots, const IndexFp8Cache& dst,
                               cudaStream_t stream);

// out row r = dequantized latent row slots[r] (c_kv | k_pe) for r < rows. out: [rows, cols]
// fp32, row stride out_ld, cols == kv_lora_rank + rope_dim.
absl::Status GatherLatentFp8(const LatentFp8Cache& src, const int32_t* slots, float* out,
                             int64_t out_ld, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace glm::kernels
