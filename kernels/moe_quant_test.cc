// MoeQuantExperts (moe_quant.h) against a host reference of its documented numerics, and its
// planning and table checks (those run without a GPU).
// Reference per (token, slot) pair with a valid id: g, u = GemvQuantHost (bf16(x) times the
// exact dequantized gate / up weight, summed in double, nvfp4 global scale on the sum), act =
// g / (1 + e^-g) * u in fp32, y = GemvQuantHost(act, down) (act rounded to bf16 there), then
// out[t] += w[t, j] * y in slot order. Tolerance: the GPU sums in fp32 (|err| <~ k / 16 * 2^-24
// of sum |x w| per pass), and a rounding of act to bf16 may land on the other side of a tie
// (2^-8 of one act element): 1e-3 of max |out - out0| covers both with room, while a wrong
// scale, row, expert or gather is off by O(1).
// Sweep: int4 group 128 (per-window scale path) and 32 (hi / lo path), int8 group 128 and
// channel, nvfp4 with global scales that differ per expert and per projection; tokens 1, 2, 5,
// 16, 64 with top_k 4, random ids with repeats and ids out of range (ignored), a hot expert
// taking most pairs (units split), widths that leave partial row blocks and partial windows, a
// shared-memory cap that makes the K loop take several chunks; output guard bytes, NaN / Inf,
// bit-identical results on repeat, routing inside the op equal to MoeRoute then ids.
#include "kernels/moe_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"
#include "kernels/moe_route.h"

namespace glm::kernels {
namespace {

using testing::GuardedBuffer;
using Rng = testing::XorShiftRng;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- Planning and table checks (no GPU) --------------------------------------------------------

TEST(MoeQuantPlan, FitsEveryDeviceAtGlm5Widths) {
  for (const DeviceLimits& limits : {Gb10Limits(), H200Limits()}) {
    for (QuantFormat f : {QuantFormat::kInt4, QuantFormat::kInt8, QuantFormat::kNvfp4}) {
      const int64_t group = f == QuantFormat::kNvfp4 ? 16 : 128;
      for (int64_t pairs : {int64_t{1}, int64_t{8}, int64_t{64}, int64_t{512}, kMoeQuantMaxPairs}) {
        SCOPED_TRACE(absl::StrCat(limits.DebugString(), " ", QuantFormatName(f), " ", pairs));
        auto t = PlanMoeQuant(pairs, 256, 6144, 2048, f, group, limits);
        ASSERT_TRUE(t.ok()) << t.status();
        EXPECT_LE(t->smem_bytes, static_cast<size_t>(limits.smem_optin_per_block));
        EXPECT_GE(t->smem_bytes, static_cast<size_t>(kMoeQuantUnitRows * 64 * 4));
        EXPECT_EQ(t->max_slots, std::min<int64_t>(256, pairs));
        EXPECT_EQ(t->max_units, t->max_slots + pairs / kMoeQuantUnitRows);
        EXPECT_EQ(t->gate_up_blocks, 2048 / 64);
        EXPECT_EQ(t->down_blocks, 6144 / 128);
        EXPECT_GE(t->gate_up_chunk_windows, 1);
        EXPECT_GE(t->down_chunk_windows, 1);
        EXPECT_EQ(t->gate_up_window_scale, f != QuantFormat::kNvfp4);
        EXPECT_EQ(t->act_bytes, static_cast<size_t>(pairs * 2048 * 4));
        EXPECT_EQ(t->y_bytes, static_cast<size_t>(pairs * 6144 * 4));
        // Two CTAs per SM: dynamic + static + the per-block reservation within half an SM
        // (where half an SM holds more than 48 KiB), and within 48 KiB in all (the launch's
        // limit without the opt-in attribute) otherwise.
        const int64_t used = static_cast<int64_t>(t->smem_bytes) + kMoeQuantStaticSmemBytes;
        if (limits.smem_per_sm / 2 - limits.reserved_smem_per_block > 48 * 1024) {
          EXPECT_LE(2 * (used + limits.reserved_smem_per_block), limits.smem_per_sm);
        } else {
          EXPECT_LE(used, 48 * 1024);
        }
      }
    }
  }
  // GB10's smaller shared memory takes the K range in more chunks than an H200.
  auto gb10 = PlanMoeQuant(8, 256, 6144, 2048, QuantFormat::kInt4, 128, Gb10Limits());
  auto h200 = PlanMoeQuant(8, 256, 6144, 2048, QuantFormat::kInt4, 128, H200Limits());
  ASSERT_TRUE(gb10.ok() && h200.ok());
  EXPECT_LT(gb10->gate_up_chunk_windows, h200->gate_up_chunk_windows);
  std::printf("GB10: %s\nH200: %s\n", gb10->DebugString().c_str(), h200->DebugString().c_str());
}

TEST(MoeQuantPlan, RejectsWhatTheKernelsCannotRun) {
  const DeviceLimits l = H200Limits();
  EXPECT_FALSE(PlanMoeQuant(0, 8, 256, 128, QuantFormat::kInt4, 128, l).ok());
  EXPECT_FALSE(PlanMoeQuant(kMoeQuantMaxPairs + 1, 8, 256, 128, QuantFormat::kInt4, 128, l).ok());
  EXPECT_FALSE(PlanMoeQuant(8, 0, 256, 128, QuantFormat::kInt4, 128, l).ok());
  EXPECT_FALSE(PlanMoeQuant(8, kMoeMaxExperts + 1, 256, 128, QuantFormat::kInt4, 128, l).ok());
  EXPECT_FALSE(PlanMoeQuant(8, 8, 250, 128, QuantFormat::kInt4, 128, l).ok());   // k % 32
  EXPECT_FALSE(PlanMoeQuant(8, 8, 256, 136, QuantFormat::kNvfp4, 16, l).ok());   // down k % 32
  EXPECT_FALSE(PlanMoeQuant(8, 8, 256, 128, QuantFormat::kNvfp4, 32, l).ok());   // nvfp4 group
  EXPECT_FALSE(PlanMoeQuant(8, 8, 256, 128, QuantFormat::kInt8, 24, l).ok());    // group % 16
  EXPECT_TRUE(PlanMoeQuant(8, 8, 256, 144, QuantFormat::kInt8, 16, l).ok());     // int8: k % 16
  auto t = PlanMoeQuant(8, 8, 256, 128, QuantFormat::kInt4, 32, l);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->gate_up_window_scale);  // group 32: 16 bytes, not whole windows
}

TEST(MoeQuantTable, ChecksNameTheExpertAndTheRule) {
  alignas(16) static uint8_t data[64 * 1024];
  alignas(16) static uint8_t scales[8 * 1024];
  const int64_t hidden = 256, inter = 128;
  auto matrix = [&](int64_t cols) {
    MoeQuantMatrix m;
    m.data = data;
    m.ld_bytes = cols / 2;
    m.scales = scales;
    m.scale_ld = CeilDiv(cols, 128);
    return m;
  };
  std::vector<MoeQuantExpert> ex(3);
  for (MoeQuantExpert& e : ex) e = {matrix(hidden), matrix(hidden), matrix(inter)};
  EXPECT_TRUE(
      CheckMoeQuantExperts(ex.data(), 3, hidden, inter, QuantFormat::kInt4, 128).ok());
  ex[2].down.ld_bytes = 48;  // < inter / 2
  absl::Status s = CheckMoeQuantExperts(ex.data(), 3, hidden, inter, QuantFormat::kInt4, 128);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expert 2 down"), std::string::npos) << s;
  ex[2].down = matrix(inter);
  ex[1].up.data = data + 8;  // not 16-byte aligned
  s = CheckMoeQuantExperts(ex.data(), 3, hidden, inter, QuantFormat::kInt4, 128);
  EXPECT_NE(s.message().find("expert 1 up"), std::string::npos) << s;
  ex[1].up = matrix(hidden);
  ex[0].gate.scales = nullptr;
  s = CheckMoeQuantExperts(ex.data(), 3, hidden, inter, QuantFormat::kInt4, 128);
  EXPECT_NE(s.message().find("expert 0 gate"), std::string::npos) << s;
  EXPECT_FALSE(CheckMoeQuantExperts(nullptr, 3, hidden, inter, QuantFormat::kInt4, 128).ok());
}

// ---- GPU against the host reference ------------------------------------------------------------

// A random packed weight [rows, cols] on the host and the device.
struct Packed {
  QuantWeightView host;
  std::vector<uint8_t> data, scales;
  std::unique_ptr<GuardedBuffer> d_data, d_scales;

  MoeQuantMatrix Device() const {
    MoeQuantMatrix m;
    m.data = d_data->data();
    m.ld_bytes = host.ld_bytes;
    m.scales = d_scales->data();
    m.scale_ld = host.scale_ld;
    m.global_scale = host.global_scale;
    return m;
  }
};

Packed MakePacked(QuantFormat f, int64_t rows, int64_t cols, int64_t group, float global_scale,
                  Rng& rng) {
  Packed p;
  QuantWeightView& v = p.host;
  v.format = f;
  v.rows = rows, v.cols = cols, v.group_size = group;
  const int64_t row_bytes = cols * v.bits() / 8;
  v.ld_bytes = (row_bytes + 15) / 16 * 16 + 16;  // a padded stride
  const int sb = f == QuantFormat::kNvfp4 ? 1 : 2;
  v.scale_ld = CeilDiv(cols, std::min(group, cols)) + 3;
  v.global_scale = f == QuantFormat::kNvfp4 ? global_scale : 1.0f;
  p.data.assign(rows * v.ld_bytes, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < row_bytes; ++b) p.data[r * v.ld_bytes + b] = rng.Next() & 0xff;
  }
  p.scales.assign(rows * v.scale_ld * sb, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < v.scale_ld; ++j) {
      uint8_t* s = p.scales.data() + (r * v.scale_ld + j) * sb;
      if (f == QuantFormat::kNvfp4) {
        s[0] = static_cast<uint8_t>(((4 + rng.Next() % 7) << 3) | (rng.Next() % 8));
      } else {
        const float x = 0.002f + 0.018f * (rng.Next() & 0xffff) / 65536.0f;
        const uint16_t b = GemvQuantBf16Bits(x);
        std::memcpy(s, &b, 2);
      }
    }
  }
  p.d_data = std::make_unique<GuardedBuffer>(p.data.size());
  p.d_scales = std::make_unique<GuardedBuffer>(p.scales.size());
  EXPECT_EQ(p.d_data->Upload(p.data.data(), p.data.size()), cudaSuccess);
  EXPECT_EQ(p.d_scales->Upload(p.scales.data(), p.scales.size()), cudaSuccess);
  v.data = p.data.data();
  v.scales = p.scales.data();
  return p;
}

class DeviceWorkspace : public MoeWorkspace {
 public:
  ~DeviceWorkspace() override {
    for (auto& s : slots_) {
      if (s.p != nullptr) cudaFree(s.p);
    }
  }
  absl::StatusOr<void*> Get(int slot, size_t bytes) override {
    Slot& s = slots_[slot];
    if (s.p == nullptr || s.bytes < bytes) {
      if (s.p != nullptr) cudaFree(s.p);
      s.p = nullptr;
      if (cudaMalloc(&s.p, std::max<size_t>(bytes, 256)) != cudaSuccess) {
        return absl::ResourceExhaustedError("test workspace");
      }
      s.bytes = bytes;
    }
    return s.p;
  }

 private:
  struct Slot {
    void* p = nullptr;
    size_t bytes = 0;
  };
  Slot slots_[8];
};

struct Layer {
  QuantFormat format;
  int64_t group, hidden, inter;
  int num_experts;
  std::vector<Packed> gate, up, down;
  MoeQuantTable table;
};

void MakeLayer(Layer& l, Rng& rng) {
  for (int e = 0; e < l.num_experts; ++e) {
    // nvfp4: gate, up and down global scales differ per expert and per projection.
    l.gate.push_back(MakePacked(l.format, l.inter, l.hidden, l.group, 0.01f * (1 + e % 3), rng));
    l.up.push_back(MakePacked(l.format, l.inter, l.hidden, l.group, 0.03f / (1 + e % 2), rng));
    l.down.push_back(MakePacked(l.format, l.hidden, l.inter, l.group, 0.02f + 0.001f * e, rng));
  }
  std::vector<MoeQuantExpert> ex(l.num_experts);
  for (int e = 0; e < l.num_experts; ++e) {
    ex[e] = {l.gate[e].Device(), l.up[e].Device(), l.down[e].Device()};
  }
  auto t = MoeQuantTableFor(&l, ex.data(), l.num_experts, l.hidden, l.inter, l.format, l.group,
                            nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  l.table = *t;
}

// out (+)= the experts' sum as moe_quant.h defines it, on the host.
void Reference(const Layer& l, const std::vector<float>& x, int64_t tokens,
               const std::vector<int32_t>& ids, const std::vector<float>& w, int top_k,
               std::vector<float>& out) {
  std::vector<float> g(l.inter), u(l.inter), act(l.inter), y(l.hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int j = 0; j < top_k; ++j) {
      const int e = ids[t * top_k + j];
      if (e < 0 || e >= l.num_experts) continue;
      const float* xr = x.data() + t * l.hidden;
      ASSERT_TRUE(GemvQuantHost(1, xr, l.hidden, l.gate[e].host, g.data(), l.inter, false).ok());
      ASSERT_TRUE(GemvQuantHost(1, xr, l.hidden, l.up[e].host, u.data(), l.inter, false).ok());
      for (int64_t i = 0; i < l.inter; ++i) act[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      ASSERT_TRUE(
          GemvQuantHost(1, act.data(), l.inter, l.down[e].host, y.data(), l.hidden, false).ok());
      for (int64_t c = 0; c < l.hidden; ++c) out[t * l.hidden + c] += w[t * top_k + j] * y[c];
    }
  }
}

class MoeQuantGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }

  // Runs tokens through the layer (ids from `pick`) and checks against the reference; returns
  // the output (for the repeat check).
  std::vector<float> Check(const Layer& l, int64_t tokens, int top_k, bool hot,
                           const KernelPolicy& policy, Rng& rng) {
    std::vector<float> x(tokens * l.hidden), out0(tokens * l.hidden), w(tokens * top_k);
    std::vector<int32_t> ids(tokens * top_k);
    for (float& v : x) v = rng.Uniform();
    for (float& v : out0) v = rng.Uniform();
    for (float& v : w) v = 0.25f + 0.5f * (rng.Uniform() + 1.0f);
    for (int64_t i = 0; i < tokens * top_k; ++i) {
      // Mostly valid ids with repeats; some below 0 or past the experts (ignored); hot: expert
      // 3 takes two thirds of the pairs, so its rows span several units.
      const uint32_t r = rng.Next();
      ids[i] = hot && r % 3 != 0 ? 3 : static_cast<int32_t>(r % (l.num_experts + 4)) - 2;
    }
    std::vector<float> ref = out0;
    Reference(l, x, tokens, ids, w, top_k, ref);

    GuardedBuffer dx(x.size() * 4), dids(ids.size() * 4), dw(w.size() * 4),
        dout(out0.size() * 4);
    EXPECT_EQ(dx.Upload(x.data(), x.size() * 4), cudaSuccess);
    EXPECT_EQ(dids.Upload(ids.data(), ids.size() * 4), cudaSuccess);
    EXPECT_EQ(dw.Upload(w.data(), w.size() * 4), cudaSuccess);
    MoeQuantArgs a;
    a.x = dx.as<float>(), a.x_ld = l.hidden, a.tokens = tokens;
    a.ids = dids.as<int32_t>(), a.weights = dw.as<float>(), a.top_k = top_k;
    a.experts = &l.table;
    a.out = dout.as<float>(), a.out_ld = l.hidden;
    std::vector<float> got[2];
    for (std::vector<float>& o : got) {
      EXPECT_EQ(dout.Upload(out0.data(), out0.size() * 4), cudaSuccess);
      const absl::Status s = MoeQuantExperts(a, policy, ws_, nullptr);
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      o.resize(out0.size());
      EXPECT_EQ(dout.Download(o.data(), o.size() * 4), cudaSuccess);
    }
    EXPECT_TRUE(dout.GuardsIntact());
    EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * 4), 0)
        << "a repeated call gave other bits";
    double scale = 1e-30, worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      scale = std::max(scale, std::fabs(static_cast<double>(ref[i]) - out0[i]));
    }
    int bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = std::fabs(static_cast<double>(got[0][i]) - ref[i]);
      worst = std::max(worst, d / scale);
      if (!std::isfinite(got[0][i]) || d > 1e-3 * scale) {
        if (++bad <= 5) {
          ADD_FAILURE() << "out[" << i / l.hidden << ", " << i % l.hidden << "] = " << got[0][i]
                        << ", reference " << ref[i] << " (max |out - out0| " << scale << ")";
        }
      }
    }
    std::printf("%s group %lld hidden %lld inter %lld: tokens %lld top_k %d%s: max |err| %.3g of "
                "max |out - out0|\n",
                QuantFormatName(l.format), static_cast<long long>(l.group),
                static_cast<long long>(l.hidden), static_cast<long long>(l.inter),
                static_cast<long long>(tokens), top_k, hot ? " hot" : "", worst);
    return got[0];
  }

  DeviceWorkspace ws_;
};

TEST_F(MoeQuantGpuTest, MatchesTheHostReference) {
  struct Case {
    QuantFormat format;
    int64_t group, hidden, inter;
  };
  const Case cases[] = {
      {QuantFormat::kInt4, 128, 384, 256},   // per-window scales
      {QuantFormat::kInt4, 32, 320, 96},     // hi / lo; partial row blocks and windows
      {QuantFormat::kInt8, 128, 384, 256},
      {QuantFormat::kInt8, 1 << 20, 272, 80},  // channel
      {QuantFormat::kNvfp4, 16, 320, 160},
  };
  Rng rng(11);
  for (const Case& c : cases) {
    Layer l{c.format, c.group, c.hidden, c.inter, 12, {}, {}, {}, {}};
    MakeLayer(l, rng);
    if (HasFatalFailure()) return;
    for (int64_t tokens : {1, 2, 5, 16, 64}) {
      SCOPED_TRACE(absl::StrCat(QuantFormatName(c.format), " g", c.group, " tokens ", tokens));
      Check(l, tokens, 4, false, KernelPolicy{}, rng);
    }
    SCOPED_TRACE("hot expert");
    Check(l, 64, 4, true, KernelPolicy{}, rng);
  }
}

// A K range longer than the staged chunk (GB10's budget: several chunks per CTA at 16 rows).
TEST_F(MoeQuantGpuTest, ChunkedKMatchesTheHostReference) {
  Rng rng(12);
  for (QuantFormat f : {QuantFormat::kInt4, QuantFormat::kNvfp4}) {
    Layer l{f, f == QuantFormat::kNvfp4 ? 16 : 128, 4096, 128, 4, {}, {}, {}, {}};
    MakeLayer(l, rng);
    if (HasFatalFailure()) return;
    KernelPolicy policy;
    policy.smem_cap_bytes = 48 * 1024;
    SCOPED_TRACE(QuantFormatName(f));
    Check(l, 16, 4, true, policy, rng);
    Check(l, 3, 2, false, policy, rng);
  }
}

// Routing inside the op equals kernels::MoeRoute then the ids, bit for bit.
TEST_F(MoeQuantGpuTest, RoutingInsideEqualsRouteThenIds) {
  Rng rng(13);
  Layer l{QuantFormat::kInt4, 128, 256, 128, 16, {}, {}, {}, {}};
  MakeLayer(l, rng);
  if (HasFatalFailure()) return;
  const int64_t tokens = 7;
  const int top_k = 4, routed = 16;
  std::vector<float> x(tokens * l.hidden), logits(tokens * routed);
  for (float& v : x) v = rng.Uniform();
  for (float& v : logits) v = rng.Uniform() * 4.0f;
  GuardedBuffer dx(x.size() * 4), dl(logits.size() * 4), ids_a(tokens * top_k * 4),
      w_a(tokens * top_k * 4), ids_b(tokens * top_k * 4), w_b(tokens * top_k * 4),
      out_a(x.size() * 4), out_b(x.size() * 4);
  ASSERT_EQ(dx.Upload(x.data(), x.size() * 4), cudaSuccess);
  ASSERT_EQ(dl.Upload(logits.data(), logits.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(out_a.data(), 0, x.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(out_b.data(), 0, x.size() * 4), cudaSuccess);
  ASSERT_TRUE(MoeRoute(dl.as<float>(), routed, nullptr, tokens, routed, 1, 1, top_k, true, 2.5f,
                       -1, ids_a.as<int32_t>(), w_a.as<float>(), nullptr)
                  .ok());
  MoeQuantArgs a;
  a.x = dx.as<float>(), a.x_ld = l.hidden, a.tokens = tokens;
  a.ids = ids_a.as<int32_t>(), a.weights = w_a.as<float>(), a.top_k = top_k;
  a.experts = &l.table;
  a.out = out_a.as<float>(), a.out_ld = l.hidden;
  ASSERT_TRUE(MoeQuantExperts(a, KernelPolicy{}, ws_, nullptr).ok());
  MoeRouting r;
  r.logits = dl.as<float>(), r.logits_ld = routed, r.logits_rows = tokens;
  r.num_routed = routed, r.top_k = top_k, r.renormalize = true, r.scale = 2.5f;
  r.ids = ids_b.as<int32_t>(), r.weights = w_b.as<float>();
  MoeQuantArgs b = a;
  b.ids = nullptr, b.weights = nullptr, b.route = &r;
  b.out = out_b.as<float>();
  ASSERT_TRUE(MoeQuantExperts(b, KernelPolicy{}, ws_, nullptr).ok());
  std::vector<float> oa(x.size()), ob(x.size());
  ASSERT_EQ(out_a.Download(oa.data(), oa.size() * 4), cudaSuccess);
  ASSERT_EQ(out_b.Download(ob.data(), ob.size() * 4), cudaSuccess);
  EXPECT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * 4), 0);
  double mx = 0;
  for (float v : oa) mx = std::max(mx, std::fabs(static_cast<double>(v)));
  EXPECT_GT(mx, 0.0);
}

TEST_F(MoeQuantGpuTest, RejectsPairsBeyondTheLimit) {
  Rng rng(14);
  Layer l{QuantFormat::kInt8, 128, 128, 128, 2, {}, {}, {}, {}};
  MakeLayer(l, rng);
  if (HasFatalFailure()) return;
  GuardedBuffer dx(4096 * 128 * 4);
  MoeQuantArgs a;
  a.x = dx.as<float>(), a.x_ld = 128, a.tokens = 4096;
  a.ids = reinterpret_cast<const int32_t*>(dx.data()), a.weights = dx.as<float>(), a.top_k = 2;
  a.experts = &l.table;
  a.out = dx.as<float>(), a.out_ld = 128;
  const absl::Status s = MoeQuantExperts(a, KernelPolicy{}, ws_, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("in pieces"), std::string::npos) << s;
}

}  // namespace
}  // namespace glm::kernels
