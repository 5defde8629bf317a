// GemmBf16Plan (cuBLASLt) on the GPU against a host fp64 reference on the bf16 values:
// M in {1, 7, 64, 300}, N and K including non-multiples of 128 and of 16, padded strides,
// bf16 and fp32 output, accumulate on and off, guard bytes around y, poisoned y, finite outputs;
// input checks.
// Tolerance |y - ref| <= r·(|ref| + a·(|x·w| + |y0|)) + 1e-4·L1 (L1 = Σ|x·w|): products of bf16
// values are exact in fp32, fp32 accumulation errs by at most K·2^-24·L1 (< 1e-4·L1 for
// K <= 1600); r = 2^-8 for bf16 output (round to nearest), 1e-6 for fp32; a = 1 when
// accumulating into bf16 y, where cuBLASLt may round the product to bf16 before adding y0
// (observed on H200: a second rounding of up to 2^-9·|x·w|), else 0.
#include "kernels/gemm_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"

namespace glm::kernels {
namespace {

using testing::Bf16ToFloat;
using testing::FloatToBf16;
using testing::GuardedBuffer;

class GemmBf16Test : public ::testing::Test {
 protected:
  void SetUp() override {
    GLM_SKIP_WITHOUT_GPU();
    auto h = BlasLtHandle::Create();
    ASSERT_TRUE(h.ok()) << h.status();
    handle_ = std::move(*h);
  }
  std::unique_ptr<BlasLtHandle> handle_;
};

std::vector<float> RandomBf16(size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = Bf16ToFloat(FloatToBf16(nd(rng)));
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = FloatToBf16(v[i]);
  return b;
}

TEST_F(GemmBf16Test, SweepMatchesReference) {
  std::mt19937 rng(23);
  struct NK { int64_t n, k, pad; };
  const NK nks[] = {{16, 16, 0}, {136, 200, 8}, {577, 999, 0}, {256, 1040, 0}};
  double max_norm_err = 0;
  int runs = 0;
  for (int64_t m : {1, 7, 64, 300}) {
    for (const NK& nk : nks) {
      const int64_t ldx = nk.k + nk.pad, ldw = nk.k + nk.pad, ldy = nk.n + nk.pad;
      const std::vector<float> x = RandomBf16(m * ldx, 1.0f, rng);
      const std::vector<float> w = RandomBf16(nk.n * ldw, 0.05f, rng);
      std::vector<double> ref(m * nk.n), l1(m * nk.n);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < nk.n; ++c) {
          double s = 0, a = 0;
          for (int64_t i = 0; i < nk.k; ++i) {
            const double p = static_cast<double>(x[r * ldx + i]) * w[c * ldw + i];
            s += p;
            a += std::fabs(p);
          }
          ref[r * nk.n + c] = s;
          l1[r * nk.n + c] = a;
        }
      }
      const auto xb = ToBf16(x), wb = ToBf16(w);
      GuardedBuffer dx(xb.size() * 2), dw(wb.size() * 2);
      ASSERT_TRUE(dx.ok() && dw.ok());
      GLM_CUDA_ASSERT(dx.Upload(xb.data(), xb.size() * 2));
      GLM_CUDA_ASSERT(dw.Upload(wb.data(), wb.size() * 2));
      for (DType out : {DType::kBF16, DType::kF32}) {
        GemmBf16Shape shape{m, nk.n, nk.k, ldx, ldw, ldy, out};
        SCOPED_TRACE(shape.DebugString());
        auto plan = GemmBf16Plan::Create(*handle_, shape);
        ASSERT_TRUE(plan.ok()) << plan.status();
        const bool f32 = out == DType::kF32;
        const size_t esz = f32 ? 4 : 2;
        GuardedBuffer dy(m * ldy * esz), dwork(std::max<size_t>((*plan)->workspace_bytes(), 256));
        ASSERT_TRUE(dy.ok() && dwork.ok());
        for (bool acc : {false, true}) {
          std::vector<float> y0(m * ldy, 0.0f);
          std::vector<unsigned char> hy(dy.bytes());
          if (acc) {
            y0 = RandomBf16(m * ldy, 1.0f, rng);
            for (int64_t i = 0; i < m * ldy; ++i) {
              if (f32) {
                std::memcpy(&hy[i * 4], &y0[i], 4);
              } else {
                const uint16_t b = FloatToBf16(y0[i]);
                std::memcpy(&hy[i * 2], &b, 2);
              }
            }
            GLM_CUDA_ASSERT(dy.Upload(hy.data(), hy.size()));
          } else {
            GLM_CUDA_ASSERT(dy.Poison(0xFF));
          }
          const absl::Status st = (*plan)->Run(dx.data(), dw.data(), dy.data(), acc,
                                               dwork.data(), dwork.bytes(), nullptr);
          ASSERT_TRUE(st.ok()) << st;
          GLM_CUDA_ASSERT(cudaDeviceSynchronize());
          GLM_CUDA_ASSERT(dy.Download(hy.data(), hy.size()));
          EXPECT_TRUE(dy.GuardsIntact());
          const double r_tol = f32 ? 1e-6 : std::ldexp(1.0, -8);
          int bad = 0;
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t c = 0; c < ldy; ++c) {
              float got;
              if (f32) {
                std::memcpy(&got, &hy[(r * ldy + c) * 4], 4);
              } else {
                uint16_t b;
                std::memcpy(&b, &hy[(r * ldy + c) * 2], 2);
                got = Bf16ToFloat(b);
              }
              if (c >= nk.n) {
                const bool untouched = acc ? got == y0[r * ldy + c] : std::isnan(got);
                if (!untouched && bad++ < 5) ADD_FAILURE() << "padding written at " << r << "," << c;
                continue;
              }
              const double want = (acc ? y0[r * ldy + c] : 0.0) + ref[r * nk.n + c];
              const double err = std::fabs(got - want);
              const double a = l1[r * nk.n + c];
              const double second_rounding =
                  acc ? std::fabs(ref[r * nk.n + c]) + std::fabs(y0[r * ldy + c]) : 0.0;
              if (!std::isfinite(got) ||
                  err > r_tol * (std::fabs(want) + second_rounding) + 1e-4 * a) {
                if (bad++ < 5) {
                  ADD_FAILURE() << "acc=" << acc << " y[" << r << "," << c << "]=" << got
                                << " want " << want << " (L1 " << a << ")";
                }
              }
              if (a > 0 && std::isfinite(got)) {
                const double rounding = f32 ? 0.0 : std::ldexp(std::fabs(want), -8);
                max_norm_err = std::max(max_norm_err, std::max(0.0, err - rounding) / a);
              }
            }
          }
          ++runs;
          EXPECT_EQ(bad, 0);
        }
      }
    }
  }
  std::printf("cuBLASLt bf16: %d runs, max |err|/L1 = %.3g\n", runs, max_norm_err);
}

TEST_F(GemmBf16Test, RejectsBadShapesAndArguments) {
  EXPECT_EQ(GemmBf16Plan::Create(*handle_, GemmBf16Shape{-1, 8, 8}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GemmBf16Plan::Create(*handle_, GemmBf16Shape{1, 0, 8}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GemmBf16Plan::Create(*handle_, GemmBf16Shape{1, 8, 16, 8}).status().code(),
            absl::StatusCode::kInvalidArgument);  // ldx < k
  auto plan = GemmBf16Plan::Create(*handle_, GemmBf16Shape{4, 64, 64});
  ASSERT_TRUE(plan.ok()) << plan.status();
  GuardedBuffer buf(1 << 16);
  ASSERT_TRUE(buf.ok());
  char* p = static_cast<char*>(buf.data());
  absl::Status st = (*plan)->Run(p + 2, p, p, false, p, (*plan)->workspace_bytes(), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("aligned"), std::string::npos) << st;
  if ((*plan)->workspace_bytes() > 0) {
    st = (*plan)->Run(p, p, p, false, p, (*plan)->workspace_bytes() - 1, nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  }
  auto empty = GemmBf16Plan::Create(*handle_, GemmBf16Shape{0, 64, 64});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE((*empty)->Run(nullptr, nullptr, nullptr, false, nullptr, 0, nullptr).ok());
}

}  // namespace
}  // namespace glm::kernels
