// INT4 / INT8 / NVFP4 checkpoint weights kept as stored (weight_source.h QuantizedTensor,
// WeightLoader in mode auto): the raw reads of a checkpoint (whole tensors and TP slices on group
// boundaries) decode, by the spec's formulas, to exactly what the dequantizer gives; the loader
// keeps them narrow only for a backend that takes the format (a fake one here), byte for byte,
// and widens them for the CPU backend, for explicit bf16 / fp32, for kv_b_proj-like parts and
// for TP shares that split a group.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/testing/scratch_dir.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/layers.h"
#include "engine/model/weight_source.h"
#include "engine/weights/safetensors_writer.h"
#include "engine/weights/weight_store.h"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;

// The checkpoint source the model uses (glm_moe_dsa.cc StoreWeights), reduced to what the
// loader calls.
class StoreSource : public WeightSource {
 public:
  explicit StoreSource(std::unique_ptr<WeightStore> store) : store_(std::move(store)) {}
  bool Has(const std::string& name) const override { return store_->Contains(name); }
  absl::StatusOr<std::vector<float>> ReadFloat(const std::string& name,
                                               std::vector<int64_t>* shape) override {
    auto s = store_->ShapeOf(name);
    if (!s.ok()) return s.status();
    if (shape != nullptr) *shape = *s;
    return store_->ReadFloat(name);
  }
  absl::StatusOr<std::vector<float>> ReadFloatSlice(const std::string& name,
                                                    const TensorSlice& slice,
                                                    std::vector<int64_t>* shape) override {
    auto s = store_->ShapeOf(name);
    if (!s.ok()) return s.status();
    if (shape != nullptr) *shape = *s;
    if (slice.dim == TensorSlice::kRows) return store_->ReadRowSlice(name, slice.begin, slice.end);
    if (slice.dim == TensorSlice::kCols) return store_->ReadColSlice(name, slice.begin, slice.end);
    return store_->ReadFloat(name);
  }
  std::optional<QuantizedInfo> QuantizedInfoOf(const std::string& name) const override {
    return StoreQuantizedInfo(*store_, name);
  }
  absl::StatusOr<QuantizedTensor> ReadQuantized(const std::string& name,
                                                const TensorSlice& slice) override {
    return ReadStoreQuantized(*store_, name, slice);
  }
  const WeightStore& store() const { return *store_; }

 private:
  std::unique_ptr<WeightStore> store_;
};

// A CPU backend that claims every WeightDType (what the CUDA backend says), so that the loader
// keeps quantized weights as stored in host memory the test can read.
class TakesQuantizedBackend final : public CpuBackend {
 public:
  TakesQuantizedBackend() : CpuBackend(1) {}
  bool SupportsWeightDType(WeightDType) const override { return true; }
};

// Takes quantized weights only with cols a multiple of 32 (the CUDA kernels' INT4 rule).
class ShapeLimitedBackend final : public CpuBackend {
 public:
  ShapeLimitedBackend() : CpuBackend(1) {}
  bool SupportsWeightDType(WeightDType) const override { return true; }
  bool SupportsQuantizedShape(WeightDType, int64_t, int64_t cols, int64_t) const override {
    return cols % 32 == 0;
  }
};

// ---- Reference decoding of the raw bytes (specs/quantized-checkpoints.md §1.5, §2.4) ----------

float Bf16ToFloat(const uint8_t* p) {
  const uint32_t u = (static_cast<uint32_t>(p[1]) << 24) | (static_cast<uint32_t>(p[0]) << 16);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float E4m3ToFloat(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  const float v = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -v : v;
}

float E2m1(uint8_t code) {
  static constexpr float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kValues[code & 7];
  return (code & 8) ? -v : v;
}

// W [rows, cols] of a QuantizedTensor-shaped buffer: packed rows of `ld` bytes, scale rows of
// `scale_ld` entries.
std::vector<float> Decode(WeightDType dtype, int64_t rows, int64_t cols, const uint8_t* data,
                          int64_t ld, const uint8_t* scales, int64_t scale_ld, int scale_bytes,
                          int64_t group, float global_scale) {
  std::vector<float> w(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      const uint8_t* s = scales + (r * scale_ld + k / group) * scale_bytes;
      float q = 0.0f;
      if (dtype == WeightDType::kNvfp4) {
        const uint8_t byte = data[r * ld + k / 2];
        q = E2m1(k % 2 == 0 ? byte & 0xF : byte >> 4);
        w[r * cols + k] = q * E4m3ToFloat(*s) * global_scale;
        continue;
      }
      const int bits = dtype == WeightDType::kInt4 ? 4 : 8;
      const int64_t per_word = 32 / bits;
      uint32_t word;
      std::memcpy(&word, data + r * ld + (k / per_word) * 4, 4);
      const uint32_t u = (word >> (bits * (k % per_word))) & ((1u << bits) - 1);
      q = static_cast<float>(static_cast<int>(u) - (1 << (bits - 1)));
      w[r * cols + k] = q * Bf16ToFloat(s);
    }
  }
  return w;
}

std::vector<float> Decode(const QuantizedTensor& t) {
  return Decode(t.dtype, t.shape[0], t.shape[1], t.data.data(), t.row_bytes, t.scales.data(),
                t.scale_cols, t.scale_bytes, t.group_size, t.global_scale);
}

// The checkpoint: "<m>.weight" modules of 48 x 64 in every format.
constexpr int64_t kRows = 48, kCols = 64;

class QuantizedNarrowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::ScratchDir("quantized_weights_narrow");
    std::mt19937 rng(11);
    std::vector<float> v(kRows * kCols);
    SafetensorsWriter w;
    auto fill = [&] {
      for (float& x : v) x = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    };
    fill();
    ASSERT_TRUE(w.AddPackQuantized("int4g16", {kRows, kCols}, v, 4, 16).ok());
    fill();
    ASSERT_TRUE(w.AddPackQuantized("int8g16", {kRows, kCols}, v, 8, 16).ok());
    fill();
    ASSERT_TRUE(w.AddPackQuantized("int4ch", {kRows, kCols}, v, 4, 0).ok());
    fill();
    ASSERT_TRUE(w.AddPackQuantized("int8ch", {kRows, kCols}, v, 8, 0).ok());
    fill();
    ASSERT_TRUE(w.AddNvfp4Quantized("nvfp4", {kRows, kCols}, v, nullptr, 0.0f, 0.5f).ok());
    fill();
    ASSERT_TRUE(w.AddNvfp4Quantized("nvfp4b", {kRows, kCols}, v, nullptr, 0.125f, 0.5f).ok());
    fill();
    ASSERT_TRUE(w.AddFloat("plain.weight", DType::kF32, {kRows, kCols}, v).ok());
    ASSERT_TRUE(w.WriteFile((dir_ / "model.safetensors").string()).ok());
    auto store = WeightStore::Open(dir_.string());
    ASSERT_TRUE(store.ok()) << store.status();
    source_ = std::make_unique<StoreSource>(std::move(store).value());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Host copy of a quantized view's packed rows and scales (CPU backend memory is host memory).
  static std::vector<float> DecodeView(const MatView& v, int scale_bytes) {
    return Decode(v.dtype, v.rows, v.cols, reinterpret_cast<const uint8_t*>(v.data), v.ld,
                  static_cast<const uint8_t*>(v.group_scales), v.scale_ld, scale_bytes,
                  v.group_size, v.global_scale);
  }

  fs::path dir_;
  std::unique_ptr<StoreSource> source_;
};

struct Case {
  const char* name;
  WeightDType dtype;
  int64_t group;  // QuantizedInfo::group_size (0 = per channel)
};
constexpr Case kCases[] = {{"int4g16.weight", WeightDType::kInt4, 16},
                           {"int8g16.weight", WeightDType::kInt8, 16},
                           {"int4ch.weight", WeightDType::kInt4, 0},
                           {"int8ch.weight", WeightDType::kInt8, 0},
                           {"nvfp4.weight", WeightDType::kNvfp4, 16},
                           {"nvfp4b.weight", WeightDType::kNvfp4, 16}};

TEST_F(QuantizedNarrowTest, InfoDescribesEachFormat) {
  for (const Case& c : kCases) {
    auto info = source_->QuantizedInfoOf(c.name);
    ASSERT_TRUE(info.has_value()) << c.name;
    EXPECT_EQ(info->dtype, c.dtype) << c.name;
    EXPECT_EQ(info->group_size, c.group) << c.name;
    EXPECT_EQ(info->shape, (std::vector<int64_t>{kRows, kCols})) << c.name;
  }
  EXPECT_FALSE(source_->QuantizedInfoOf("plain.weight").has_value());
  EXPECT_FALSE(source_->QuantizedInfoOf("absent.weight").has_value());
  InMemoryWeights mem;
  mem.Put("x", {2, 2}, {1, 2, 3, 4});
  EXPECT_FALSE(mem.QuantizedInfoOf("x").has_value());
  EXPECT_EQ(mem.ReadQuantized("x", {}).status().code(), absl::StatusCode::kUnimplemented);
}

TEST_F(QuantizedNarrowTest, RawReadsDecodeToTheDequantizer) {
  const WeightStore& store = source_->store();
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    auto whole = source_->ReadQuantized(c.name, {});
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(whole->dtype, c.dtype);
    EXPECT_EQ(whole->shape, (std::vector<int64_t>{kRows, kCols}));
    EXPECT_EQ(whole->full_shape, whole->shape);
    EXPECT_EQ(whole->group_size, c.group > 0 ? c.group : kCols);
    EXPECT_EQ(whole->row_bytes, c.dtype == WeightDType::kInt8 ? kCols : kCols / 2);
    // The whole tensor's bytes are the stored ones.
    auto parts = store.QuantizedPartsOf(c.name);
    ASSERT_TRUE(parts.ok()) << parts.status();
    ASSERT_EQ(whole->data.size(), parts->data.nbytes);
    EXPECT_EQ(std::memcmp(whole->data.data(), parts->data.data, parts->data.nbytes), 0);
    ASSERT_EQ(whole->scales.size(), parts->scale.nbytes);
    EXPECT_EQ(std::memcmp(whole->scales.data(), parts->scale.data, parts->scale.nbytes), 0);
    auto ref = store.ReadFloat(c.name);
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ(Decode(*whole), *ref);
    if (c.dtype == WeightDType::kNvfp4) {
      EXPECT_NE(whole->global_scale, 1.0f);
    }

    // TP shares: 2 and 4 ranks by rows (column-parallel) and by columns (row-parallel).
    for (int tp : {2, 4}) {
      for (int rank = 0; rank < tp; ++rank) {
        const TensorSlice rows{TensorSlice::kRows, rank * kRows / tp, (rank + 1) * kRows / tp};
        auto r = source_->ReadQuantized(c.name, rows);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->full_shape, (std::vector<int64_t>{kRows, kCols}));
        EXPECT_EQ(Decode(*r), *store.ReadRowSlice(c.name, rows.begin, rows.end));
        const TensorSlice cols{TensorSlice::kCols, rank * kCols / tp, (rank + 1) * kCols / tp};
        auto k = source_->ReadQuantized(c.name, cols);
        ASSERT_TRUE(k.ok()) << k.status();
        EXPECT_EQ(k->shape, (std::vector<int64_t>{kRows, kCols / tp}));
        EXPECT_EQ(k->group_size, c.group > 0 ? c.group : kCols / tp);
        EXPECT_EQ(Decode(*k), *store.ReadColSlice(c.name, cols.begin, cols.end));
      }
    }
  }
}

TEST_F(QuantizedNarrowTest, SlicesThatSplitAGroupOrAWordAreRefused) {
  const TensorSlice half_group{TensorSlice::kCols, 8, 24};  // groups of 16
  EXPECT_FALSE(QuantizedSliceAligned(*source_->QuantizedInfoOf("int8g16.weight"), half_group));
  auto r = source_->ReadQuantized("int8g16.weight", half_group);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("int8g16.weight"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("tp_size"), std::string::npos) << r.status();
  // Per channel any group boundary holds, but INT4 words hold 8 codes and INT8 words 4.
  const TensorSlice cols4{TensorSlice::kCols, 4, 64};
  EXPECT_FALSE(QuantizedSliceAligned(*source_->QuantizedInfoOf("int4ch.weight"), cols4));
  EXPECT_TRUE(QuantizedSliceAligned(*source_->QuantizedInfoOf("int8ch.weight"), cols4));
  EXPECT_FALSE(source_->ReadQuantized("int4ch.weight", cols4).ok());
  auto ok = source_->ReadQuantized("int8ch.weight", cols4);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(Decode(*ok), *source_->store().ReadColSlice("int8ch.weight", 4, 64));
  EXPECT_FALSE(source_->ReadQuantized("plain.weight", {}).ok());
}

TEST_F(QuantizedNarrowTest, LoaderKeepsThemNarrowOnABackendThatTakesThem) {
  TakesQuantizedBackend backend;
  WeightLoader w(*source_, &backend, LinearWeightMode::kAuto);
  int64_t expected_bytes = 0;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(w.LinearKind({c.name, kRows}, kCols), c.dtype);
    auto m = w.Linear(c.name, kRows, kCols);
    ASSERT_TRUE(m.ok()) << m.status();
    const MatView& v = m->view;
    EXPECT_EQ(v.dtype, c.dtype);
    EXPECT_EQ(v.rows, kRows);
    EXPECT_EQ(v.cols, kCols);
    EXPECT_EQ(v.ld % 16, 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.group_scales) % 16, 0u);
    EXPECT_EQ(v.group_size, c.group > 0 ? c.group : kCols);
    const int scale_bytes = c.dtype == WeightDType::kNvfp4 ? 1 : 2;
    EXPECT_EQ(v.scale_ld * scale_bytes % 16, 0);
    // Byte for byte the stored rows (padding aside), decoding to the dequantized weight.
    auto raw = source_->ReadQuantized(c.name, {});
    ASSERT_TRUE(raw.ok());
    for (int64_t r = 0; r < kRows; ++r) {
      EXPECT_EQ(std::memcmp(reinterpret_cast<const uint8_t*>(v.data) + r * v.ld,
                            raw->data.data() + r * raw->row_bytes, raw->row_bytes),
                0);
    }
    EXPECT_EQ(v.global_scale, raw->global_scale);
    EXPECT_EQ(DecodeView(v, scale_bytes), *source_->store().ReadFloat(c.name));
    expected_bytes += kRows * v.ld + kRows * v.scale_ld * scale_bytes;
    EXPECT_EQ(m->buffer->bytes() + m->scale_buffer->bytes(),
              static_cast<size_t>(kRows * v.ld + kRows * v.scale_ld * scale_bytes));
  }
  // The accounting counts the narrow bytes.
  EXPECT_EQ(w.bytes().linear, expected_bytes);
  EXPECT_EQ(w.bytes().quant_payload + w.bytes().quant_scales, expected_bytes);
  EXPECT_EQ(w.bytes().linear_fp32, 6 * kRows * kCols * 4);
  EXPECT_LT(w.bytes().linear * 3, w.bytes().linear_fp32);
  EXPECT_EQ(w.bytes().num_linear[static_cast<int>(WeightDType::kInt4)], 2);
  EXPECT_EQ(w.bytes().num_linear[static_cast<int>(WeightDType::kInt8)], 2);
  EXPECT_EQ(w.bytes().num_linear[static_cast<int>(WeightDType::kNvfp4)], 2);
  EXPECT_EQ(w.bytes().num_linear[static_cast<int>(WeightDType::kBF16)], 0);
}

TEST_F(QuantizedNarrowTest, TpSharesStayNarrowOnGroupBoundaries) {
  TakesQuantizedBackend backend;
  for (int rank = 0; rank < 2; ++rank) {
    WeightLoader w(*source_, &backend, LinearWeightMode::kAuto);
    w.set_tp({rank, 2});
    for (const Case& c : kCases) {
      SCOPED_TRACE(std::string(c.name) + " rank " + std::to_string(rank));
      const int scale_bytes = c.dtype == WeightDType::kNvfp4 ? 1 : 2;
      auto col = w.Linear(c.name, kRows, kCols, TpSplit::kColumnParallel);
      ASSERT_TRUE(col.ok()) << col.status();
      EXPECT_EQ(col->view.dtype, c.dtype);
      EXPECT_EQ(DecodeView(col->view, scale_bytes),
                *source_->store().ReadRowSlice(c.name, rank * kRows / 2, (rank + 1) * kRows / 2));
      auto row = w.Linear(c.name, kRows, kCols, TpSplit::kRowParallel);
      ASSERT_TRUE(row.ok()) << row.status();
      EXPECT_EQ(row->view.dtype, c.dtype);
      EXPECT_EQ(row->view.cols, kCols / 2);
      EXPECT_EQ(DecodeView(row->view, scale_bytes),
                *source_->store().ReadColSlice(c.name, rank * kCols / 2, (rank + 1) * kCols / 2));
    }
  }
  // 16 ranks by columns: 4 inputs each. Per channel that is half an INT4 word: widened from the
  // slice (the dequantizer takes any per-channel range). With groups of 16 it splits a group,
  // which the dequantizer refuses too (the load fails naming the rule, as before).
  WeightLoader w16(*source_, &backend, LinearWeightMode::kAuto);
  w16.set_tp({1, 16});
  EXPECT_EQ(w16.LinearKind({"int4ch.weight", kRows, TpSplit::kRowParallel}, kCols),
            WeightDType::kBF16);
  EXPECT_EQ(w16.LinearKind({"int8ch.weight", kRows, TpSplit::kRowParallel}, kCols),
            WeightDType::kInt8);
  EXPECT_EQ(w16.LinearKind({"int4g16.weight", kRows, TpSplit::kColumnParallel}, kCols),
            WeightDType::kInt4);
  auto m = w16.Linear("int4ch.weight", kRows, kCols, TpSplit::kRowParallel);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->view.dtype, WeightDType::kBF16);
  EXPECT_EQ(m->view.cols, 4);
  auto g = w16.Linear("int4g16.weight", kRows, kCols, TpSplit::kRowParallel);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("group"), std::string::npos) << g.status();
}

TEST_F(QuantizedNarrowTest, SharesTheBackendRefusesAreWidened) {
  ShapeLimitedBackend backend;
  WeightLoader w(*source_, &backend, LinearWeightMode::kAuto);
  w.set_tp({1, 4});  // row-parallel shares of 16 columns
  EXPECT_EQ(w.LinearKind({"int8g16.weight", kRows, TpSplit::kColumnParallel}, kCols),
            WeightDType::kInt8);
  EXPECT_EQ(w.LinearKind({"int8g16.weight", kRows, TpSplit::kRowParallel}, kCols),
            WeightDType::kBF16);
  auto m = w.Linear("int8g16.weight", kRows, kCols, TpSplit::kRowParallel);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->view.dtype, WeightDType::kBF16);
  EXPECT_EQ(m->view.cols, kCols / 4);
}

TEST_F(QuantizedNarrowTest, WidenedForTheCpuBackendAndExplicitDtypes) {
  CpuBackend cpu(1);
  TakesQuantizedBackend takes;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    {  // The CPU backend takes none of them: auto gives bf16 (as before).
      WeightLoader w(*source_, &cpu, LinearWeightMode::kAuto);
      EXPECT_EQ(w.LinearKind({c.name, kRows}, kCols), WeightDType::kBF16);
      auto m = w.Linear(c.name, kRows, kCols);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(m->view.dtype, WeightDType::kBF16);
      EXPECT_EQ(w.bytes().quant_payload, 0);
    }
    {  // Explicit fp32 / bf16 widen on any backend; fp32 is the exact dequantized weight.
      WeightLoader w(*source_, &takes, LinearWeightMode::kF32);
      auto m = w.Linear(c.name, kRows, kCols);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(m->view.dtype, WeightDType::kF32);
      EXPECT_EQ(std::vector<float>(m->view.data, m->view.data + kRows * kCols),
                *source_->store().ReadFloat(c.name));
      WeightLoader b(*source_, &takes, LinearWeightMode::kBF16);
      EXPECT_EQ(b.LinearKind({c.name, kRows}, kCols), WeightDType::kBF16);
    }
    {  // keep_quantized = false (kv_b_proj): widened even where the backend takes the format.
      WeightLoader w(*source_, &takes, LinearWeightMode::kAuto);
      auto m = w.LinearRows({{c.name, kRows, TpSplit::kReplicated, false}}, kCols);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(m->view.dtype, WeightDType::kBF16);
    }
  }
}

TEST_F(QuantizedNarrowTest, QuantizedPartsAreNotFused) {
  TakesQuantizedBackend backend;
  WeightLoader w(*source_, &backend, LinearWeightMode::kAuto);
  // NVFP4 gate and up with different global scales: two groups, each its own view.
  auto f = FusedLinear::Load(w, {{"nvfp4.weight", kRows}, {"nvfp4b.weight", kRows}}, kCols);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->num_groups(), 2u);
  EXPECT_EQ(f->out_cols(), 2 * kRows);
  EXPECT_NE(f->WeightPart(0).global_scale, f->WeightPart(1).global_scale);
  EXPECT_EQ(f->WeightPart(1).dtype, WeightDType::kNvfp4);
  auto rows = w.LinearRows({{"int4g16.weight", kRows}, {"int4ch.weight", kRows}}, kCols);
  ASSERT_FALSE(rows.ok());
  EXPECT_NE(rows.status().message().find("not fused"), std::string::npos) << rows.status();
  // A fused Linear over quantized parts computes the same as over their fp32 twins (CPU math on
  // the fake backend would need its kernels: compare through the widened fp32 loader instead).
  WeightLoader f32(*source_, &backend, LinearWeightMode::kF32);
  auto g = FusedLinear::Load(f32, {{"nvfp4.weight", kRows}, {"nvfp4b.weight", kRows}}, kCols);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(DecodeView(f->WeightPart(1), 1),
            std::vector<float>(g->WeightPart(1).data, g->WeightPart(1).data + kRows * kCols));
}

}  // namespace
}  // namespace glm::engine
