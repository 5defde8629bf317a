// PerHeadNarrow on the GPU against a host reference in fp64 over the widened weights (bf16 ->
// fp32 exact, fp8 -> float(q) * block scale in fp32, as the kernel widens them), x as given:
// |y - ref| <= 4e-5 * L1 + 1e-30 with L1 = the sum of |terms| (fp32 accumulation of exact-ish
// products in another order).
// Sweep: both contractions x fp32 / bf16 / fp8 x tokens 1, 3, 8, 64, 70 x heads 1, 3, 64 x dims:
// GLM-5 (kv_lora_rank 512, nope 192, v 256: head_rows 448, not a multiple of the 128-row fp8
// scale block), and dims that are not multiples of 128 nor of the 16-byte chunk (bf16 203
// columns in rows of 208 whose padding is NaN and must never be multiplied; fp8 144 columns: a
// partial scale block); the reference covers every head up to 8 heads and heads 0, 1, h/2, h-1
// beyond. Outputs are strided with gaps (poisoned with NaN bytes: an unwritten output fails the
// finite check, a written gap fails the gap check) inside guard bytes.
// Exactness: a one-hot x gives the widened weight row / column bit for bit (the dequantization).
// Non-finite x: a NaN in one (token, head) poisons exactly that (token, head)'s outputs.
// Determinism: repeated launches and a CUDA-graph replay give the same bits.
// Errors: misaligned rows, missing fp8 scales, a block past head_rows, overlapping outputs.
#include "kernels/per_head_narrow.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"
#include "kernels/quant_fp8_group.h"

namespace glm::kernels {
namespace {

using testing::Bf16ToFloat;
using testing::FloatToBf16;
using testing::GuardedBuffer;

using Rng = testing::XorShiftRng;

int ElemBytes(PerHeadWeight w) {
  return w == PerHeadWeight::kF32 ? 4 : w == PerHeadWeight::kBF16 ? 2 : 1;
}
const char* Name(PerHeadWeight w) {
  return w == PerHeadWeight::kF32 ? "fp32" : w == PerHeadWeight::kBF16 ? "bf16" : "fp8";
}

// A [rows, cols] weight in its stored form (row stride ldw elements, padding NaN where the dtype
// has a NaN encoding) on host and device, plus its widened fp32 values.
struct Weight {
  PerHeadWeight type;
  int64_t rows = 0, cols = 0, ldw = 0, scale_ld = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<float> wide;  // [rows, cols]
  std::unique_ptr<GuardedBuffer> d_w, d_s;

  Weight(PerHeadWeight t, int64_t r, int64_t c, uint64_t seed) : type(t), rows(r), cols(c) {
    const int eb = ElemBytes(t);
    const int64_t vec = 16 / eb;
    ldw = (c + vec - 1) / vec * vec;
    bytes.assign(r * ldw * eb, 0xFF);  // NaN padding (fp32 / bf16 0xFFFF.., e4m3 0xFF)
    wide.resize(r * c);
    Rng rng(seed);
    const int64_t srows = (r + 127) / 128, scols = (c + 127) / 128;
    if (t == PerHeadWeight::kF8E4M3Block128) {
      scale_ld = (scols + 3) / 4 * 4;
      scales.assign(srows * scale_ld, 0.0f);
      for (int64_t i = 0; i < srows; ++i) {
        for (int64_t j = 0; j < scols; ++j) {
          scales[i * scale_ld + j] = std::ldexp(1.0f + 0.25f * (rng.Next() % 4), -7 + rng.Next() % 3);
        }
      }
    }
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < c; ++j) {
        const float v = rng.Uniform();
        uint8_t* p = bytes.data() + (i * ldw + j) * eb;
        if (t == PerHeadWeight::kF32) {
          std::memcpy(p, &v, 4);
          wide[i * c + j] = v;
        } else if (t == PerHeadWeight::kBF16) {
          const uint16_t b = FloatToBf16(v);
          std::memcpy(p, &b, 2);
          wide[i * c + j] = Bf16ToFloat(b);
        } else {
          const uint8_t q = FloatToE4m3Sat(v * 448.0f);
          *p = q;
          wide[i * c + j] = E4m3ToFloat(q) * scales[(i / 128) * scale_ld + j / 128];
        }
      }
    }
    d_w = std::make_unique<GuardedBuffer>(bytes.size());
    EXPECT_EQ(d_w->Upload(bytes.data(), bytes.size()), cudaSuccess);
    if (!scales.empty()) {
      d_s = std::make_unique<GuardedBuffer>(scales.size() * 4);
      EXPECT_EQ(d_s->Upload(scales.data(), scales.size() * 4), cudaSuccess);
    }
  }
};

struct Problem {
  PerHeadContract contract;
  int64_t tokens, heads, head_rows, row_begin, in_dim, out_dim;
};

// Runs the kernel for `p` on x (host [tokens, heads, x_head_stride] with x_row_stride =
// heads * x_head_stride); returns y as [tokens][y_row_stride] host floats, checks guards.
struct Run {
  std::vector<float> y;
  int64_t y_row_stride = 0, y_head_stride = 0;
};

// Args for `p` on x_dev / y_dev with the given head strides; the row strides are heads * head
// stride plus a gap (default: x 1, y 5 elements, so rows are not packed).
PerHeadNarrowArgs MakeArgs(const Weight& w, const Problem& p, const float* x_dev,
                           int64_t x_head_stride, float* y_dev, int64_t y_head_stride,
                           int64_t x_row_gap = 1, int64_t y_row_gap = 5) {
  PerHeadNarrowArgs a;
  a.contract = p.contract;
  a.weight = w.type;
  a.x = x_dev;
  a.x_head_stride = x_head_stride;
  a.x_row_stride = p.heads * x_head_stride + x_row_gap;
  a.w = w.d_w->data();
  a.ldw = w.ldw;
  a.w_scales = w.d_s ? w.d_s->as<float>() : nullptr;
  a.w_scale_ld = w.scale_ld;
  a.head_rows = p.head_rows;
  a.row_begin = p.row_begin;
  a.y = y_dev;
  a.y_head_stride = y_head_stride;
  a.y_row_stride = p.heads * y_head_stride + y_row_gap;
  a.num_tokens = p.tokens;
  a.num_heads = p.heads;
  a.in_dim = p.in_dim;
  a.out_dim = p.out_dim;
  return a;
}

class PerHeadNarrowTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }

  // Checks one problem against the fp64 reference. one_hot >= 0: x is e_{one_hot} for every
  // (token, head) and y must equal the widened weights bit for bit.
  void Check(const Weight& w, const Problem& p, int one_hot = -1) {
    const std::string what = absl::StrCat(Name(w.type), " ",
                                          p.contract == PerHeadContract::kRows ? "kRows" : "kCols",
                                          " tokens=", p.tokens, " heads=", p.heads, " in=",
                                          p.in_dim, " out=", p.out_dim, " head_rows=",
                                          p.head_rows, " row_begin=", p.row_begin);
    SCOPED_TRACE(what);
    const int64_t xhs = p.in_dim + 2, xrs = p.heads * xhs + 1;
    std::vector<float> x(p.tokens * xrs, std::numeric_limits<float>::quiet_NaN());
    Rng rng(p.tokens * 131 + p.heads * 7 + p.in_dim);
    for (int64_t t = 0; t < p.tokens; ++t) {
      for (int64_t h = 0; h < p.heads; ++h) {
        for (int64_t k = 0; k < p.in_dim; ++k) {
          x[t * xrs + h * xhs + k] = one_hot >= 0 ? (k == one_hot ? 1.0f : 0.0f) : rng.Uniform();
        }
      }
    }
    GuardedBuffer dx(x.size() * 4);
    ASSERT_EQ(dx.Upload(x.data(), x.size() * 4), cudaSuccess);
    const int64_t yhs = p.out_dim + 3, yrs = p.heads * yhs + 5;
    GuardedBuffer dy(p.tokens * yrs * 4);
    ASSERT_EQ(dy.Poison(0xFF), cudaSuccess);
    const PerHeadNarrowArgs a = MakeArgs(w, p, dx.as<float>(), xhs, dy.as<float>(), yhs);
    ASSERT_TRUE(PerHeadNarrow(a, nullptr).ok()) << PerHeadNarrow(a, nullptr);
    GLM_CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<float> y(p.tokens * yrs);
    ASSERT_EQ(dy.Download(y.data(), y.size() * 4), cudaSuccess);
    EXPECT_TRUE(dy.GuardsIntact());
    std::vector<int64_t> heads;
    for (int64_t h = 0; h < p.heads; ++h) {
      if (p.heads <= 8 || h <= 1 || h == p.heads / 2 || h == p.heads - 1) heads.push_back(h);
    }
    int64_t bad = 0, gaps = 0;
    for (int64_t t = 0; t < p.tokens; ++t) {
      for (int64_t h = 0; h < p.heads; ++h) {
        for (int64_t n = 0; n < yhs; ++n) {
          const float v = y[t * yrs + h * yhs + n];
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          if (n >= p.out_dim) {
            gaps += bits != 0xFFFFFFFFu;
          } else if (!std::isfinite(v)) {
            ++bad;
          }
        }
      }
    }
    EXPECT_EQ(bad, 0) << "non-finite or unwritten outputs";
    EXPECT_EQ(gaps, 0) << "writes into the gaps between heads";
    int64_t mismatches = 0;
    for (int64_t t = 0; t < p.tokens; ++t) {
      for (int64_t h : heads) {
        const int64_t base = h * p.head_rows + p.row_begin;
        for (int64_t n = 0; n < p.out_dim; ++n) {
          double ref = 0, l1 = 0;
          for (int64_t k = 0; k < p.in_dim; ++k) {
            const double wv = p.contract == PerHeadContract::kRows
                                  ? w.wide[(base + k) * w.cols + n]
                                  : w.wide[(base + n) * w.cols + k];
            const double term = static_cast<double>(x[t * xrs + h * xhs + k]) * wv;
            ref += term;
            l1 += std::fabs(term);
          }
          const float got = y[t * yrs + h * yhs + n];
          const bool ok = one_hot >= 0 ? static_cast<float>(ref) == got
                                       : std::fabs(got - ref) <= 4e-5 * l1 + 1e-30;
          if (!ok && ++mismatches <= 5) {
            ADD_FAILURE() << "y[" << t << "," << h << "," << n << "] = " << got << ", ref " << ref
                          << " (L1 " << l1 << ")";
          }
        }
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
};

const PerHeadWeight kWeights[] = {PerHeadWeight::kF32, PerHeadWeight::kBF16,
                                  PerHeadWeight::kF8E4M3Block128};

TEST_F(PerHeadNarrowTest, Glm5WidthsMatchReference) {
  // kv_b_proj: [64 * (192 + 256), 512]; W_UK = rows 0..191 of each head, W_UV = rows 192..447.
  constexpr int64_t kNope = 192, kV = 256, kRank = 512, kHeads = 64, kHeadRows = kNope + kV;
  for (PerHeadWeight t : kWeights) {
    const Weight w(t, kHeads * kHeadRows, kRank, 11);
    for (int64_t tokens : {1, 3, 8, 64}) {
      Check(w, {PerHeadContract::kRows, tokens, kHeads, kHeadRows, 0, kNope, kRank});
      Check(w, {PerHeadContract::kCols, tokens, kHeads, kHeadRows, kNope, kRank, kV});
    }
  }
}

TEST_F(PerHeadNarrowTest, OddShapesMatchReference) {
  // bf16 / fp32: 203 columns (rows padded to whole 16-byte chunks with NaN); fp8: 144 columns
  // (a partial 128-column scale block; fp8 weights need cols % 16 == 0). nope 37, v 45: head
  // blocks straddle 128-row scale blocks.
  for (PerHeadWeight t : kWeights) {
    const int64_t cols = t == PerHeadWeight::kF8E4M3Block128 ? 144 : 203;
    constexpr int64_t kNope = 37, kV = 45, kHeadRows = kNope + kV;
    for (int64_t heads : {1, 3, 64}) {
      const Weight w(t, heads * kHeadRows, cols, 17 + heads);
      for (int64_t tokens : {1, 3, 8, 64, 70}) {
        Check(w, {PerHeadContract::kRows, tokens, heads, kHeadRows, 0, kNope, cols});
        Check(w, {PerHeadContract::kCols, tokens, heads, kHeadRows, kNope, cols, kV});
      }
      // Fewer columns than stored (kRows: out_dim < cols), a block in the middle of the head.
      Check(w, {PerHeadContract::kRows, 5, heads, kHeadRows, 3, 20, cols - 9});
    }
  }
}

TEST_F(PerHeadNarrowTest, OneHotGivesWidenedWeightsExactly) {
  for (PerHeadWeight t : kWeights) {
    const int64_t cols = t == PerHeadWeight::kF8E4M3Block128 ? 272 : 203;
    constexpr int64_t kNope = 130, kV = 70, kHeadRows = kNope + kV, kHeads = 3;
    const Weight w(t, kHeads * kHeadRows, cols, 5);
    for (int hot : {0, 129}) {
      Check(w, {PerHeadContract::kRows, 2, kHeads, kHeadRows, 0, kNope, cols}, hot);
    }
    for (int hot : {0, 130, static_cast<int>(cols) - 1}) {
      Check(w, {PerHeadContract::kCols, 2, kHeads, kHeadRows, kNope, cols, kV}, hot);
    }
  }
}

TEST_F(PerHeadNarrowTest, NanInXPoisonsOnlyItsTokenAndHead) {
  for (PerHeadContract c : {PerHeadContract::kRows, PerHeadContract::kCols}) {
    const Weight w(PerHeadWeight::kF8E4M3Block128, 3 * 64, 256, 3);
    const int64_t in = c == PerHeadContract::kRows ? 64 : 256;
    const int64_t out = c == PerHeadContract::kRows ? 256 : 64;
    const int64_t tokens = 4, heads = 3;
    std::vector<float> x(tokens * heads * in, 0.5f);
    x[(2 * heads + 1) * in + 7] = std::numeric_limits<float>::quiet_NaN();
    x[(0 * heads + 2) * in + 3] = std::numeric_limits<float>::infinity();
    GuardedBuffer dx(x.size() * 4), dy(tokens * heads * out * 4);
    ASSERT_EQ(dx.Upload(x.data(), x.size() * 4), cudaSuccess);
    const PerHeadNarrowArgs a = MakeArgs(w, {c, tokens, heads, /*head_rows=*/64, /*row_begin=*/0,
                                             in, out},
                                         dx.as<float>(), in, dy.as<float>(), out, 0, 0);
    ASSERT_TRUE(PerHeadNarrow(a, nullptr).ok());
    std::vector<float> y(tokens * heads * out);
    ASSERT_EQ(dy.Download(y.data(), y.size() * 4), cudaSuccess);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        int64_t finite = 0;
        for (int64_t n = 0; n < out; ++n) finite += std::isfinite(y[(t * heads + h) * out + n]);
        const bool poisoned = (t == 2 && h == 1) || (t == 0 && h == 2);
        // An Inf times weights of both signs gives +-Inf or NaN: none finite (no zero weights
        // with 448-scaled uniform values except rare exact zeros, so allow a few).
        if (poisoned) {
          EXPECT_LE(finite, out / 16) << "t=" << t << " h=" << h;
        } else {
          EXPECT_EQ(finite, out) << "t=" << t << " h=" << h;
        }
      }
    }
  }
}

TEST_F(PerHeadNarrowTest, DeterministicAcrossLaunchesAndGraphReplay) {
  const Weight w(PerHeadWeight::kBF16, 64 * 448, 512, 9);
  for (PerHeadContract c : {PerHeadContract::kRows, PerHeadContract::kCols}) {
    for (int64_t tokens : {1, 8, 64}) {
      const int64_t in = c == PerHeadContract::kRows ? 192 : 512;
      const int64_t out = c == PerHeadContract::kRows ? 512 : 256;
      std::vector<float> x(tokens * 64 * in);
      Rng rng(tokens);
      for (float& v : x) v = rng.Uniform();
      GuardedBuffer dx(x.size() * 4), dy(tokens * 64 * out * 4);
      ASSERT_EQ(dx.Upload(x.data(), x.size() * 4), cudaSuccess);
      const PerHeadNarrowArgs a =
          MakeArgs(w, {c, tokens, /*heads=*/64, /*head_rows=*/448,
                       /*row_begin=*/c == PerHeadContract::kRows ? 0 : 192, in, out},
                   dx.as<float>(), in, dy.as<float>(), out, 0, 0);
      std::vector<float> first(tokens * 64 * out), again(first.size());
      ASSERT_TRUE(PerHeadNarrow(a, nullptr).ok());
      ASSERT_EQ(dy.Download(first.data(), first.size() * 4), cudaSuccess);
      for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(dy.Poison(0), cudaSuccess);
        ASSERT_TRUE(PerHeadNarrow(a, nullptr).ok());
        ASSERT_EQ(dy.Download(again.data(), again.size() * 4), cudaSuccess);
        EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * 4), 0) << "launch " << i;
      }
      cudaStream_t stream;
      GLM_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      GLM_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      ASSERT_TRUE(PerHeadNarrow(a, stream).ok());
      GLM_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
      GLM_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
      ASSERT_EQ(dy.Poison(0), cudaSuccess);
      GLM_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
      GLM_CUDA_ASSERT(cudaStreamSynchronize(stream));
      ASSERT_EQ(dy.Download(again.data(), again.size() * 4), cudaSuccess);
      EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * 4), 0) << "graph replay";
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
    }
  }
}

// PerHeadWidenF32 (the many-token path's fp32 copy) equals the host widening bit for bit, in
// the per-head GEMM layout, for both contractions and every dtype (NaN row padding never read).
TEST_F(PerHeadNarrowTest, WidenF32MatchesHostWidening) {
  for (PerHeadWeight t : kWeights) {
    const int64_t cols = t == PerHeadWeight::kF8E4M3Block128 ? 144 : 203;
    constexpr int64_t kNope = 37, kV = 45, kHeadRows = kNope + kV, kHeads = 3;
    const Weight w(t, kHeads * kHeadRows, cols, 29);
    for (PerHeadContract c : {PerHeadContract::kRows, PerHeadContract::kCols}) {
      const bool rows = c == PerHeadContract::kRows;
      PerHeadNarrowArgs a;
      a.contract = c;
      a.weight = t;
      a.w = w.d_w->data();
      a.ldw = w.ldw;
      a.w_scales = w.d_s ? w.d_s->as<float>() : nullptr;
      a.w_scale_ld = w.scale_ld;
      a.head_rows = kHeadRows;
      a.row_begin = rows ? 0 : kNope;
      a.num_heads = kHeads;
      a.in_dim = rows ? kNope : cols;
      a.out_dim = rows ? cols : kV;
      const int64_t n = kHeads * a.out_dim * a.in_dim;
      GuardedBuffer dst(n * 4);
      ASSERT_TRUE(PerHeadWidenF32(a, dst.as<float>(), nullptr).ok());
      std::vector<float> got(n);
      ASSERT_EQ(dst.Download(got.data(), n * 4), cudaSuccess);
      EXPECT_TRUE(dst.GuardsIntact());
      for (int64_t h = 0; h < kHeads; ++h) {
        for (int64_t o = 0; o < a.out_dim; ++o) {
          for (int64_t k = 0; k < a.in_dim; ++k) {
            const int64_t base = h * kHeadRows + a.row_begin;
            const float want = rows ? w.wide[(base + k) * cols + o] : w.wide[(base + o) * cols + k];
            const float v = got[(h * a.out_dim + o) * a.in_dim + k];
            ASSERT_EQ(std::memcmp(&v, &want, 4), 0)
                << Name(t) << (rows ? " kRows" : " kCols") << " h=" << h << " o=" << o
                << " k=" << k << ": " << v << " vs " << want;
          }
        }
      }
    }
  }
}

TEST_F(PerHeadNarrowTest, RejectsBadInputsNamingTheRule) {
  const Weight w(PerHeadWeight::kF8E4M3Block128, 2 * 64, 128, 1);
  GuardedBuffer dx(4096), dy(4096);
  // x [1, 2 heads, 128], y [1, 2 heads, 32], rows packed.
  const PerHeadNarrowArgs a = MakeArgs(w, {PerHeadContract::kCols, /*tokens=*/1, /*heads=*/2,
                                           /*head_rows=*/64, /*row_begin=*/32, 128, 32},
                                       dx.as<float>(), 128, dy.as<float>(), 32, 0, 0);
  ASSERT_TRUE(PerHeadNarrow(a, nullptr).ok()) << PerHeadNarrow(a, nullptr);
  PerHeadNarrowArgs b = a;
  b.out_dim = 33;  // row_begin + 33 > head_rows
  EXPECT_NE(PerHeadNarrow(b, nullptr).ToString().find("head_rows"), std::string::npos);
  b = a;
  b.w_scales = nullptr;
  EXPECT_NE(PerHeadNarrow(b, nullptr).ToString().find("block scales"), std::string::npos);
  b = a;
  b.w = static_cast<const uint8_t*>(a.w) + 8;
  EXPECT_NE(PerHeadNarrow(b, nullptr).ToString().find("16-byte"), std::string::npos);
  b = a;
  b.y_head_stride = 16;
  EXPECT_NE(PerHeadNarrow(b, nullptr).ToString().find("overlapping"), std::string::npos);
  b = a;
  b.in_dim = PerHeadNarrowMaxInDim(b.contract) + 16;
  EXPECT_FALSE(PerHeadNarrow(b, nullptr).ok());
}

}  // namespace
}  // namespace glm::kernels
