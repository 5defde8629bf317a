// The fp8 KV cache ops of the CUDA backend against the CPU backend (the reference,
// engine/backend/cpu/cpu_kv_fp8.h): quantizing writes bit-exact (latent and paged indexer keys,
// incl. zeros, NaN, +-inf, tiny and huge magnitudes), the dequantizing gather exact, Attention
// over the fp8 latent close (fp32 summation order only), IndexerTopK over fp8 keys identical on
// exactly representable data and near-identical on random data. Shapes: GLM-5 (512 + 64, 64
// heads, 128-dim keys) at 1 / 3 / 8 rows and up to 5000 keys, plus the tiny fixtures' widths.
// Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_kv_fp8.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/cuda/cuda_ops_hooks.h"
#include "engine/backend/cuda/cuda_test_util.h"
#include "engine/backend/kv_fp8_layout.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

class CudaKvFp8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status avail = CudaDeviceAvailable();
    if (!avail.ok()) GTEST_SKIP() << "no usable GPU: " << avail.message();
    auto b = CreateCudaBackend(0);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    cpu_ = CreateCpuBackend(4);
  }
  void TearDown() override {
    if (gpu_ != nullptr) {
      gpu_->Synchronize();
      EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
    }
  }
  // A host vector in device memory (kept alive by the test).
  template <typename T>
  T* Dev(const std::vector<T>& v) {
    bufs_.push_back(gpu_->Allocate(std::max<size_t>(v.size(), 1) * sizeof(T)));
    if (!v.empty()) gpu_->CopyToDevice(bufs_.back()->data(), v.data(), v.size() * sizeof(T));
    return static_cast<T*>(bufs_.back()->data());
  }
  // Attention args over the fp8 latent cache `latent` (k_a / k_b / v carry only the widths):
  // q_a [rows, heads, kvr], q_b [rows, heads, rope], `indices` (nullptr: every key) of width
  // `index_width`, output [rows, heads, kvr] at `out`, scale 1/sqrt(192).
  static AttentionArgs LatentArgs(std::vector<float>& qa, std::vector<float>& qb,
                                  int rows, int heads, int kvr, int rope, int64_t slots,
                                  KeyTable table, const int32_t* indices, int index_width,
                                  const Fp8LatentCache& latent, float* out) {
    AttentionArgs a;
    a.q_a = HeadsView{qa.data(), rows, heads, kvr, int64_t{heads} * kvr, kvr};
    a.q_b = HeadsView{qb.data(), rows, heads, rope, int64_t{heads} * rope, rope};
    a.k_a = HeadsView{nullptr, slots, heads, kvr, 0, 0};
    a.k_b = HeadsView{nullptr, slots, heads, rope, 0, 0};
    a.v = a.k_a;
    a.table = table;
    a.indices = indices;
    a.index_width = index_width;
    a.scale = 1.0f / std::sqrt(192.0f);
    a.latent_fp8 = latent;
    a.out = HeadsView{out, rows, heads, kvr, int64_t{heads} * kvr, kvr};
    return a;
  }
  // `a` with q, the key table and (where `a` has them) the indices copied to device memory from
  // the host vectors it was built on, over the device latent cache `gc`.
  AttentionArgs OnDevice(AttentionArgs a, const std::vector<float>& qa,
                         const std::vector<float>& qb, const std::vector<int32_t>& table,
                         const std::vector<int32_t>& offset, const std::vector<int32_t>& nkeys,
                         const std::vector<int32_t>& idx, const Fp8LatentCache& gc) {
    a.q_a.data = Dev(qa);
    a.q_b.data = Dev(qb);
    a.table = {Dev(table), Dev(offset), Dev(nkeys), a.table.max_num_keys};
    a.indices = a.indices != nullptr ? Dev(idx) : nullptr;
    a.latent_fp8 = gc;
    return a;
  }
  template <typename T>
  std::vector<T> Host(const T* d, size_t n) {
    std::vector<T> v(n);
    gpu_->CopyToHost(v.data(), d, n * sizeof(T));
    return v;
  }
  // Rows with varied magnitudes per 128-dim group, zeros, and (when special) NaN / +-inf.
  // Group magnitudes 2^[-max_exp, max_exp].
  std::vector<float> Rows(int64_t n, int64_t width, int64_t rope_from, bool special,
                          int max_exp = 30) {
    std::vector<float> x(n * width);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> expo(-max_exp, max_exp);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t g0 = 0; g0 < width; g0 += 128) {
        const float mag = std::ldexp(1.0f, expo(rng_));
        const bool zero = special && (r + g0 / 128) % 7 == 3;
        for (int64_t d = g0; d < std::min(width, g0 + 128); ++d) {
          x[r * width + d] = zero ? 0.0f : nd(rng_) * (d < rope_from ? mag : 1.0f);
        }
      }
      if (special && r % 5 == 1 && rope_from > 8) {
        x[r * width + 1] = std::numeric_limits<float>::quiet_NaN();
        x[r * width + 2] = std::numeric_limits<float>::infinity();
        x[r * width + 7] = -std::numeric_limits<float>::infinity();
      }
    }
    return x;
  }

  std::unique_ptr<Backend> gpu_, cpu_;
  std::vector<std::unique_ptr<Buffer>> bufs_;
  std::mt19937 rng_{4321};
};

TEST_F(CudaKvFp8Test, WriteAndGatherLatentBitExact) {
  struct Shape { int kvr, rope, slots, rows; };
  for (const Shape& s : {Shape{512, 64, 300, 257}, Shape{16, 8, 40, 33}, Shape{132, 4, 20, 7},
                         Shape{512, 64, 64, 1}}) {
    SCOPED_TRACE(testing::Message() << "kvr " << s.kvr << " rope " << s.rope << " rows " << s.rows);
    const int width = s.kvr + s.rope;
    const int64_t row_bytes = kv_fp8::LatentRowBytes(s.kvr, s.rope);
    std::vector<float> x = Rows(s.rows, width, s.kvr, true);
    std::vector<int32_t> slots(s.slots);
    for (int i = 0; i < s.slots; ++i) slots[i] = i;
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(s.rows);
    std::vector<uint8_t> cpu_cache(s.slots * row_bytes, 0);
    Fp8LatentCache cc{cpu_cache.data(), s.slots, s.kvr, s.rope};
    cpu_->WriteLatentFp8(MatView{x.data(), s.rows, width, width}, slots.data(), cc);
    uint8_t* dcache = Dev(std::vector<uint8_t>(cpu_cache.size(), 0));
    Fp8LatentCache gc{dcache, s.slots, s.kvr, s.rope};
    gpu_->WriteLatentFp8(MatView{Dev(x), s.rows, width, width}, Dev(slots), gc);
    EXPECT_EQ(Host(dcache, cpu_cache.size()), cpu_cache);

    std::vector<float> cpu_out(s.rows * (width + 4), -1.0f);
    cpu_->GatherLatentFp8(cc, slots.data(), MatView{cpu_out.data(), s.rows, width, width + 4});
    float* dout = Dev(std::vector<float>(cpu_out.size(), -1.0f));
    gpu_->GatherLatentFp8(gc, Dev(slots), MatView{dout, s.rows, width, width + 4});
    const std::vector<float> gpu_out = Host(dout, cpu_out.size());
    for (size_t i = 0; i < cpu_out.size(); ++i) {  // exact; NaN where the CPU has NaN
      if (std::isnan(cpu_out[i])) {
        ASSERT_TRUE(std::isnan(gpu_out[i])) << i;
      } else {
        ASSERT_EQ(gpu_out[i], cpu_out[i]) << i;
      }
    }
  }
}

TEST_F(CudaKvFp8Test, WriteIndexKeysBitExact) {
  struct Shape { int dim, bs, blocks, rows; };
  for (const Shape& s : {Shape{128, 64, 5, 200}, Shape{16, 16, 3, 41}, Shape{128, 16, 2, 1},
                         Shape{36, 7, 4, 28}}) {
    SCOPED_TRACE(testing::Message() << "dim " << s.dim << " bs " << s.bs << " rows " << s.rows);
    const int64_t n_slots = int64_t{s.bs} * s.blocks;
    std::vector<float> x = Rows(s.rows, s.dim, s.dim, true);
    std::vector<int32_t> slots(n_slots);
    for (int i = 0; i < n_slots; ++i) slots[i] = i;
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(s.rows);
    std::vector<uint8_t> cpu_cache(n_slots * (s.dim + 4), 0);
    cpu_->WriteIndexKeysFp8(MatView{x.data(), s.rows, s.dim, s.dim}, slots.data(),
                            Fp8IndexCache{cpu_cache.data(), n_slots, s.dim, s.bs});
    uint8_t* dcache = Dev(std::vector<uint8_t>(cpu_cache.size(), 0));
    gpu_->WriteIndexKeysFp8(MatView{Dev(x), s.rows, s.dim, s.dim}, Dev(slots),
                            Fp8IndexCache{dcache, n_slots, s.dim, s.bs});
    EXPECT_EQ(Host(dcache, cpu_cache.size()), cpu_cache);
  }
}

TEST_F(CudaKvFp8Test, AttentionMatchesCpu) {
  struct Shape { int rows, heads, kvr, rope, slots, max_keys, topk; bool indices; };
  for (const Shape& s : {Shape{1, 64, 512, 64, 5000, 5000, 2048, true},
                         Shape{3, 64, 512, 64, 3000, 3000, 2048, true},
                         Shape{8, 64, 512, 64, 700, 600, 256, true},
                         Shape{1, 64, 512, 64, 300, 257, 0, false},
                         Shape{2, 20, 512, 64, 100, 90, 16, true},
                         Shape{3, 4, 16, 8, 60, 50, 7, true},
                         Shape{2, 4, 16, 8, 60, 50, 0, false}}) {
    SCOPED_TRACE(testing::Message() << "rows " << s.rows << " heads " << s.heads << " kvr "
                                    << s.kvr << " keys " << s.max_keys << " topk " << s.topk);
    const int width = s.kvr + s.rope;
    std::vector<float> lat = Rows(s.slots, width, s.kvr, false, 1);  // moderate scores
    std::vector<int32_t> all(s.slots);
    for (int i = 0; i < s.slots; ++i) all[i] = i;
    std::vector<uint8_t> cache(s.slots * kv_fp8::LatentRowBytes(s.kvr, s.rope), 0);
    Fp8LatentCache cc{cache.data(), s.slots, s.kvr, s.rope};
    cpu_->WriteLatentFp8(MatView{lat.data(), s.slots, width, width}, all.data(), cc);
    Fp8LatentCache gc{Dev(cache), s.slots, s.kvr, s.rope};
    // Row t sees num_keys(t) positions mapped through a shuffled table.
    std::vector<int32_t> table, offset, nkeys(s.rows);
    for (int t = 0; t < s.rows; ++t) nkeys[t] = std::max(1, s.max_keys - 37 * t);
    cuda::ShuffledKeyTable(all, nkeys, rng_, &table, &offset);
    std::vector<int32_t> idx(std::max(1, s.rows * s.topk), -1);
    for (int t = 0; t < s.rows; ++t) {
      std::vector<int32_t> pos(nkeys[t]);
      for (int i = 0; i < nkeys[t]; ++i) pos[i] = i;
      std::shuffle(pos.begin(), pos.end(), rng_);
      for (int i = 0; i < std::min(s.topk, nkeys[t]); ++i) idx[t * s.topk + i] = pos[i];
      if (s.topk > 3) idx[t * s.topk + 1] = -1;  // padding in the middle
    }
    std::normal_distribution<float> nd(0.0f, 0.05f);
    std::vector<float> qa(s.rows * s.heads * s.kvr), qb(s.rows * s.heads * s.rope);
    for (float& v : qa) v = nd(rng_);
    for (float& v : qb) v = nd(rng_) * 10.0f;
    std::vector<float> cpu_out(s.rows * s.heads * s.kvr);
    AttentionArgs a = LatentArgs(qa, qb, s.rows, s.heads, s.kvr, s.rope, s.slots,
                                 {table.data(), offset.data(), nkeys.data(), s.max_keys},
                                 s.indices ? idx.data() : nullptr, s.topk, cc, cpu_out.data());
    cpu_->Attention(a);
    AttentionArgs g = OnDevice(a, qa, qb, table, offset, nkeys, idx, gc);
    g.out.data = Dev(std::vector<float>(cpu_out.size(), std::nanf("")));
    gpu_->Attention(g);
    const std::vector<float> gpu_out = Host(g.out.data, cpu_out.size());
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < cpu_out.size(); ++i) {
      ASSERT_TRUE(std::isfinite(gpu_out[i])) << i;
      max_err = std::max(max_err, std::fabs(double{gpu_out[i]} - cpu_out[i]));
      max_ref = std::max(max_ref, std::fabs(double{cpu_out[i]}));
    }
    EXPECT_LE(max_err, 2e-5 * std::max(1.0, max_ref)) << "max_ref " << max_ref;
  }
}

// The tensor-core attention path (split-bf16 mma.sync over the fp8 latent, GLM-5 widths 512 +
// 64) against the CPU backend and against the staged CUDA-core path, over rows 1 / 2 / 8 / 64,
// selected widths 1 / 17 / 2048 (and no index: every key), heads 16 / 32 / 64 / 128, rows with
// fewer keys than the index width, -1 indices, a row with num_keys 0 and a row with only -1;
// every head-group size (16 / 32 / 64 heads per CTA) that divides the head count.
// Bound: max |gpu - cpu| <= 2e-5 * max(1, max |cpu|) (the staged path's bound; the only roundings
// are of q and P to hi + lo bf16 pairs, ~2^-17 relative). Each call must take the path asked
// for; graph replay and a second eager call must equal the first eager call bit for bit.
TEST_F(CudaKvFp8Test, AttentionTensorCoreMatchesCpuAndStaged) {
  constexpr int kKvr = 512, kRope = 64, kWidth = kKvr + kRope;
  struct Shape { int rows, heads, slots, max_keys, topk; bool indices, empty_rows; };
  const Shape shapes[] = {
      {1, 64, 5000, 5000, 2048, true, false},   {2, 64, 3000, 3000, 2048, true, true},
      {8, 64, 2400, 2100, 2048, true, false},   {64, 64, 4096, 4096, 2048, true, false},
      {8, 128, 2200, 2100, 2048, true, true},   {1, 16, 300, 257, 17, true, false},
      {2, 32, 300, 200, 17, true, true},        {8, 16, 700, 600, 1, true, false},
      {3, 128, 100, 90, 1, true, false},        {64, 32, 300, 250, 17, true, false},
      {1, 64, 300, 257, 0, false, false},       {4, 16, 100, 80, 0, false, true},
      {2, 64, 3000, 2500, 0, false, false}};
  using kernels::MlaAttentionPath;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(testing::Message() << "rows " << s.rows << " heads " << s.heads << " keys "
                                    << s.max_keys << " topk " << s.topk << " indices "
                                    << s.indices << " empty rows " << s.empty_rows);
    std::vector<float> lat = Rows(s.slots, kWidth, kKvr, false, 1);
    std::vector<int32_t> all(s.slots);
    for (int i = 0; i < s.slots; ++i) all[i] = i;
    std::vector<uint8_t> cache(s.slots * kv_fp8::LatentRowBytes(kKvr, kRope), 0);
    Fp8LatentCache cc{cache.data(), s.slots, kKvr, kRope};
    cpu_->WriteLatentFp8(MatView{lat.data(), s.slots, kWidth, kWidth}, all.data(), cc);
    Fp8LatentCache gc{Dev(cache), s.slots, kKvr, kRope};
    std::vector<int32_t> table, offset, nkeys(s.rows);
    for (int t = 0; t < s.rows; ++t) nkeys[t] = std::max(1, s.max_keys - 37 * t);
    if (s.empty_rows && s.rows > 1) nkeys[1] = 0;  // a row without keys
    cuda::ShuffledKeyTable(all, nkeys, rng_, &table, &offset);
    const int width = std::max(1, s.topk);
    std::vector<int32_t> idx(s.rows * width, -1);
    for (int t = 0; t < s.rows; ++t) {
      std::vector<int32_t> pos(std::max(nkeys[t], 1));
      for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
      std::shuffle(pos.begin(), pos.end(), rng_);
      // Row 1 of empty_rows: positions >= num_keys (0), i.e. all masked; others valid.
      for (int i = 0; i < std::min<int>(s.topk, pos.size()); ++i) idx[t * width + i] = pos[i];
      if (s.topk > 3) idx[t * width + 1] = -1;   // padding in the middle
      if (s.empty_rows && t == s.rows - 1 && t != 1) {
        std::fill(idx.begin() + t * width, idx.begin() + (t + 1) * width, -1);  // only -1
      }
    }
    std::normal_distribution<float> nd(0.0f, 0.05f);
    std::vector<float> qa(s.rows * s.heads * kKvr), qb(s.rows * s.heads * kRope);
    for (float& v : qa) v = nd(rng_);
    for (float& v : qb) v = nd(rng_) * 10.0f;
    const size_t n_out = static_cast<size_t>(s.rows) * s.heads * kKvr;
    std::vector<float> cpu_out(n_out);
    AttentionArgs a = LatentArgs(qa, qb, s.rows, s.heads, kKvr, kRope, s.slots,
                                 {table.data(), offset.data(), nkeys.data(), s.max_keys},
                                 s.indices ? idx.data() : nullptr, s.indices ? s.topk : 0, cc,
                                 cpu_out.data());
    cpu_->Attention(a);
    AttentionArgs g = OnDevice(a, qa, qb, table, offset, nkeys, idx, gc);
    const std::vector<float> nan_fill(n_out, std::nanf(""));
    g.out.data = Dev(nan_fill);

    double max_ref = 0;
    for (float v : cpu_out) max_ref = std::max(max_ref, std::fabs(double{v}));
    const double bound = 2e-5 * std::max(1.0, max_ref);
    // Runs the attention under a policy forcing `path` (and tc heads per CTA); the call must take
    // `want_path`.
    auto run = [&](MlaAttentionPath path, int tc_heads, MlaAttentionPath want_path) {
      kernels::KernelPolicy policy;
      policy.attention.path = path;
      policy.attention.tc_heads_per_cta = tc_heads;
      gpu_->SetKernelPolicy(policy);
      gpu_->CopyToDevice(g.out.data, nan_fill.data(), n_out * 4);
      gpu_->Attention(g);
      std::vector<float> out = Host(g.out.data, n_out);
      EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
      EXPECT_EQ(cuda::LastAttentionPathForTest(), want_path)
          << "path " << static_cast<int>(path) << " tc heads " << tc_heads;
      gpu_->SetKernelPolicy(kernels::KernelPolicy());
      return out;
    };
    const std::vector<float> tc =
        run(MlaAttentionPath::kTensorCore, 0, MlaAttentionPath::kTensorCore);
    const std::vector<float> staged = run(MlaAttentionPath::kStaged, 0, MlaAttentionPath::kStaged);
    double err_cpu = 0, err_staged = 0;
    for (size_t i = 0; i < n_out; ++i) {
      ASSERT_TRUE(std::isfinite(tc[i])) << i;
      ASSERT_TRUE(std::isfinite(staged[i])) << i;
      err_cpu = std::max(err_cpu, std::fabs(double{tc[i]} - cpu_out[i]));
      err_staged = std::max(err_staged, std::fabs(double{tc[i]} - staged[i]));
    }
    EXPECT_LE(err_cpu, bound) << "tc vs cpu, max_ref " << max_ref;
    EXPECT_LE(err_staged, bound) << "tc vs staged, max_ref " << max_ref;
    std::printf("tc rows %d heads %d keys %d topk %d: max|tc-cpu| %.3g max|tc-staged| %.3g "
                "max|cpu| %.3g\n", s.rows, s.heads, s.max_keys, s.topk, err_cpu, err_staged,
                max_ref);
    // Every head-group size (16 / 32 / 64 heads per CTA) that divides the head count.
    for (const int mt : {1, 2, 4}) {
      if (s.heads % (16 * mt) != 0) continue;
      const std::vector<float> o =
          run(MlaAttentionPath::kByShape, 16 * mt, MlaAttentionPath::kTensorCore);
      double err = 0;
      for (size_t i = 0; i < n_out; ++i) {
        ASSERT_TRUE(std::isfinite(o[i])) << i;
        err = std::max(err, std::fabs(double{o[i]} - cpu_out[i]));
      }
      EXPECT_LE(err, bound) << "tc with " << 16 * mt << " heads per CTA vs cpu";
    }
    if (s.empty_rows) {  // row 1 has no keys: zeros
      for (int i = 0; i < s.heads * kKvr; ++i) ASSERT_EQ(tc[s.heads * kKvr + i], 0.0f) << i;
    }

    // Default choice by shape, a second eager call and a graph replay: bit for bit.
    const std::vector<float> tc_default =
        run(MlaAttentionPath::kByShape, 0, MlaAttentionPath::kTensorCore);
    EXPECT_EQ(std::memcmp(tc_default.data(), tc.data(), n_out * 4), 0);
    gpu_->CopyToDevice(g.out.data, nan_fill.data(), n_out * 4);
    gpu_->SetPointerChecks(false);  // as the decode graphs run
    gpu_->BeginCapture();
    gpu_->Attention(g);
    std::unique_ptr<BackendGraph> graph = gpu_->EndCapture();
    gpu_->SetPointerChecks(true);
    ASSERT_NE(graph, nullptr) << gpu_->status();
    gpu_->ReplayGraph(*graph);
    const std::vector<float> replay = Host(g.out.data, n_out);
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    EXPECT_EQ(std::memcmp(replay.data(), tc.data(), n_out * 4), 0) << "graph replay != eager";
  }
}

// Indexer over fp8 keys. Exact case: keys are small integers from {0, +-1, +-2, +-3, +-4, +-6,
// +-8} (exact in e4m3 at scale 2^-5 ... so dequantization is exact), q and weights small
// integers, scales powers of two: every score is exact in any summation order, so the selection
// (ties to the lower position) must be identical. Random case: >= 99% overlap.
TEST_F(CudaKvFp8Test, IndexerTopKMatchesCpu) {
  struct Shape { int rows, heads, dim, bs, slots, max_keys, topk; bool exact; };
  for (const Shape& s : {Shape{1, 32, 128, 64, 4096, 4096, 2048, true},
                         Shape{3, 32, 128, 64, 6000, 5000, 2048, true},
                         Shape{8, 32, 128, 16, 700, 600, 256, true},
                         Shape{2, 4, 16, 16, 64, 50, 4, true},
                         Shape{1, 32, 128, 64, 4096, 4096, 2048, false},
                         Shape{2, 32, 128, 64, 3000, 2500, 256, false}}) {
    SCOPED_TRACE(testing::Message() << "rows " << s.rows << " keys " << s.max_keys << " topk "
                                    << s.topk << " exact " << s.exact);
    const int64_t n_slots = (s.slots + s.bs - 1) / s.bs * s.bs;
    std::vector<float> keys(n_slots * s.dim);
    const float vals[] = {0, 1, -1, 2, -2, 3, -3, 4, -4, 6, -6, 8, -8};
    std::uniform_int_distribution<int> pick(0, 12), small(-3, 3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t r = 0; r < n_slots; ++r) {
      for (int d = 0; d < s.dim; ++d) keys[r * s.dim + d] = s.exact ? vals[pick(rng_)] : nd(rng_);
      if (s.exact) keys[r * s.dim] = 8.0f;  // amax 8 in every row: scale 2^-5, all exact
    }
    std::vector<int32_t> all(n_slots);
    for (int64_t i = 0; i < n_slots; ++i) all[i] = static_cast<int32_t>(i);
    std::vector<uint8_t> cache(n_slots * (s.dim + 4), 0);
    Fp8IndexCache cc{cache.data(), n_slots, s.dim, s.bs};
    cpu_->WriteIndexKeysFp8(MatView{keys.data(), n_slots, s.dim, s.dim}, all.data(), cc);
    Fp8IndexCache gc{Dev(cache), n_slots, s.dim, s.bs};
    std::vector<int32_t> table, offset, nkeys(s.rows);
    for (int t = 0; t < s.rows; ++t) nkeys[t] = std::max(1, s.max_keys - 53 * t);
    cuda::ShuffledKeyTable(all, nkeys, rng_, &table, &offset);
    std::vector<float> q(s.rows * s.heads * s.dim), w(s.rows * s.heads);
    for (float& v : q) v = s.exact ? static_cast<float>(small(rng_)) : nd(rng_);
    for (float& v : w) v = s.exact ? static_cast<float>(small(rng_)) : nd(rng_);
    IndexerTopKArgs a;
    a.q = HeadsView{q.data(), s.rows, s.heads, s.dim, int64_t{s.heads} * s.dim, s.dim};
    a.weights = MatView{w.data(), s.rows, s.heads, s.heads};
    a.keys = MatView{nullptr, n_slots, s.dim, s.dim};
    a.keys_fp8 = cc;
    a.table = {table.data(), offset.data(), nkeys.data(), s.max_keys};
    a.weight_scale = s.exact ? 0.25f : 1.0f / std::sqrt(static_cast<float>(s.heads));
    a.score_scale = s.exact ? 0.125f : 1.0f / std::sqrt(static_cast<float>(s.dim));
    a.top_k = s.topk;
    std::vector<int32_t> cpu_out(s.rows * s.topk);
    a.out = cpu_out.data();
    cpu_->IndexerTopK(a);
    IndexerTopKArgs g = a;
    g.q.data = Dev(q);
    g.weights.data = Dev(w);
    g.keys_fp8 = gc;
    g.table = {Dev(table), Dev(offset), Dev(nkeys), s.max_keys};
    g.out = Dev(std::vector<int32_t>(cpu_out.size(), -7));
    gpu_->IndexerTopK(g);
    const std::vector<int32_t> gpu_out = Host(g.out, cpu_out.size());
    if (s.exact) {
      EXPECT_EQ(gpu_out, cpu_out);
    } else {
      for (int t = 0; t < s.rows; ++t) {
        std::set<int32_t> c(cpu_out.begin() + t * s.topk, cpu_out.begin() + (t + 1) * s.topk);
        int common = 0;
        for (int i = 0; i < s.topk; ++i) common += c.count(gpu_out[t * s.topk + i]) ? 1 : 0;
        EXPECT_GE(common, s.topk * 99 / 100) << "row " << t;
      }
    }
  }
}

}  // namespace
}  // namespace glm::engine
