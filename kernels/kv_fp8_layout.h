// The fp8 KV cache layouts (../shared/specs/glm5-architecture.md §5): the one place the kernels
// (kv_fp8, mla_attention, the DSA indexer) and both engine backends take byte offsets and the
// quantization rule from. Host and device (nvcc) code; plain C++ for the CPU-only build.
// engine/backend/kv_fp8_layout.h re-exports it as glm::engine::kv_fp8.
//
// MLA latent row, per layer per token slot (FlashMLA "fp8_ds_mla"); slot s at byte s * RowBytes:
//   [kv_lora_rank e4m3 c_kv][ceil(kv_lora_rank / 128) fp32 scales][qk_rope_head_dim bf16 k_pe]
//   GLM-5 (512, 64): 512 + 4 * 4 + 64 * 2 = 656 bytes. Scale g covers c_kv dims
//   [128 g, min(128 g + 128, kv_lora_rank)); k_pe (already roped) is bf16, round to nearest even.
// Indexer key cache, per layer (vLLM's paged layout): per KV block of block_size slots,
//   [block_size x index_head_dim e4m3 values][block_size x fp32 scales]; one scale per token.
//   GLM-5 (128): 132 bytes per token. Slot s = block b * block_size + offset o:
//   value bytes at b * block_size * (dim + 4) + o * dim, scale at
//   b * block_size * (dim + 4) + block_size * dim + 4 * o.
//
// Quantization rule (both caches, per scale group: 128 c_kv dims, or one indexer key row):
//   amax = max |x| over the group's finite values (NaN and +-inf are ignored);
//   scale = 2^e, the smallest power of two with amax <= 448 * scale (= 2^ceil(log2(amax / 448)),
//   "ue8m0"), e clamped to [-126, 127] so the scale is a normal float; amax == 0 gives scale 1;
//   q = e4m3(x / scale): round to nearest even, |x / scale| > 448 (only +-inf here) saturates
//   to +-448, NaN stays NaN (0x7F) — the codec of engine/weights/float_codec.h, bit for bit.
//   Dequantized value = float(q) * scale (exact in fp32). k_pe is bf16 (RNE); a NaN in k_pe stays
//   NaN but its payload bits may differ between backends.
// The division by a power of two is exact, so host and device give identical bytes.
// Alignment: every field starts on a 4-byte boundary when kv_lora_rank, index_head_dim and
// qk_rope_head_dim are even multiples the validators below ask for (kernels use 4-byte loads).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define GLM_KV_HD __host__ __device__ __forceinline__
#else
#define GLM_KV_HD inline
#endif

namespace glm::kernels {

namespace kv_fp8 {

inline constexpr int kScaleGroup = 128;   // c_kv dims per scale
inline constexpr float kE4m3Max = 448.0f;

// ---- MLA latent -----------------------------------------------------------------------------
GLM_KV_HD constexpr int64_t LatentNumScales(int64_t kv_lora_rank) {
  return (kv_lora_rank + kScaleGroup - 1) / kScaleGroup;
}
GLM_KV_HD constexpr int64_t LatentScaleOffset(int64_t kv_lora_rank) { return kv_lora_rank; }
GLM_KV_HD constexpr int64_t LatentRopeOffset(int64_t kv_lora_rank) {
  return kv_lora_rank + 4 * LatentNumScales(kv_lora_rank);
}
GLM_KV_HD constexpr int64_t LatentRowBytes(int64_t kv_lora_rank, int64_t rope_dim) {
  return LatentRopeOffset(kv_lora_rank) + 2 * rope_dim;
}

// ---- Indexer keys ---------------------------------------------------------------------------
GLM_KV_HD constexpr int64_t IndexBytesPerToken(int64_t dim) { return dim + 4; }
GLM_KV_HD constexpr int64_t IndexValueOffset(int64_t slot, int64_t block_size, int64_t dim) {
  return (slot / block_size) * block_size * (dim + 4) + (slot % block_size) * dim;
}
GLM_KV_HD constexpr int64_t IndexScaleOffset(int64_t slot, int64_t block_size, int64_t dim) {
  return (slot / block_size) * block_size * (dim + 4) + block_size * dim + 4 * (slot % block_size);
}

// Shapes the kernels accept (4-byte aligned fields): kv_lora_rank % 4 == 0, rope_dim % 2 == 0,
// index_head_dim % 4 == 0.
inline constexpr bool LatentShapeOk(int64_t kv_lora_rank, int64_t rope_dim) {
  return kv_lora_rank > 0 && kv_lora_rank % 4 == 0 && rope_dim >= 0 && rope_dim % 2 == 0;
}
inline constexpr bool IndexShapeOk(int64_t dim) { return dim > 0 && dim % 4 == 0; }

// The power-of-two scale for a group whose finite |x| maximum is `amax` (see the rule above).
GLM_KV_HD float Ue8m0Scale(float amax) {
  if (!(amax > 0.0f) || amax == INFINITY) return 1.0f;
  int ex = 0;
  const float m = frexpf(amax, &ex);  // amax = m * 2^ex, m in [0.5, 1); 448 = 0.875 * 2^9
  int e = m <= 0.875f ? ex - 9 : ex - 8;
  e = e < -126 ? -126 : (e > 127 ? 127 : e);
  return ldexpf(1.0f, e);
}

// |x| folded into a running amax over finite values (NaN and +-inf ignored).
GLM_KV_HD float AmaxFold(float amax, float x) {
  const float a = fabsf(x);
  return a <= 3.402823466e38f && a > amax ? a : amax;  // false for NaN and inf
}

}  // namespace kv_fp8
}  // namespace glm::kernels
