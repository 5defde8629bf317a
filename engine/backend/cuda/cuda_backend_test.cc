// The CUDA backend against the CPU backend (the reference), op by op, on random data over shape
// sweeps (1 row, non-multiples of the kernel and GEMM tiles, large), with padded row strides,
// sub-views (column offsets: unaligned pointers for cuBLASLt), in-place forms, guard values
// around every device buffer (nothing written outside the views; padding columns untouched) and
// NaN/Inf checks. Also: Allocate zero-fills, copies round-trip, and the sticky first error.
// Skips (printing why) without a usable GPU.
#include "engine/backend/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/cpu_backend.h"

namespace glm::engine {
namespace {

constexpr int64_t kGuard = 64;  // floats of guard on each side of every device buffer
constexpr float kGuardValue = 12345.0f;

// One fp32 buffer of `n` floats with host and device copies, guards on both ends. h()/d() point
// at the payload (same layout on both sides).
class Dual {
 public:
  Dual(Backend& gpu, std::vector<float> payload) : gpu_(&gpu), n_(payload.size()) {
    host_.assign(n_ + 2 * kGuard, kGuardValue);
    std::copy(payload.begin(), payload.end(), host_.begin() + kGuard);
    dev_ = gpu.Allocate(host_.size() * sizeof(float));
    gpu.CopyToDevice(dev_->data(), host_.data(), host_.size() * sizeof(float));
  }
  float* h() { return host_.data() + kGuard; }
  float* d() { return dev_->f32() + kGuard; }
  MatView HMat(int64_t rows, int64_t cols, int64_t ld, int64_t off = 0) {
    return {h() + off, rows, cols, ld};
  }
  MatView DMat(int64_t rows, int64_t cols, int64_t ld, int64_t off = 0) {
    return {d() + off, rows, cols, ld};
  }
  // Device contents (guards included) against the host reference: guards exact, everything
  // finite, max |diff| <= rel_tol * max(1, max |host|).
  void Expect(double rel_tol, const std::string& what) {
    std::vector<float> got(host_.size());
    gpu_->CopyToHost(got.data(), dev_->data(), got.size() * sizeof(float));
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    double max_ref = 1.0, max_diff = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (i < kGuard || i >= kGuard + n_) {
        ASSERT_EQ(got[i], kGuardValue) << what << ": wrote outside the buffer at " << i;
        continue;
      }
      ASSERT_TRUE(std::isfinite(got[i])) << what << ": non-finite at " << i - kGuard;
      max_ref = std::max(max_ref, std::abs(static_cast<double>(host_[i])));
      max_diff = std::max(max_diff, std::abs(static_cast<double>(got[i]) - host_[i]));
    }
    EXPECT_LE(max_diff, rel_tol * max_ref) << what << " max_diff=" << max_diff
                                           << " max_ref=" << max_ref;
  }

 private:
  Backend* gpu_;
  size_t n_;
  std::vector<float> host_;
  std::unique_ptr<Buffer> dev_;
};

// int32 table on both sides (row ids, positions).
class DualInts {
 public:
  DualInts(Backend& gpu, std::vector<int32_t> v) : host_(std::move(v)) {
    dev_ = gpu.Allocate(std::max<size_t>(1, host_.size()) * sizeof(int32_t));
    gpu.CopyToDevice(dev_->data(), host_.data(), host_.size() * sizeof(int32_t));
  }
  int32_t* h() { return host_.data(); }
  int32_t* d() { return dev_->i32(); }

 private:
  std::vector<int32_t> host_;
  std::unique_ptr<Buffer> dev_;
};

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f, float offset = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = offset + d(rng);
  return v;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status avail = CudaDeviceAvailable();
    if (!avail.ok()) GTEST_SKIP() << avail.message();
    auto b = CreateCudaBackend(0);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    cpu_ = std::make_unique<CpuBackend>(4);
  }
  void TearDown() override {
    if (gpu_ != nullptr) {
      EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
    }
  }
  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<CpuBackend> cpu_;
  uint32_t seed_ = 1;
};

TEST_F(CudaBackendTest, AllocateZeroFillsAndCopiesRoundTrip) {
  for (size_t bytes : {size_t{4}, size_t{1000}, size_t{3} << 20}) {
    auto buf = gpu_->Allocate(bytes);
    ASSERT_NE(buf->data(), nullptr);
    ASSERT_EQ(buf->bytes(), bytes);
    std::vector<unsigned char> got(bytes, 0xEE);
    gpu_->CopyToHost(got.data(), buf->data(), bytes);
    ASSERT_TRUE(std::all_of(got.begin(), got.end(), [](unsigned char c) { return c == 0; }));
    std::vector<unsigned char> in(bytes);
    for (size_t i = 0; i < bytes; ++i) in[i] = static_cast<unsigned char>(i * 7 + 3);
    gpu_->CopyToDevice(buf->data(), in.data(), bytes);
    gpu_->CopyToHost(got.data(), buf->data(), bytes);
    ASSERT_EQ(got, in);
  }
  gpu_->Synchronize();
  EXPECT_EQ(gpu_->name(), "cuda");
}

TEST_F(CudaBackendTest, LinearMatchesCpu) {
  struct S { int64_t m, n, k, pad, col_off; bool acc; };
  std::vector<S> shapes;
  for (int64_t m : {1, 3, 17, 64, 129}) {
    for (int64_t n : {1, 5, 33, 257}) {
      for (int64_t k : {1, 7, 64, 130, 1000}) {
        shapes.push_back({m, n, k, (m + n + k) % 5, 0, (m + n) % 2 == 1});
      }
    }
  }
  // Large, and sub-views at odd column offsets (4-byte aligned pointers and strides).
  shapes.push_back({512, 2048, 1536, 0, 0, false});
  shapes.push_back({300, 1000, 6144 / 4, 3, 1, true});
  shapes.push_back({7, 129, 513, 1, 3, false});
  shapes.push_back({1, 4096, 512, 0, 1, false});
  // fp32 router logits (6144 -> 256) at decode sizes: the small-M GEMV at 1 row, cuBLASLt above.
  shapes.push_back({1, 256, 6144, 0, 0, false});
  shapes.push_back({1, 256, 6144, 0, 0, true});
  shapes.push_back({2, 256, 6144, 0, 0, false});
  shapes.push_back({16, 100, 512, 1, 1, true});
  for (const S& s : shapes) {
    const std::string what = absl::StrCat("Linear m=", s.m, " n=", s.n, " k=", s.k, " pad=",
                                          s.pad, " off=", s.col_off, " acc=", s.acc);
    const int64_t ldx = s.k + s.pad + s.col_off, ldw = s.k + 2 * s.pad + s.col_off,
                  ldy = s.n + s.pad + s.col_off;
    Dual x(*gpu_, Random(s.m * ldx, seed_++)), w(*gpu_, Random(s.n * ldw, seed_++));
    Dual y(*gpu_, Random(s.m * ldy, seed_++));
    cpu_->Linear(x.HMat(s.m, s.k, ldx, s.col_off), w.HMat(s.n, s.k, ldw, s.col_off),
                 y.HMat(s.m, s.n, ldy, s.col_off), s.acc);
    gpu_->Linear(x.DMat(s.m, s.k, ldx, s.col_off), w.DMat(s.n, s.k, ldw, s.col_off),
                 y.DMat(s.m, s.n, ldy, s.col_off), s.acc);
    y.Expect(2e-5, what);
    x.Expect(0, what + " (x untouched)");
  }
}

// The one-row fp32 Linear with a small weight (the router's shape) runs the small-M GEMV
// (kernels::PerHeadGemv); it matches the CPU, with and without accumulation. (Two rows of the
// same weight take cuBLASLt: LinearMatchesCpu.)
TEST_F(CudaBackendTest, OneRowF32LinearMatchesCpu) {
  for (const bool acc : {false, true}) {
    const std::string what = absl::StrCat("router 1 x 6144 -> 256 acc=", acc);
    Dual x(*gpu_, Random(6144, seed_++)), w(*gpu_, Random(256 * 6144, seed_++));
    Dual y(*gpu_, Random(256, seed_++));
    cpu_->Linear(x.HMat(1, 6144, 6144, 0), w.HMat(256, 6144, 6144, 0), y.HMat(1, 256, 256, 0),
                 acc);
    gpu_->Linear(x.DMat(1, 6144, 6144, 0), w.DMat(256, 6144, 6144, 0), y.DMat(1, 256, 256, 0),
                 acc);
    y.Expect(2e-5, what);
  }
}

TEST_F(CudaBackendTest, LinearPerHeadMatchesCpu) {
  struct S { int64_t rows, heads, in_dim, out_dim, x_extra, w_extra, y_extra; };
  const S shapes[] = {{1, 1, 8, 16, 0, 0, 0},      {5, 4, 64, 128, 3, 1, 2},
                      {33, 16, 129, 64, 0, 7, 0},  {3, 64, 192, 512, 64, 0, 0},
                      {17, 8, 512, 128, 5, 3, 1},  {256, 16, 128, 512, 0, 0, 0},
                      // Decode sizes (rows <= 16: kernels/per_head_gemv): GLM-5's absorbed
                      // W_UK^T (192 -> 512, q_nope in a 256 slot) and W_UV (512 -> 256), odd
                      // shapes (scalar loads, partial blocks, odd out_dim).
                      {1, 64, 192, 512, 64, 0, 0}, {2, 64, 512, 256, 0, 0, 0},
                      {8, 64, 192, 512, 64, 0, 0}, {16, 64, 512, 256, 0, 0, 0},
                      {16, 3, 7, 5, 1, 1, 1},      {2, 5, 513, 19, 2, 3, 1},
                      {8, 2, 132, 33, 0, 4, 3}};
  for (const S& s : shapes) {
    const std::string what = absl::StrCat("LinearPerHead rows=", s.rows, " heads=", s.heads,
                                          " in=", s.in_dim, " out=", s.out_dim);
    // x: [rows, heads, in_dim] inside a wider per-head slot (like q_nope inside q).
    const int64_t x_hs = s.in_dim + s.x_extra, x_rs = s.heads * x_hs + s.x_extra;
    const int64_t w_ld = s.in_dim + s.w_extra, w_hs = s.out_dim * w_ld + s.w_extra;
    const int64_t y_hs = s.out_dim + s.y_extra, y_rs = s.heads * y_hs + 2 * s.y_extra;
    Dual x(*gpu_, Random(s.rows * x_rs, seed_++)), w(*gpu_, Random(s.heads * w_hs, seed_++));
    Dual y(*gpu_, Random(s.rows * y_rs, seed_++));
    cpu_->LinearPerHead({x.h(), s.rows, s.heads, s.in_dim, x_rs, x_hs}, w.h(), w_hs, w_ld,
                        {y.h(), s.rows, s.heads, s.out_dim, y_rs, y_hs});
    gpu_->LinearPerHead({x.d(), s.rows, s.heads, s.in_dim, x_rs, x_hs}, w.d(), w_hs, w_ld,
                        {y.d(), s.rows, s.heads, s.out_dim, y_rs, y_hs});
    y.Expect(2e-5, what);
  }
}

// AbsorbPerHead (MLA W_UK / W_UV read from kv_b_proj as stored; kernels/per_head_narrow) against
// the cpu backend's AbsorbPerHead on the same weight widened to fp32 (which equals the fp32
// LinearPerHead on it; cpu_narrow_test): weight-only numerics, so the tolerance is an
// accumulation-order one. bf16 (rows padded with NaN), fp8 e4m3 with 128x128 block scales (head
// blocks straddling scale blocks, a partial column block) and fp32; GLM-5 widths (64 heads, nope
// 192, v 256, kv_lora_rank 512) at 1 / 8 / 64 tokens and odd shapes at 1 / 3 / 70; x is the
// model's strided view (q_nope inside q's 256-wide head slot).
TEST_F(CudaBackendTest, AbsorbPerHeadMatchesCpuOnWidenedWeights) {
  // e4m3fn code -> value (exact), from the format definition.
  auto e4m3 = [](uint8_t c) {
    const int e = (c >> 3) & 0xf, m = c & 7;
    const float a = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
    return (c & 0x80) != 0 ? -a : a;
  };
  struct S { int64_t heads, nope, v, rank; std::vector<int64_t> tokens; };
  for (WeightDType dtype : {WeightDType::kBF16, WeightDType::kF8E4M3Block128, WeightDType::kF32}) {
    const bool fp8 = dtype == WeightDType::kF8E4M3Block128;
    // Tokens > 8 take the widen + fp32 GEMM path (cuda_backend.cc kAbsorbKernelMaxTokens).
    const S shapes[] = {{64, 192, 256, 512, {1, 8, 64, 100}},
                        {3, 37, 45, fp8 ? 144 : 200, {1, 3, 8, 9, 64, 70, 300}}};
    for (const S& s : shapes) {
      const int64_t head_rows = s.nope + s.v, rows = s.heads * head_rows, cols = s.rank;
      std::mt19937 rng(seed_++);
      std::vector<float> wide(rows * cols);
      std::unique_ptr<Buffer> wbuf, sbuf;
      MatView wv;
      if (dtype == WeightDType::kF32) {
        wide = Random(rows * cols, seed_++, 0.05f);
        wbuf = gpu_->Allocate(wide.size() * 4);
        gpu_->CopyToDevice(wbuf->data(), wide.data(), wide.size() * 4);
        wv = {wbuf->f32(), rows, cols, cols};
      } else if (dtype == WeightDType::kBF16) {
        const int64_t ld = (cols + 7) / 8 * 8 + 8;  // padding NaN: never multiplied
        std::vector<uint16_t> h(rows * ld, 0x7fc0);
        const std::vector<float> v = Random(rows * cols, seed_++, 0.05f);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            uint32_t u;
            std::memcpy(&u, &v[r * cols + c], 4);
            h[r * ld + c] = static_cast<uint16_t>(u >> 16);
            u &= 0xffff0000u;
            std::memcpy(&wide[r * cols + c], &u, 4);
          }
        }
        wbuf = gpu_->Allocate(h.size() * 2);
        gpu_->CopyToDevice(wbuf->data(), h.data(), h.size() * 2);
        wv = {wbuf->f32(), rows, cols, ld};
      } else {
        const int64_t srows = (rows + 127) / 128, scols = (cols + 127) / 128;
        const int64_t sld = (scols + 3) / 4 * 4;
        std::vector<float> sc(srows * sld, 0.0f);
        std::uniform_real_distribution<float> sd(0.5f, 2.0f);
        for (float& x : sc) x = sd(rng) / 4096.0f;
        std::vector<uint8_t> q(rows * cols);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            uint8_t b = static_cast<uint8_t>(rng());
            if ((b & 0x7f) == 0x7f) b = 0x38;  // no NaN codes
            q[r * cols + c] = b;
            wide[r * cols + c] = e4m3(b) * sc[(r / 128) * sld + c / 128];
          }
        }
        wbuf = gpu_->Allocate(q.size());
        gpu_->CopyToDevice(wbuf->data(), q.data(), q.size());
        sbuf = gpu_->Allocate(sc.size() * 4);
        gpu_->CopyToDevice(sbuf->data(), sc.data(), sc.size() * 4);
        wv = {wbuf->f32(), rows, cols, cols};
        wv.scales = sbuf->f32();
        wv.scale_ld = sld;
      }
      wv.dtype = dtype;
      const MatView wide_view{wide.data(), rows, cols, cols};
      for (int64_t t : s.tokens) {
        for (Backend::PerHeadContract c :
             {Backend::PerHeadContract::kRows, Backend::PerHeadContract::kCols}) {
          const bool contract_rows = c == Backend::PerHeadContract::kRows;
          const std::string what = absl::StrCat(
              "AbsorbPerHead ", dtype == WeightDType::kF32 ? "fp32" : fp8 ? "fp8" : "bf16",
              contract_rows ? " kRows" : " kCols", " heads=", s.heads, " tokens=", t,
              " rank=", s.rank);
          const int64_t in = contract_rows ? s.nope : s.rank;
          const int64_t out = contract_rows ? s.rank : s.v;
          const int64_t xhs = contract_rows ? s.nope + 64 : s.rank, xrs = s.heads * xhs;
          const int64_t yhs = out + 1, yrs = s.heads * yhs + 3;
          const int64_t row_begin = contract_rows ? 0 : s.nope;
          Dual x(*gpu_, Random(t * xrs, seed_++));
          Dual y(*gpu_, Random(t * yrs, seed_++));  // gaps keep their values on both sides
          cpu_->AbsorbPerHead({x.h(), t, s.heads, in, xrs, xhs}, wide_view, head_rows, row_begin,
                              c, {y.h(), t, s.heads, out, yrs, yhs});
          gpu_->AbsorbPerHead({x.d(), t, s.heads, in, xrs, xhs}, wv, head_rows, row_begin, c,
                              {y.d(), t, s.heads, out, yrs, yhs});
          y.Expect(2e-5, what);
          x.Expect(0, what + " (x untouched)");
        }
        // The expanded form: all of the weight as one head (kCols from row 0).
        const std::string what = absl::StrCat("AbsorbPerHead whole weight ",
                                              fp8 ? "fp8" : "bf16/fp32", " rows=", rows,
                                              " tokens=", t);
        const int64_t ldx = cols + 64, ldy = rows + 2;
        Dual x(*gpu_, Random(t * ldx, seed_++));
        Dual y(*gpu_, Random(t * ldy, seed_++));
        cpu_->AbsorbPerHead({x.h(), t, 1, cols, ldx, 0}, wide_view, rows, 0,
                            Backend::PerHeadContract::kCols, {y.h(), t, 1, rows, ldy, 0});
        gpu_->AbsorbPerHead({x.d(), t, 1, cols, ldx, 0}, wv, rows, 0,
                            Backend::PerHeadContract::kCols, {y.d(), t, 1, rows, ldy, 0});
        y.Expect(2e-5, what);
      }
    }
  }
}

TEST_F(CudaBackendTest, NormsMatchCpu) {
  struct S { int64_t rows, cols, pad, col_off; bool in_place; };
  const S shapes[] = {{1, 1, 0, 0, false},   {1, 7, 1, 0, true},     {3, 256, 0, 0, false},
                      {5, 257, 3, 1, true},   {64, 1000, 24, 0, false}, {4, 6144, 0, 0, true},
                      {4096, 512, 64, 0, true}, {2, 100003, 0, 0, false}};
  for (const S& s : shapes) {
    const int64_t ld = s.cols + s.pad + s.col_off;
    for (int op = 0; op < 2; ++op) {
      const std::string what = absl::StrCat(op == 0 ? "RmsNorm" : "LayerNorm", " rows=", s.rows,
                                            " cols=", s.cols, " in_place=", s.in_place);
      Dual x(*gpu_, Random(s.rows * ld, seed_++, 2.0f, op == 1 ? 3.0f : 0.0f));
      Dual y(*gpu_, Random(s.rows * ld, seed_++));
      Dual w(*gpu_, Random(s.cols, seed_++, 0.1f, 1.0f)), b(*gpu_, Random(s.cols, seed_++, 0.1f));
      Dual& out = s.in_place ? x : y;
      if (op == 0) {
        cpu_->RmsNorm(x.HMat(s.rows, s.cols, ld, s.col_off), w.h(), 1e-6f,
                      out.HMat(s.rows, s.cols, ld, s.col_off));
        gpu_->RmsNorm(x.DMat(s.rows, s.cols, ld, s.col_off), w.d(), 1e-6f,
                      out.DMat(s.rows, s.cols, ld, s.col_off));
      } else {
        cpu_->LayerNorm(x.HMat(s.rows, s.cols, ld, s.col_off), w.h(), b.h(), 1e-6f,
                        out.HMat(s.rows, s.cols, ld, s.col_off));
        gpu_->LayerNorm(x.DMat(s.rows, s.cols, ld, s.col_off), w.d(), b.d(), 1e-6f,
                        out.DMat(s.rows, s.cols, ld, s.col_off));
      }
      out.Expect(2e-5, what);
    }
  }
}

TEST_F(CudaBackendTest, RopeMatchesCpu) {
  struct S { int64_t rows, heads, dim, first, row_extra; int num_freqs; };
  // MLA q_pe (dims [nope, nope + rope) of each head), k_pe (one head, stride 0), indexer q.
  const S shapes[] = {{1, 1, 64, 0, 0, 32},     {5, 16, 256, 192, 0, 32}, {3, 1, 576, 512, 0, 32},
                      {33, 32, 128, 0, 7, 32},  {200, 64, 64, 0, 0, 1},   {2, 4, 2048, 0, 0, 1024}};
  std::mt19937 rng(9);
  for (const S& s : shapes) {
    const std::string what =
        absl::StrCat("RopeInterleaved rows=", s.rows, " heads=", s.heads, " freqs=", s.num_freqs);
    const int64_t row_stride = s.heads * s.dim + s.row_extra;
    Dual x(*gpu_, Random(s.rows * row_stride, seed_++));
    std::vector<int32_t> pos(s.rows);
    for (auto& p : pos) p = static_cast<int32_t>(rng() % 200000);
    DualInts positions(*gpu_, pos);
    std::vector<float> f(s.num_freqs);
    for (int i = 0; i < s.num_freqs; ++i) {
      f[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / (2.0f * s.num_freqs));
    }
    Dual inv_freq(*gpu_, f);
    const int64_t head_stride = s.heads == 1 ? 0 : s.dim;
    cpu_->RopeInterleaved({x.h() + s.first, s.rows, s.heads, 2 * s.num_freqs, row_stride,
                           head_stride},
                          positions.h(), inv_freq.h(), s.num_freqs);
    gpu_->RopeInterleaved({x.d() + s.first, s.rows, s.heads, 2 * s.num_freqs, row_stride,
                           head_stride},
                          positions.d(), inv_freq.d(), s.num_freqs);
    x.Expect(1e-6, what);
  }
}

// RopeInterleavedBoth (one launch for the query's rope dims and the indexer query's, both in q_b's
// output) equals the CPU's two RopeInterleaved calls; views of different row strides take two
// launches and also match.
TEST_F(CudaBackendTest, RopeBothMatchesCpu) {
  std::mt19937 rng(4);
  for (int64_t rows : {1, 3, 16}) {
    for (bool same_stride : {true, false}) {
      const std::string what = absl::StrCat("RopeInterleavedBoth rows=", rows,
                                            same_stride ? " one row stride" : " two strides");
      // [rows, 64 x 256 | 32 x 128]: q heads (rope at 192..255), then the indexer query heads.
      const int64_t ld = 64 * 256 + 32 * 128, ld_b = same_stride ? ld : 32 * 128 + 8;
      Dual x(*gpu_, Random(rows * ld, seed_++)), y(*gpu_, Random(rows * ld_b, seed_++));
      std::vector<int32_t> pos(rows);
      for (auto& p : pos) p = static_cast<int32_t>(rng() % 200000);
      DualInts positions(*gpu_, pos);
      std::vector<float> f(32);
      for (int i = 0; i < 32; ++i) f[i] = 1.0f / std::pow(10000.0f, i / 32.0f);
      Dual inv_freq(*gpu_, f);
      auto views = [&](float* xd, float* yd) {
        const HeadsView a{xd + 192, rows, 64, 64, ld, 256};
        const HeadsView b = same_stride ? HeadsView{xd + 64 * 256, rows, 32, 64, ld, 128}
                                        : HeadsView{yd, rows, 32, 64, ld_b, 128};
        return std::make_pair(a, b);
      };
      const auto [ca, cb] = views(x.h(), y.h());
      const auto [ga, gb] = views(x.d(), y.d());
      cpu_->RopeInterleavedBoth(ca, cb, positions.h(), inv_freq.h(), 32);
      gpu_->RopeInterleavedBoth(ga, gb, positions.d(), inv_freq.d(), 32);
      x.Expect(1e-6, what);
      y.Expect(1e-6, what);
    }
  }
}

// TryAllocate of more than the device has returns an empty buffer and leaves the backend usable
// (the key-slot arena fails the step, not the engine); Allocate of it is the sticky error.
TEST_F(CudaBackendTest, TryAllocateFailureIsNotSticky) {
  const size_t too_much = size_t{1} << 50;
  std::unique_ptr<Buffer> none = gpu_->TryAllocate(too_much);
  EXPECT_TRUE(none == nullptr || none->data() == nullptr);
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
  Dual x(*gpu_, Random(64, 3)), y(*gpu_, std::vector<float>(64, 0.0f));
  gpu_->Copy(x.DMat(4, 16, 16), y.DMat(4, 16, 16));
  cpu_->Copy(x.HMat(4, 16, 16), y.HMat(4, 16, 16));
  y.Expect(0.0, "Copy after a failed TryAllocate");
  std::unique_ptr<Buffer> some = gpu_->TryAllocate(1 << 20);
  ASSERT_TRUE(some != nullptr && some->data() != nullptr);
  gpu_->Allocate(too_much);
  EXPECT_EQ(gpu_->status().code(), absl::StatusCode::kResourceExhausted) << gpu_->status();
  gpu_.reset();  // TearDown expects an OK status
}

TEST_F(CudaBackendTest, ElementwiseAndRowOpsMatchCpu) {
  struct S { int64_t rows, cols, pad; };
  const S shapes[] = {{1, 1, 0}, {1, 255, 1}, {3, 257, 3}, {17, 1000, 24}, {300, 6144, 0}};
  std::mt19937 rng(3);
  for (const S& s : shapes) {
    const std::string shape = absl::StrCat(" rows=", s.rows, " cols=", s.cols, " pad=", s.pad);
    const int64_t ld = s.cols + s.pad, ld2 = s.cols + 2 * s.pad + 1;
    {
      Dual g(*gpu_, Random(s.rows * ld, seed_++, 3.0f)), u(*gpu_, Random(s.rows * ld2, seed_++));
      Dual o(*gpu_, Random(s.rows * ld2, seed_++));
      cpu_->SiluMul(g.HMat(s.rows, s.cols, ld), u.HMat(s.rows, s.cols, ld2),
                    o.HMat(s.rows, s.cols, ld2));
      gpu_->SiluMul(g.DMat(s.rows, s.cols, ld), u.DMat(s.rows, s.cols, ld2),
                    o.DMat(s.rows, s.cols, ld2));
      o.Expect(1e-6, "SiluMul" + shape);
      cpu_->SiluMul(g.HMat(s.rows, s.cols, ld), g.HMat(s.rows, s.cols, ld),
                    g.HMat(s.rows, s.cols, ld));
      gpu_->SiluMul(g.DMat(s.rows, s.cols, ld), g.DMat(s.rows, s.cols, ld),
                    g.DMat(s.rows, s.cols, ld));
      g.Expect(1e-6, "SiluMul in place" + shape);
    }
    {
      Dual x(*gpu_, Random(s.rows * ld, seed_++)), y(*gpu_, Random(s.rows * ld2, seed_++));
      cpu_->Add(x.HMat(s.rows, s.cols, ld), y.HMat(s.rows, s.cols, ld2));
      gpu_->Add(x.DMat(s.rows, s.cols, ld), y.DMat(s.rows, s.cols, ld2));
      y.Expect(0, "Add" + shape);
      cpu_->Copy(x.HMat(s.rows, s.cols, ld), y.HMat(s.rows, s.cols, ld2));
      gpu_->Copy(x.DMat(s.rows, s.cols, ld), y.DMat(s.rows, s.cols, ld2));
      y.Expect(0, "Copy" + shape);
      cpu_->Fill(y.HMat(s.rows, s.cols, ld2), -1.5f);
      gpu_->Fill(y.DMat(s.rows, s.cols, ld2), -1.5f);
      y.Expect(0, "Fill" + shape);
    }
    {
      // Gather s.rows rows out of a table of 2 * rows + 3, then scatter them back elsewhere.
      const int64_t table_rows = 2 * s.rows + 3;
      std::vector<int32_t> perm(table_rows);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      DualInts ids(*gpu_, std::vector<int32_t>(perm.begin(), perm.begin() + s.rows));
      Dual table(*gpu_, Random(table_rows * ld, seed_++)), out(*gpu_, Random(s.rows * ld2, seed_++));
      cpu_->GatherRows(table.HMat(table_rows, s.cols, ld), ids.h(), out.HMat(s.rows, s.cols, ld2));
      gpu_->GatherRows(table.DMat(table_rows, s.cols, ld), ids.d(), out.DMat(s.rows, s.cols, ld2));
      out.Expect(0, "GatherRows" + shape);
      Dual src(*gpu_, Random(s.rows * ld2, seed_++));
      cpu_->ScatterRows(src.HMat(s.rows, s.cols, ld2), ids.h(), table.HMat(table_rows, s.cols, ld));
      gpu_->ScatterRows(src.DMat(s.rows, s.cols, ld2), ids.d(), table.DMat(table_rows, s.cols, ld));
      table.Expect(0, "ScatterRows" + shape);
    }
  }
}

TEST_F(CudaBackendTest, MoeRouteMatchesCpu) {
  struct S { int64_t rows; int experts, n_group, topk_group, top_k; bool renorm, bias, equal; };
  const S cases[] = {{1, 1, 1, 1, 1, true, true, false},      {5, 8, 1, 1, 2, true, true, false},
                     {17, 256, 1, 1, 8, true, true, false},   {33, 256, 8, 4, 8, true, true, false},
                     {9, 160, 1, 1, 6, false, false, false},  {4, 64, 64, 5, 6, true, true, false},
                     {6, 16, 8, 1, 4, true, true, false},     {3, 64, 4, 2, 8, true, false, true},
                     {300, 72, 6, 6, 5, false, true, false}};
  for (const S& c : cases) {
    const std::string what = absl::StrCat("MoeRoute rows=", c.rows, " experts=", c.experts,
                                          " groups=", c.n_group, "/", c.topk_group,
                                          " top_k=", c.top_k);
    const int64_t ld = c.experts + 1;
    auto l = Random(c.rows * ld, seed_++, 2.0f);
    if (c.equal) std::fill(l.begin(), l.end(), 0.5f);
    Dual logits(*gpu_, l), bias(*gpu_, Random(c.experts, seed_++, c.equal ? 0.0f : 0.1f));
    // Every other case with a shared expert appended after the top_k.
    const int appended = c.rows % 2 == 1 ? c.experts : -1;
    const int out_k = appended >= 0 ? c.top_k + 1 : c.top_k;
    DualInts ids(*gpu_, std::vector<int32_t>(c.rows * out_k, -7));
    Dual weights(*gpu_, std::vector<float>(c.rows * out_k, -7.0f));
    cpu_->MoeRoute(logits.HMat(c.rows, c.experts, ld), c.bias ? bias.h() : nullptr, c.n_group,
                   c.topk_group, c.top_k, c.renorm, 2.5f, appended, ids.h(), weights.h());
    gpu_->MoeRoute(logits.DMat(c.rows, c.experts, ld), c.bias ? bias.d() : nullptr, c.n_group,
                   c.topk_group, c.top_k, c.renorm, 2.5f, appended, ids.d(), weights.d());
    std::vector<int32_t> got(c.rows * out_k);
    gpu_->CopyToHost(got.data(), ids.d(), got.size() * sizeof(int32_t));
    ASSERT_EQ(got, std::vector<int32_t>(ids.h(), ids.h() + got.size())) << what;
    weights.Expect(1e-6, what);
  }
}

TEST_F(CudaBackendTest, FirstErrorIsStickyAndLaterOpsAreSkipped) {
  Dual x(*gpu_, Random(64, 1)), y(*gpu_, std::vector<float>(64, 3.0f));
  std::vector<float> host(64, 1.0f);
  // A host pointer where device memory is required: the launch check fails.
  gpu_->RmsNorm({host.data(), 4, 16, 16}, x.d(), 1e-6f, y.DMat(4, 16, 16));
  const absl::Status first = gpu_->status();
  ASSERT_FALSE(first.ok());
  EXPECT_NE(first.message().find("RmsNorm"), absl::string_view::npos) << first;
  // Later ops do nothing and the first error stays.
  gpu_->Fill(y.DMat(4, 16, 16), 0.0f);
  gpu_->Linear(x.DMat(4, 16, 16), x.DMat(4, 16, 16), y.DMat(4, 16, 16), false);
  gpu_->Synchronize();
  EXPECT_EQ(gpu_->status(), first);
  std::vector<float> got(64, 0.0f);
  gpu_->CopyToHost(got.data(), y.d(), 64 * sizeof(float));
  EXPECT_EQ(got, std::vector<float>(64, 0.0f)) << "CopyToHost after an error must not copy";
  gpu_.reset();  // TearDown expects an OK status
}

TEST_F(CudaBackendTest, BadGemmViewIsAnError) {
  Dual x(*gpu_, Random(64, 1)), y(*gpu_, Random(64, 2));
  gpu_->Linear({x.d(), 4, 16, 8}, {x.d(), 4, 16, 16}, y.DMat(4, 4, 4), false);  // ld < cols
  ASSERT_FALSE(gpu_->status().ok());
  EXPECT_NE(gpu_->status().message().find("Linear"), absl::string_view::npos) << gpu_->status();
  gpu_.reset();
}

// A side branch (Backend::BeginSide) runs concurrently with the main stream and is joined back:
// both results equal the cpu backend's; a scratch-using op on a branch is an error.
TEST_F(CudaBackendTest, SideBranchJoinsAndRefusesScratchOps) {
  const int64_t rows = 8, cols = 6144;
  Dual a(*gpu_, Random(rows * cols, 1, 2.0f)), b(*gpu_, Random(rows * cols, 2, 2.0f));
  Dual w(*gpu_, Random(cols, 3, 0.1f, 1.0f));
  for (int round = 0; round < 3; ++round) {  // the branch's stream and events are reused
    cpu_->RmsNorm(a.HMat(rows, cols, cols), w.h(), 1e-6f, a.HMat(rows, cols, cols));
    cpu_->RmsNorm(b.HMat(rows, cols, cols), w.h(), 1e-6f, b.HMat(rows, cols, cols));
    gpu_->BeginSide();
    gpu_->RmsNorm(a.DMat(rows, cols, cols), w.d(), 1e-6f, a.DMat(rows, cols, cols));
    gpu_->EndSide();
    gpu_->RmsNorm(b.DMat(rows, cols, cols), w.d(), 1e-6f, b.DMat(rows, cols, cols));
    gpu_->JoinSide();
    a.Expect(1e-5, absl::StrCat("side branch, round ", round));
    b.Expect(1e-5, absl::StrCat("main stream, round ", round));
  }
  gpu_->BeginSide();
  gpu_->Linear(a.DMat(rows, cols, cols), a.DMat(4, cols, cols), b.DMat(rows, 4, 4), false);
  gpu_->EndSide();
  ASSERT_FALSE(gpu_->status().ok());
  EXPECT_NE(gpu_->status().message().find("Linear was enqueued on a side branch"),
            absl::string_view::npos)
      << gpu_->status();
  gpu_.reset();
}

TEST_F(CudaBackendTest, AbsorbPerHeadWithMismatchedHeadsIsAnError) {
  // x [1 row, 2 heads, 16], y [1 row, 3 heads, 8] over a [48, 16] weight: y's heads differ.
  Dual x(*gpu_, Random(32, 1)), w(*gpu_, Random(48 * 16, 2)), y(*gpu_, Random(24, 3));
  gpu_->AbsorbPerHead({x.d(), 1, 2, 16, 32, 16}, w.DMat(48, 16, 16), 16, 0,
                      Backend::PerHeadContract::kCols, {y.d(), 1, 3, 8, 24, 8});
  ASSERT_FALSE(gpu_->status().ok());
  EXPECT_NE(gpu_->status().message().find("y needs x's rows and heads"), absl::string_view::npos)
      << gpu_->status();
  gpu_.reset();
}

}  // namespace
}  // namespace glm::engine
