// Host reference of the FP4-activation nvfp4 GEMV (gemv_quant_fp4.h).
#include "kernels/gemv_quant_fp4.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace glm::kernels {

absl::Status GemvQuantFp4Host(int64_t m, const float* x, int64_t ldx, const uint8_t* w,
                              int64_t ld_bytes, const uint8_t* scales, int64_t scale_ld,
                              float global_scale, int64_t n, int64_t k, float* y, int64_t ldy,
                              bool accumulate) {
  if (m < 0 || m > 16 || n <= 0 || k <= 0 || k % 32 != 0 || ldx < k || ldy < n ||
      ld_bytes < k / 2 || scale_ld < k / kFp4BlockElems ||
      (m > 0 && (x == nullptr || w == nullptr || scales == nullptr || y == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemvQuantFp4Host: m = ", m, " n = ", n, " k = ", k, " ldx = ", ldx, " ldy = ", ldy,
        " ld_bytes = ", ld_bytes, " scale_ld = ", scale_ld,
        "; need m in [0, 16], k a multiple of 32, ldx >= k, ldy >= n, ld_bytes >= k / 2, "
        "scale_ld >= k / 16 and non-null pointers"));
  }
  // xq [m, k] as values (exact: e2m1 * ue4m3 has at most 5 significant bits).
  std::vector<float> xq(static_cast<size_t>(m * k));
  for (int64_t tok = 0; tok < m; ++tok) {
    for (int64_t b = 0; b < k / kFp4BlockElems; ++b) {
      uint8_t codes[kFp4BlockElems / 2];
      const uint8_t sb =
          Fp4QuantizeBlock(x + tok * ldx + b * kFp4BlockElems, kFp4BlockElems, codes);
      const float s = Fp4Ue4m3Value(sb);
      for (int i = 0; i < kFp4BlockElems; ++i) {
        const uint8_t c = (codes[i / 2] >> (4 * (i & 1))) & 15;
        xq[tok * k + b * kFp4BlockElems + i] = Fp4E2m1Value(c) * s;
      }
    }
  }
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const uint8_t byte = w[r * ld_bytes + kk / 2];
      const uint8_t c = (kk & 1) ? byte >> 4 : byte & 15;
      const uint8_t sb = scales[r * scale_ld + kk / kFp4BlockElems];
      const float s = Fp4Ue4m3Value(sb & 0x7f);
      row[kk] = Fp4E2m1Value(c) * ((sb & 0x80) ? -s : s);
    }
    for (int64_t tok = 0; tok < m; ++tok) {
      double sum = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        sum += static_cast<double>(xq[tok * k + kk]) * static_cast<double>(row[kk]);
      }
      const float v = static_cast<float>(sum) * global_scale;
      float& out = y[tok * ldy + r];
      out = accumulate ? out + v : v;
    }
  }
  return absl::OkStatus();
}

}  // namespace glm::kernels
