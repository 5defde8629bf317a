// What a kernel launch may use on one device: the numbers launch planning needs, read from the
// device's attributes (QueryDeviceLimits, cuda_util.h) or written by hand for a chip we don't have
// (tests plan for GB10 and H200 on a machine with no GPU). Pure data; no CUDA types.
#pragma once

#include <cstdint>
#include <string>

namespace glm::kernels {

struct DeviceLimits {
  int num_sms = 0;                     // cudaDevAttrMultiProcessorCount
  int smem_optin_per_block = 0;        // cudaDevAttrMaxSharedMemoryPerBlockOptin (bytes)
  int smem_per_sm = 0;                 // cudaDevAttrMaxSharedMemoryPerMultiprocessor (bytes)
  int reserved_smem_per_block = 1024;  // cudaDevAttrReservedSharedMemoryPerBlock (sm_80+: 1 KiB)
  int max_threads_per_sm = 2048;       // cudaDevAttrMaxThreadsPerMultiProcessor
  // A kernel-specific cap on resident blocks per SM (registers, or what
  // cudaOccupancyMaxActiveBlocksPerMultiprocessor answered); 0 = no cap beyond the above.
  int max_blocks_per_sm_cap = 0;

  std::string DebugString() const;
};

// GB10 (sm_121, DGX Spark): 99 KiB opt-in shared memory per block, 48 SMs. H200 (sm_90): 227 KiB
// opt-in, 132 SMs. Used by tests and by the capped runs (KernelPolicy::smem_cap_bytes /
// max_sms); real launches query the device.
DeviceLimits Gb10Limits();
DeviceLimits H200Limits();

// Caps applied on top of what the device reports, so one GPU can exercise another chip's plan:
// smem_cap_bytes > 0 caps the opt-in per-block shared memory (and the per-SM shared memory to
// that plus the per-block reservation); max_sms > 0 caps the SM count. Caps only ever lower.
DeviceLimits CapDeviceLimits(DeviceLimits limits, int64_t smem_cap_bytes, int64_t max_sms);

}  // namespace glm::kernels
