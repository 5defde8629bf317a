#include "engine/weights/dequantize.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/weights/float_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

using ::testing::HasSubstr;

// A 160x200 FP8 weight (partial blocks in both dims with 128x128 blocks: scale [2, 2]).
struct Fp8Fixture {
  static constexpr int64_t kRows = 160;
  static constexpr int64_t kCols = 200;
  std::vector<uint8_t> codes = std::vector<uint8_t>(kRows * kCols);
  std::vector<float> scales = {0.5f, 2.0f, 0.25f, 3.0f};  // [2, 2]: [[0.5, 2], [0.25, 3]]
  TensorView weight;
  TensorView scale;

  Fp8Fixture() {
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t j = 0; j < kCols; ++j) {
        uint8_t code = static_cast<uint8_t>((i * 7 + j * 3) % 256);
        if (code == 0x7F || code == 0xFF) code = 0x38;  // keep NaNs out of the bulk check
        codes[i * kCols + j] = code;
      }
    }
    // Hand-picked corners of each block.
    codes[0 * kCols + 0] = 0x38;      // 1.0    in block (0, 0): * 0.5  = 0.5
    codes[127 * kCols + 127] = 0x40;  // 2.0    in block (0, 0): * 0.5  = 1.0
    codes[0 * kCols + 128] = 0xC4;    // -3.0   in block (0, 1): * 2    = -6.0
    codes[128 * kCols + 0] = 0x7E;    // 448    in block (1, 0): * 0.25 = 112
    codes[159 * kCols + 199] = 0x01;  // 2^-9   in block (1, 1): * 3    = 3·2^-9
    codes[130 * kCols + 150] = 0x3C;  // 1.5    in block (1, 1): * 3    = 4.5
    weight = {"w.weight", DType::kF8E4M3, {kRows, kCols},
              reinterpret_cast<const std::byte*>(codes.data()), codes.size()};
    scale = {"w.weight_scale_inv", DType::kF32, {2, 2},
             reinterpret_cast<const std::byte*>(scales.data()), scales.size() * 4};
  }
};

TEST(DequantizeTest, Fp8BlockScalesWithPartialBlocks) {
  Fp8Fixture f;
  auto out = DecodeToFloat(f.weight, &f.scale);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 160u * 200u);
  auto at = [&](int64_t i, int64_t j) { return (*out)[i * 200 + j]; };
  EXPECT_EQ(at(0, 0), 0.5f);
  EXPECT_EQ(at(127, 127), 1.0f);
  EXPECT_EQ(at(0, 128), -6.0f);
  EXPECT_EQ(at(128, 0), 112.0f);
  EXPECT_EQ(at(159, 199), 3.0f * 0x1.0p-9f);
  EXPECT_EQ(at(130, 150), 4.5f);
  // Every element: the block index is (i / 128, j / 128).
  for (int64_t i = 0; i < 160; ++i) {
    for (int64_t j = 0; j < 200; ++j) {
      const float expected = Fp8E4M3ToFloat(f.codes[i * 200 + j]) * f.scales[(i / 128) * 2 + j / 128];
      ASSERT_EQ(at(i, j), expected) << i << "," << j;
    }
  }
}

TEST(DequantizeTest, RegionsMatchTheFullMatrix) {
  Fp8Fixture f;
  auto full = DecodeToFloat(f.weight, &f.scale);
  ASSERT_TRUE(full.ok());
  // Slices that start and end inside blocks and cross block boundaries.
  for (auto [r0, r1, c0, c1] : std::vector<std::array<int64_t, 4>>{
           {0, 160, 0, 200}, {100, 140, 0, 200}, {0, 160, 120, 131}, {127, 129, 127, 129},
           {159, 160, 199, 200}, {5, 5, 0, 200}, {0, 160, 200, 200}}) {
    auto region = DecodeRegion(f.weight, &f.scale, {}, r0, r1, c0, c1);
    ASSERT_TRUE(region.ok()) << region.status();
    ASSERT_EQ(region->size(), static_cast<size_t>((r1 - r0) * (c1 - c0)));
    for (int64_t i = r0; i < r1; ++i) {
      for (int64_t j = c0; j < c1; ++j) {
        ASSERT_EQ((*region)[(i - r0) * (c1 - c0) + (j - c0)], (*full)[i * 200 + j]);
      }
    }
  }
  EXPECT_EQ(DecodeRegion(f.weight, &f.scale, {}, 0, 161, 0, 200).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeRegion(f.weight, &f.scale, {}, 10, 5, 0, 200).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeRegion(f.weight, &f.scale, {}, 0, 1, -1, 200).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DequantizeTest, OtherBlockSizes) {
  Fp8Fixture f;
  // 100x150 blocks on 160x200 also give a [2, 2] scale, with different boundaries.
  auto out = DecodeToFloat(f.weight, &f.scale, {100, 150});
  ASSERT_TRUE(out.ok()) << out.status();
  for (int64_t i = 0; i < 160; ++i) {
    for (int64_t j = 0; j < 200; ++j) {
      const float expected = Fp8E4M3ToFloat(f.codes[i * 200 + j]) * f.scales[(i / 100) * 2 + j / 150];
      ASSERT_EQ((*out)[i * 200 + j], expected);
    }
  }
}

TEST(DequantizeTest, RejectsWrongScaleShape) {
  Fp8Fixture f;
  auto out = DecodeToFloat(f.weight, &f.scale, {64, 64});  // needs [3, 4]
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("scale 'w.weight_scale_inv' has shape [2, 2] but weight 'w.weight' "
                        "[160, 200] with 64x64 blocks needs [3, 4]"));
  EXPECT_FALSE(DecodeToFloat(f.weight, &f.scale, {0, 128}).ok());
}

TEST(DequantizeTest, RejectsScaleOnNonFp8) {
  std::vector<float> values(4, 1.0f);
  std::vector<float> scales(1, 2.0f);
  TensorView weight{"x.weight", DType::kF32, {2, 2}, reinterpret_cast<const std::byte*>(values.data()), 16};
  TensorView scale{"x.weight_scale_inv", DType::kF32, {1, 1}, reinterpret_cast<const std::byte*>(scales.data()), 4};
  auto out = DecodeToFloat(weight, &scale);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("only 2-D F8_E4M3 weights"));
}

TEST(DequantizeTest, Fp8WithoutScaleDecodesCodes) {
  const std::vector<uint8_t> codes = {0x38, 0xC4, 0x7F, 0x01};
  TensorView view{"x", DType::kF8E4M3, {4}, reinterpret_cast<const std::byte*>(codes.data()), 4};
  auto out = DecodeToFloat(view);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0], 1.0f);
  EXPECT_EQ((*out)[1], -3.0f);
  EXPECT_TRUE(std::isnan((*out)[2]));
  EXPECT_EQ((*out)[3], 0x1.0p-9f);
}

TEST(DequantizeTest, LargeTensorsUseThreadsAndStayExact) {
  // 2048 x 1100 BF16: above the threading threshold, odd row split.
  const int64_t rows = 2048, cols = 1100;
  std::vector<uint16_t> bits(rows * cols);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i * 2654435761u >> 16);
  TensorView view{"big", DType::kBF16, {rows, cols}, reinterpret_cast<const std::byte*>(bits.data()),
                  bits.size() * 2};
  auto out = DecodeToFloat(view);
  ASSERT_TRUE(out.ok());
  for (size_t i = 0; i < bits.size(); ++i) {
    const float expected = Bf16ToFloat(bits[i]);
    ASSERT_TRUE(std::memcmp(&(*out)[i], &expected, 4) == 0) << i;
  }
}

TEST(DequantizeTest, AsMatrix) {
  EXPECT_EQ(AsMatrix({}).rows, 1);
  EXPECT_EQ(AsMatrix({5}).rows, 5);
  EXPECT_EQ(AsMatrix({5}).cols, 1);
  EXPECT_EQ(AsMatrix({2, 3, 4}).cols, 12);
}

}  // namespace
}  // namespace glm::engine
