#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/cuda_util.h"
#include "kernels/launch.cuh"
#include "kernels/per_head_narrow.cuh"
#include "kernels/per_head_narrow.h"

namespace glm::kernels {
namespace {

using detail::PerHeadNarrowParams;
using KernelFn = void (*)(PerHeadNarrowParams);

int ElementBytes(PerHeadWeight w) {
  return w == PerHeadWeight::kF32 ? 4 : w == PerHeadWeight::kBF16 ? 2 : 1;
}
int VecOf(PerHeadWeight w) { return 16 / ElementBytes(w); }

// Token tile: the smallest of 1, 2, 4, 8 covering num_tokens, capped by the registers of the
// kRows fp8 accumulators (kMT x 16 floats: 4) and by the x tile's shared memory.
int TokenTile(PerHeadContract contract, PerHeadWeight weight, int64_t num_tokens,
              int64_t in_pad) {
  const int max_mt = contract == PerHeadContract::kRows && weight == PerHeadWeight::kF8E4M3Block128
                         ? 4
                         : 8;
  int mt = 1;
  while (mt < max_mt && mt < num_tokens) mt *= 2;
  while (mt > 1 && mt * in_pad * 4 > detail::kPhnMaxXSmemBytes) mt /= 2;
  return mt;
}

template <PerHeadWeight W>
KernelFn Pick(PerHeadContract contract, int mt) {
  if (contract == PerHeadContract::kCols) {
    switch (mt) {
      case 1: return detail::PerHeadColsKernel<W, 1>;
      case 2: return detail::PerHeadColsKernel<W, 2>;
      case 4: return detail::PerHeadColsKernel<W, 4>;
      default: return detail::PerHeadColsKernel<W, 8>;
    }
  }
  switch (mt) {
    case 1: return detail::PerHeadRowsKernel<W, 1>;
    case 2: return detail::PerHeadRowsKernel<W, 2>;
    case 4: return detail::PerHeadRowsKernel<W, 4>;
    default:
      if constexpr (W == PerHeadWeight::kF8E4M3Block128) {
        return detail::PerHeadRowsKernel<W, 4>;
      } else {
        return detail::PerHeadRowsKernel<W, 8>;
      }
  }
}

KernelFn PickKernel(PerHeadContract contract, PerHeadWeight weight, int mt) {
  switch (weight) {
    case PerHeadWeight::kF32: return Pick<PerHeadWeight::kF32>(contract, mt);
    case PerHeadWeight::kBF16: return Pick<PerHeadWeight::kBF16>(contract, mt);
    default: return Pick<PerHeadWeight::kF8E4M3Block128>(contract, mt);
  }
}

// SM count of the current device, cached per device.
absl::StatusOr<int> SmCount() {
  static std::mutex mu;
  static std::map<int, int>* cache = new std::map<int, int>();
  int device = 0;
  GLM_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "PerHeadNarrow: cudaGetDevice"));
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache->find(device); it != cache->end()) return it->second;
  int sms = 0;
  GLM_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "PerHeadNarrow: SMs"));
  (*cache)[device] = std::max(1, sms);
  return (*cache)[device];
}

const char* ContractName(PerHeadContract c) { return c == PerHeadContract::kRows ? "kRows" : "kCols"; }
const char* WeightName(PerHeadWeight w) {
  return w == PerHeadWeight::kF32 ? "fp32" : w == PerHeadWeight::kBF16 ? "bf16" : "fp8";
}

}  // namespace

int64_t PerHeadNarrowMaxInDim(PerHeadContract contract) {
  (void)contract;
  return detail::kPhnMaxXSmemBytes / 4;
}

std::string PerHeadNarrowDebugString(const PerHeadNarrowArgs& a) {
  return absl::StrCat(ContractName(a.contract), " ", WeightName(a.weight), " m=", a.num_tokens,
                      " heads=", a.num_heads, " in=", a.in_dim, " out=", a.out_dim,
                      " head_rows=", a.head_rows, " row_begin=", a.row_begin, " ldw=", a.ldw);
}

namespace {

// The checks both entry points share. with_xy: also x / y (PerHeadNarrow).
absl::Status CheckArgs(const PerHeadNarrowArgs& a, bool with_xy) {
  constexpr std::string_view kOp = "PerHeadNarrow";
  const bool rows = a.contract == PerHeadContract::kRows;
  const int eb = ElementBytes(a.weight), vec = VecOf(a.weight);
  // Weight rows and columns the product touches.
  const int64_t w_rows = rows ? a.in_dim : a.out_dim;
  const int64_t w_cols = rows ? a.out_dim : a.in_dim;
  const int64_t cols_read = (w_cols + vec - 1) / vec * vec;  // whole 16-byte chunks
  if (a.num_tokens < 0 || a.num_heads < 0 || a.num_heads > 65535 || a.in_dim < 0 ||
      a.out_dim < 0 || a.in_dim > PerHeadNarrowMaxInDim(a.contract) || a.head_rows < 0 ||
      a.row_begin < 0 || (a.num_heads > 0 && a.row_begin + w_rows > a.head_rows) ||
      a.x_row_stride < 0 || a.x_head_stride < 0 || a.y_row_stride < 0 || a.y_head_stride < 0 ||
      a.num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PerHeadNarrow: bad shape ", PerHeadNarrowDebugString(a), " (need non-negative sizes "
        "and strides, heads <= 65535, in_dim <= ", PerHeadNarrowMaxInDim(a.contract),
        ", row_begin + the product's rows <= head_rows)"));
  }
  if (with_xy && ((a.num_heads > 1 && a.y_head_stride < a.out_dim) ||
      (a.num_tokens > 1 &&
       a.y_row_stride < (a.num_heads - 1) * a.y_head_stride + a.out_dim))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PerHeadNarrow: overlapping outputs: y_row_stride=", a.y_row_stride,
        " y_head_stride=", a.y_head_stride, " out_dim=", a.out_dim, " heads=", a.num_heads,
        " (need y_head_stride >= out_dim when heads > 1, y_row_stride >= the last head's end)"));
  }
  if (a.ldw < cols_read || (a.ldw * eb) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.w) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PerHeadNarrow: weight rows must be 16-byte aligned and hold whole 16-byte chunks: ",
        PerHeadNarrowDebugString(a), " (need w 16-byte aligned, ldw * ", eb,
        " bytes a multiple of 16, ldw >= ", cols_read,
        "; WeightLoader::Linear stores bf16 / fp8 weights so)"));
  }
  if (a.weight == PerHeadWeight::kF8E4M3Block128 &&
      (a.w_scales == nullptr || a.w_scale_ld < (w_cols + 127) / 128)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PerHeadNarrow: fp8 weight needs block scales with w_scale_ld >= ceil(cols / 128) = ",
        (w_cols + 127) / 128, ", got ", a.w_scale_ld, " (", PerHeadNarrowDebugString(a), ")"));
  }
  if (with_xy) GLM_RETURN_IF_ERROR(CheckDevicePointer(a.y, kOp, "y"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.w, kOp, "w"));
  if (with_xy && a.in_dim > 0) GLM_RETURN_IF_ERROR(CheckDevicePointer(a.x, kOp, "x"));
  if (a.weight == PerHeadWeight::kF8E4M3Block128) {
    GLM_RETURN_IF_ERROR(CheckDevicePointer(a.w_scales, kOp, "w_scales"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PerHeadNarrow(const PerHeadNarrowArgs& a, cudaStream_t stream) {
  if (a.num_tokens < 0 || a.num_heads < 0 || a.out_dim < 0) return CheckArgs(a, true);
  if (a.num_tokens == 0 || a.num_heads == 0 || a.out_dim == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckArgs(a, true));
  const bool rows = a.contract == PerHeadContract::kRows;
  const int eb = ElementBytes(a.weight), vec = VecOf(a.weight);
  GLM_ASSIGN_OR_RETURN(const int sms, SmCount());

  PerHeadNarrowParams p;
  p.x = a.x;
  p.x_row_stride = a.x_row_stride;
  p.x_head_stride = a.x_head_stride;
  p.w = static_cast<const uint8_t*>(a.w);
  p.ldw_bytes = a.ldw * eb;
  p.ws = a.w_scales;
  p.ws_ld = a.w_scale_ld;
  p.head_rows = a.head_rows;
  p.row_begin = a.row_begin;
  p.y = a.y;
  p.y_row_stride = a.y_row_stride;
  p.y_head_stride = a.y_head_stride;
  p.num_tokens = static_cast<int>(a.num_tokens);
  p.in_dim = a.in_dim;
  p.out_dim = a.out_dim;
  p.in_pad = (a.in_dim + 15) / 16 * 16;
  p.ksplit = 1;
  p.beside = a.beside_previous ? 1 : 0;
  const int mt = TokenTile(a.contract, a.weight, a.num_tokens, p.in_pad);
  size_t smem = static_cast<size_t>(mt) * p.in_pad * 4;
  int64_t tiles = 0;
  if (rows) {
    // Row slices: the fewest that give two CTAs per SM (each slice at least one row per lane).
    auto tiles_for = [&](int ks) {
      const int64_t cta_cols = int64_t{detail::kPhnWarps / ks} * detail::kRowsColThreads * vec;
      return (a.out_dim + cta_cols - 1) / cta_cols;
    };
    while (p.ksplit < detail::kPhnWarps && a.num_heads * tiles_for(p.ksplit) < 2 * int64_t{sms} &&
           int64_t{p.ksplit} * 2 * detail::kRowsLanes <= a.in_dim) {
      p.ksplit *= 2;
    }
    tiles = tiles_for(p.ksplit);
    const int mt_red = mt;  // red holds ksplit x mt x cta_cols = mt x 8 warps x 8 x vec floats
    smem += static_cast<size_t>(mt_red) * detail::kPhnWarps * detail::kRowsColThreads * vec * 4;
  } else {
    const int64_t rows_per_cta = int64_t{detail::kPhnWarps} * detail::kColsRows;
    tiles = (a.out_dim + rows_per_cta - 1) / rows_per_cta;
  }
  if (tiles > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("PerHeadNarrow: out_dim too large: ", PerHeadNarrowDebugString(a)));
  }
  const KernelFn fn = PickKernel(a.contract, a.weight, mt);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_heads));
  LaunchKernel(fn, grid, detail::kPhnThreads, smem, stream, p);
  return CudaStatus(cudaGetLastError(), "PerHeadNarrow launch");
}

absl::Status PerHeadWidenF32(const PerHeadNarrowArgs& a, float* dst, cudaStream_t stream) {
  if (a.num_heads < 0 || a.out_dim < 0 || a.in_dim < 0) return CheckArgs(a, false);
  if (a.num_heads == 0 || a.out_dim == 0 || a.in_dim == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckArgs(a, false));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(dst, "PerHeadWidenF32", "dst"));
  GLM_ASSIGN_OR_RETURN(const int sms, SmCount());
  PerHeadNarrowParams p{};
  p.w = static_cast<const uint8_t*>(a.w);
  p.ldw_bytes = a.ldw * ElementBytes(a.weight);
  p.ws = a.w_scales;
  p.ws_ld = a.w_scale_ld;
  p.head_rows = a.head_rows;
  p.row_begin = a.row_begin;
  p.in_dim = a.in_dim;
  p.out_dim = a.out_dim;
  const bool rows = a.contract == PerHeadContract::kRows;
  const int64_t total = a.num_heads * a.out_dim * a.in_dim;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, int64_t{sms} * 16);
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, blocks));
  switch (a.weight) {
    case PerHeadWeight::kF32:
      LaunchKernel(detail::PerHeadWidenKernel<PerHeadWeight::kF32>, grid, 256, 0, stream, p, rows,
                   a.num_heads, dst);
      break;
    case PerHeadWeight::kBF16:
      LaunchKernel(detail::PerHeadWidenKernel<PerHeadWeight::kBF16>, grid, 256, 0, stream, p, rows,
                   a.num_heads, dst);
      break;
    default:
      LaunchKernel(detail::PerHeadWidenKernel<PerHeadWeight::kF8E4M3Block128>, grid, 256, 0, stream,
                   p, rows, a.num_heads, dst);
  }
  return CudaStatus(cudaGetLastError(), "PerHeadWidenF32 launch");
}

}  // namespace glm::kernels
