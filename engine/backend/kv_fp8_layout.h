// The fp8 KV cache layouts as the engine names them (glm::engine::kv_fp8): the byte offsets and
// the quantization rule live in kernels/kv_fp8_layout.h (host and device code), which documents
// the 656-byte latent rows and 132-byte indexer-key rows at GLM-5 widths.
#pragma once

#include <cstdint>

#include "kernels/kv_fp8_layout.h"

namespace glm::engine {

// How the paged KV cache stores its rows (KvCacheGeometry::dtype).
enum class KvDType : uint8_t {
  kF32,  // fp32 latent [kv_lora_rank + rope] and fp32 indexer keys [index_head_dim] (reference)
  kFp8,  // the layouts of kernels/kv_fp8_layout.h
};

namespace kv_fp8 = ::glm::kernels::kv_fp8;

}  // namespace glm::engine
