#include "kernels/device_limits.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace glm::kernels {

std::string DeviceLimits::DebugString() const {
  return absl::StrCat("num_sms=", num_sms, " smem_optin_per_block=", smem_optin_per_block,
                      " smem_per_sm=", smem_per_sm, " reserved_smem_per_block=",
                      reserved_smem_per_block, " max_threads_per_sm=", max_threads_per_sm,
                      " max_blocks_per_sm_cap=", max_blocks_per_sm_cap);
}

DeviceLimits Gb10Limits() {
  DeviceLimits l;
  l.num_sms = 48;
  l.smem_optin_per_block = 101376;  // 99 KiB
  l.smem_per_sm = 102400;           // 100 KiB
  l.max_threads_per_sm = 1536;      // sm_120/sm_121
  return l;
}

DeviceLimits H200Limits() {
  DeviceLimits l;
  l.num_sms = 132;
  l.smem_optin_per_block = 232448;  // 227 KiB
  l.smem_per_sm = 233472;           // 228 KiB
  l.max_threads_per_sm = 2048;
  return l;
}

DeviceLimits CapDeviceLimits(DeviceLimits limits, int64_t smem_cap_bytes, int64_t max_sms) {
  if (smem_cap_bytes > 0) {
    limits.smem_optin_per_block =
        static_cast<int>(std::min<int64_t>(limits.smem_optin_per_block, smem_cap_bytes));
    limits.smem_per_sm = static_cast<int>(std::min<int64_t>(
        limits.smem_per_sm, smem_cap_bytes + limits.reserved_smem_per_block));
  }
  if (max_sms > 0) limits.num_sms = static_cast<int>(std::min<int64_t>(limits.num_sms, max_sms));
  return limits;
}

}  // namespace glm::kernels
