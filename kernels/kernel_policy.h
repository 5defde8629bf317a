// KernelPolicy: the choices a caller may make about how the CUDA ops run, passed in as a value
// (ModelLoadOptions::kernel_policy -> CreateBackend -> the CUDA backend -> each op's launcher).
// Library code reads no environment variable and keeps no process-global switch: production
// runs the defaults below, which are the measured-fastest paths; tests and benches build the
// policy they want (a forced path to compare against the reference, a smaller shared-memory
// budget to exercise another chip's launch plan). Plain C++: the CPU-only build carries it too.
#pragma once

#include <cstdint>

namespace glm::kernels {

// Dense Linear / GEMV choices (kernels/gemv_narrow, per_head_gemv; engine/backend/cuda).
struct LinearPolicy {};

// Routed-expert (MoE) choices (kernels/moe_*).
struct MoePolicy {};

// DSA lightning-indexer choices (kernels/dsa_indexer_*).
struct IndexerPolicy {};

// MLA attention and fp8 KV choices (kernels/mla_*, kernels/kv_fp8).
struct AttentionPolicy {};

struct KernelPolicy {
  // Plan launches as a device with at most this much opt-in shared memory per block (bytes;
  // 0 = the device's own). Tests and benches set GB10's 99 KiB (Gb10Limits in device_limits.h)
  // on a larger GPU to run the plans a DGX Spark would run. Caps only ever lower.
  int64_t smem_cap_bytes = 0;
  // Plan as a device with at most this many SMs (0 = the device's own).
  int max_sms = 0;

  LinearPolicy linear;
  MoePolicy moe;
  IndexerPolicy indexer;
  AttentionPolicy attention;
};

}  // namespace glm::kernels
