#include "engine/backend/cpu/cpu_kv_fp8.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/backend/kv_fp8_layout.h"
#include "engine/weights/float_codec.h"

namespace glm::engine::cpu_kv_fp8 {
namespace {

// Quantizes n values with one scale (the rule of kv_fp8_layout.h); returns the scale.
float QuantizeGroup(const float* x, int64_t n, uint8_t* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = kv_fp8::AmaxFold(amax, x[i]);
  const float scale = kv_fp8::Ue8m0Scale(amax);
  for (int64_t i = 0; i < n; ++i) q[i] = FloatToFp8E4M3(x[i] / scale);
  return scale;
}

}  // namespace

void QuantizeLatentRow(const float* x, int kv_lora_rank, int rope_dim, uint8_t* out) {
  const int64_t groups = kv_fp8::LatentNumScales(kv_lora_rank);
  uint8_t* scales = out + kv_fp8::LatentScaleOffset(kv_lora_rank);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * kv_fp8::kScaleGroup;
    const int64_t n = std::min<int64_t>(kv_fp8::kScaleGroup, kv_lora_rank - begin);
    const float scale = QuantizeGroup(x + begin, n, out + begin);
    std::memcpy(scales + 4 * g, &scale, 4);
  }
  uint8_t* rope = out + kv_fp8::LatentRopeOffset(kv_lora_rank);
  for (int d = 0; d < rope_dim; ++d) {
    const uint16_t b = FloatToBf16(x[kv_lora_rank + d]);
    std::memcpy(rope + 2 * d, &b, 2);
  }
}

void DequantizeLatentRow(const uint8_t* row, int kv_lora_rank, int rope_dim, float* out) {
  const uint8_t* scales = row + kv_fp8::LatentScaleOffset(kv_lora_rank);
  for (int d = 0; d < kv_lora_rank; ++d) {
    float scale;
    std::memcpy(&scale, scales + 4 * (d / kv_fp8::kScaleGroup), 4);
    out[d] = Fp8E4M3ToFloat(row[d]) * scale;
  }
  const uint8_t* rope = row + kv_fp8::LatentRopeOffset(kv_lora_rank);
  for (int d = 0; d < rope_dim; ++d) {
    uint16_t b;
    std::memcpy(&b, rope + 2 * d, 2);
    out[kv_lora_rank + d] = Bf16ToFloat(b);
  }
}

void QuantizeIndexKey(const float* x, int dim, uint8_t* values, float* scale) {
  *scale = QuantizeGroup(x, dim, values);
}

void DequantizeIndexKey(const Fp8IndexCache& c, int64_t slot, float* out) {
  const uint8_t* v = c.data + kv_fp8::IndexValueOffset(slot, c.block_size, c.dim);
  float scale;
  std::memcpy(&scale, c.data + kv_fp8::IndexScaleOffset(slot, c.block_size, c.dim), 4);
  for (int d = 0; d < c.dim; ++d) out[d] = Fp8E4M3ToFloat(v[d]) * scale;
}

void WriteLatent(const MatView& src, const int32_t* slots, const Fp8LatentCache& dst) {
  const int64_t row_bytes = kv_fp8::LatentRowBytes(dst.kv_lora_rank, dst.rope_dim);
  for (int64_t r = 0; r < src.rows; ++r) {
    QuantizeLatentRow(src.Row(r), dst.kv_lora_rank, dst.rope_dim,
                      dst.data + int64_t{slots[r]} * row_bytes);
  }
}

void WriteIndexKeys(const MatView& src, const int32_t* slots, const Fp8IndexCache& dst) {
  for (int64_t r = 0; r < src.rows; ++r) {
    const int64_t s = slots[r];
    float scale;
    QuantizeIndexKey(src.Row(r), dst.dim,
                     dst.data + kv_fp8::IndexValueOffset(s, dst.block_size, dst.dim), &scale);
    std::memcpy(dst.data + kv_fp8::IndexScaleOffset(s, dst.block_size, dst.dim), &scale, 4);
  }
}

void GatherLatent(const Fp8LatentCache& src, const int32_t* slots, const MatView& out) {
  const int64_t row_bytes = kv_fp8::LatentRowBytes(src.kv_lora_rank, src.rope_dim);
  for (int64_t r = 0; r < out.rows; ++r) {
    DequantizeLatentRow(src.data + int64_t{slots[r]} * row_bytes, src.kv_lora_rank, src.rope_dim,
                        out.Row(r));
  }
}

namespace {

// Dequantizes each cache slot a step reads exactly once (prefill rows of one sequence share
// their keys: dequantizing per row would cost rows x keys memory) and builds the slot table for
// the dequantized rows: `slots` is parallel to the original table.slots (same row_offset), its
// entries index `rows` (width floats each); entries no row reads point at row 0.
class SlotDequantizer {
 public:
  SlotDequantizer(const KeyTable& table, int64_t num_rows, int64_t width)
      : table_(table), width_(width) {
    int64_t len = 0;
    for (int64_t t = 0; t < num_rows; ++t) {
      len = std::max<int64_t>(len, int64_t{table.row_offset[t]} +
                                       std::max<int32_t>(table.row_num_keys[t], 0));
    }
    slots_.assign(static_cast<size_t>(len), 0);
  }

  // Position p of row t is read; `dequantize(slot, out)` fills width floats the first time.
  template <typename F>
  void Use(int64_t t, int32_t p, F&& dequantize) {
    const int64_t i = int64_t{table_.row_offset[t]} + p;
    const int32_t slot = table_.slots[i];
    auto [it, inserted] = index_.try_emplace(slot, static_cast<int32_t>(index_.size()));
    if (inserted) {
      rows_.resize(rows_.size() + static_cast<size_t>(width_));
      dequantize(slot, rows_.data() + rows_.size() - width_);
    }
    slots_[i] = it->second;
  }

  int64_t num_rows() const { return std::max<int64_t>(static_cast<int64_t>(index_.size()), 1); }
  float* rows() {
    if (rows_.empty()) rows_.assign(static_cast<size_t>(width_), 0.0f);  // nothing read
    return rows_.data();
  }
  const int32_t* slots() const { return slots_.empty() ? &zero_ : slots_.data(); }

 private:
  const KeyTable& table_;
  int64_t width_;
  std::vector<int32_t> slots_;
  std::vector<float> rows_;
  absl::flat_hash_map<int32_t, int32_t> index_;  // cache slot -> dequantized row
  int32_t zero_ = 0;
};

}  // namespace

void Attention(Backend& backend, const AttentionArgs& a) {
  const Fp8LatentCache& c = a.latent_fp8;
  const int64_t rows = a.q_a.rows, width = c.kv_lora_rank + c.rope_dim;
  const int64_t row_bytes = kv_fp8::LatentRowBytes(c.kv_lora_rank, c.rope_dim);
  SlotDequantizer deq(a.table, rows, width);
  auto dequantize = [&](int32_t slot, float* out) {
    DequantizeLatentRow(c.data + int64_t{slot} * row_bytes, c.kv_lora_rank, c.rope_dim, out);
  };
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t num_keys = a.table.row_num_keys[t];
    if (a.indices != nullptr) {
      for (int32_t i = 0; i < a.index_width; ++i) {
        const int32_t p = a.indices[t * a.index_width + i];
        if (p >= 0 && p < num_keys) deq.Use(t, p, dequantize);
      }
    } else {
      for (int32_t p = 0; p < num_keys; ++p) deq.Use(t, p, dequantize);
    }
  }
  AttentionArgs f = a;
  f.latent_fp8 = {};
  const int64_t heads = a.q_a.heads;
  float* base = deq.rows();
  f.k_a = HeadsView{base, deq.num_rows(), heads, c.kv_lora_rank, width, 0};
  f.v = f.k_a;
  f.k_b = HeadsView{base + c.kv_lora_rank, deq.num_rows(), heads, c.rope_dim, width, 0};
  f.table.slots = deq.slots();
  backend.Attention(f);
}

void IndexerTopK(Backend& backend, const IndexerTopKArgs& a) {
  const Fp8IndexCache& c = a.keys_fp8;
  const int64_t rows = a.q.rows, dim = c.dim;
  SlotDequantizer deq(a.table, rows, dim);
  auto dequantize = [&](int32_t slot, float* out) { DequantizeIndexKey(c, slot, out); };
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t num_keys = a.table.row_num_keys[t];
    if (num_keys <= a.top_k) continue;  // every position selected, no key read
    for (int32_t p = 0; p < num_keys; ++p) deq.Use(t, p, dequantize);
  }
  IndexerTopKArgs f = a;
  f.keys_fp8 = {};
  f.keys = MatView{deq.rows(), deq.num_rows(), dim, dim};
  f.table.slots = deq.slots();
  backend.IndexerTopK(f);
}

}  // namespace glm::engine::cpu_kv_fp8
