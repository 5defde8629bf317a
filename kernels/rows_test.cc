// FillRows / AddRows / CopyRows (plain, gather, scatter) on the GPU against host loops: shapes
// 1x1, non-multiples of the 256-thread tile, large; padded strides, aliasing for AddRows, guard
// bytes around every buffer, untouched padding and rows. Skips without a GPU.
#include "kernels/rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"

namespace glm::kernels {
namespace {

using testing::GuardedBuffer;

struct Shape {
  int64_t rows, cols, pad;
};
const Shape kShapes[] = {{1, 1, 0}, {1, 255, 1}, {3, 257, 3}, {17, 1000, 24}, {300, 6144, 0},
                         {2, 100003, 5}};

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class RowsTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
};

TEST_F(RowsTest, FillAndAddMatchHost) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(absl::StrCat("rows=", s.rows, " cols=", s.cols, " pad=", s.pad));
    const int64_t ld = s.cols + s.pad;
    const size_t n = static_cast<size_t>(s.rows * ld);
    auto x = Random(n, 1), y = Random(n, 2);
    GuardedBuffer dx(n * 4), dy(n * 4);
    ASSERT_TRUE(dx.ok() && dy.ok());
    GLM_CUDA_ASSERT(dx.Upload(x.data(), n * 4));
    GLM_CUDA_ASSERT(dy.Upload(y.data(), n * 4));
    ASSERT_TRUE(AddRows(dx.as<float>(), ld, dy.as<float>(), ld, s.rows, s.cols, nullptr).ok());
    std::vector<float> got(n);
    GLM_CUDA_ASSERT(dy.Download(got.data(), n * 4));
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t c = 0; c < ld; ++c) {
        const size_t i = static_cast<size_t>(r * ld + c);
        ASSERT_TRUE(std::isfinite(got[i]));
        ASSERT_EQ(got[i], c < s.cols ? y[i] + x[i] : y[i]) << r << " " << c;
      }
    }
    // In place: y += y.
    ASSERT_TRUE(AddRows(dy.as<float>(), ld, dy.as<float>(), ld, s.rows, s.cols, nullptr).ok());
    std::vector<float> twice(n);
    GLM_CUDA_ASSERT(dy.Download(twice.data(), n * 4));
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t c = 0; c < s.cols; ++c) {
        const size_t i = static_cast<size_t>(r * ld + c);
        ASSERT_EQ(twice[i], got[i] + got[i]);
      }
    }
    ASSERT_TRUE(FillRows(dy.as<float>(), ld, s.rows, s.cols, -2.5f, nullptr).ok());
    GLM_CUDA_ASSERT(dy.Download(got.data(), n * 4));
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t c = 0; c < ld; ++c) {
        const size_t i = static_cast<size_t>(r * ld + c);
        ASSERT_EQ(got[i], c < s.cols ? -2.5f : twice[i]) << r << " " << c;
      }
    }
    ASSERT_TRUE(dx.GuardsIntact() && dy.GuardsIntact());
  }
}

TEST_F(RowsTest, CopyGatherScatterMatchHost) {
  std::mt19937 rng(3);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(absl::StrCat("rows=", s.rows, " cols=", s.cols, " pad=", s.pad));
    const int64_t src_ld = s.cols + s.pad, dst_ld = s.cols + 2 * s.pad + 1;
    const int64_t table_rows = 2 * s.rows + 3;  // the gathered-from / scattered-into matrix
    // Distinct row ids into the table (scatter needs them distinct).
    std::vector<int32_t> perm(static_cast<size_t>(table_rows));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> ids(perm.begin(), perm.begin() + s.rows);
    auto src = Random(static_cast<size_t>(table_rows * src_ld), 4);
    auto dst0 = Random(static_cast<size_t>(table_rows * dst_ld), 5);
    GuardedBuffer dsrc(src.size() * 4), ddst(dst0.size() * 4), dids(ids.size() * 4);
    ASSERT_TRUE(dsrc.ok() && ddst.ok() && dids.ok());
    GLM_CUDA_ASSERT(dsrc.Upload(src.data(), src.size() * 4));
    GLM_CUDA_ASSERT(dids.Upload(ids.data(), ids.size() * 4));
    for (int mode = 0; mode < 3; ++mode) {  // copy, gather, scatter
      SCOPED_TRACE(mode);
      GLM_CUDA_ASSERT(ddst.Upload(dst0.data(), dst0.size() * 4));
      const int32_t* src_rows = mode == 1 ? dids.as<int32_t>() : nullptr;
      const int32_t* dst_rows = mode == 2 ? dids.as<int32_t>() : nullptr;
      ASSERT_TRUE(CopyRows(dsrc.as<float>(), src_ld, src_rows, ddst.as<float>(), dst_ld, dst_rows,
                           s.rows, s.cols, nullptr)
                      .ok());
      std::vector<float> want = dst0, got(dst0.size());
      for (int64_t i = 0; i < s.rows; ++i) {
        const int64_t sr = mode == 1 ? ids[i] : i, dr = mode == 2 ? ids[i] : i;
        for (int64_t c = 0; c < s.cols; ++c) want[dr * dst_ld + c] = src[sr * src_ld + c];
      }
      GLM_CUDA_ASSERT(ddst.Download(got.data(), got.size() * 4));
      ASSERT_EQ(got, want);
      ASSERT_TRUE(ddst.GuardsIntact() && dsrc.GuardsIntact() && dids.GuardsIntact());
    }
  }
}

TEST_F(RowsTest, RejectsBadInputs) {
  GuardedBuffer d(1024);
  std::vector<float> host(16);
  EXPECT_FALSE(FillRows(d.as<float>(), 4, 1, 8, 0.0f, nullptr).ok());
  EXPECT_FALSE(FillRows(host.data(), 8, 1, 8, 0.0f, nullptr).ok());
  EXPECT_FALSE(AddRows(d.as<float>(), 8, d.as<float>(), 16, 1, 8, nullptr).ok());
  EXPECT_FALSE(CopyRows(d.as<float>(), 8, nullptr, host.data(), 8, nullptr, 1, 8, nullptr).ok());
  EXPECT_FALSE(CopyRows(d.as<float>(), 8, reinterpret_cast<const int32_t*>(host.data()),
                        d.as<float>(), 8, nullptr, 1, 8, nullptr)
                   .ok());
  EXPECT_TRUE(CopyRows(nullptr, 8, nullptr, nullptr, 8, nullptr, 0, 8, nullptr).ok());
}

}  // namespace
}  // namespace glm::kernels
