// Weight bytes per placement group: estimated from config.json or read from the checkpoint.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "controller/plan/plan.h"

namespace glm::controller {
namespace {

using engine::ModelConfig;

struct Dtypes {
  int64_t plain = 2;  // bytes per element of unquantized tensors
  bool fp8 = false;
  int64_t block_rows = 128;
  int64_t block_cols = 128;
  // compressed-tensors / NVFP4: which modules are quantized and how (null otherwise).
  const engine::QuantizationConfig* quant = nullptr;
  // Bytes per element of the MoE router weight (`mlp.gate.weight`). compressed-tensors
  // pack-quantized checkpoints keep it in fp32: config.json cannot say so, but the Int4-Int8Mix
  // checkpoint's byte total only matches with fp32 routers (specs/quantized-checkpoints.md §5.1).
  // Safetensors headers, when at hand, replace the estimate anyway.
  int64_t router = 2;
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A [rows, cols] linear weight `module` ("model.layers.3.self_attn.o_proj"), in the encoding the
// checkpoint's quantization gives it (specs/quantized-checkpoints.md §5.1):
//   fp8 block       1 B/param + fp32 scale per block
//   INT4/INT8       bits/8 B/param (I32 words) + BF16 scale per group (or per row) + I64[2] shape
//   NVFP4           0.5 B/param + E4M3 scale per 16 + F32 weight_scale_2 and input_scale
int64_t Linear(const Dtypes& d, const std::string& module, int64_t rows, int64_t cols) {
  if (d.fp8) return rows * cols + CeilDiv(rows, d.block_rows) * CeilDiv(cols, d.block_cols) * 4;
  const engine::QuantGroup* group = d.quant != nullptr ? d.quant->GroupOf(module) : nullptr;
  if (group == nullptr) return rows * cols * d.plain;
  if (d.quant->method == engine::QuantMethod::kNvfp4) {
    return rows * CeilDiv(cols, 2) + rows * CeilDiv(cols, 16) + 8;
  }
  const int64_t groups = group->group_size > 0 ? CeilDiv(cols, group->group_size) : 1;
  return rows * CeilDiv(cols * group->num_bits, 32) * 4 + rows * groups * 2 + 16;
}
// A tensor kept unquantized (norms, router, embeddings, ...).
int64_t Plain(const Dtypes& d, int64_t elements) { return elements * d.plain; }

// One routed expert's gate/up/down of layer `layer_idx` (expert 0's encoding stands for all).
int64_t ExpertBytes(const ModelConfig& c, const Dtypes& d, int layer_idx) {
  const int64_t h = c.hidden_size;
  const std::string e = absl::StrCat("model.layers.", layer_idx, ".mlp.experts.0.");
  return Linear(d, e + "gate_proj", c.moe_intermediate_size, h) +
         Linear(d, e + "up_proj", c.moe_intermediate_size, h) +
         Linear(d, e + "down_proj", h, c.moe_intermediate_size);
}

int64_t LayerBytes(const ModelConfig& c, const Dtypes& d, int layer_idx) {
  const int64_t h = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  const std::string layer = absl::StrCat("model.layers.", layer_idx, ".");
  const std::string attn = layer + "self_attn.";
  int64_t bytes = 0;
  // Norms around attention and MLP.
  bytes += Plain(d, h) * 2;
  // MLA: q_a_proj [q_lora, H], q_a_layernorm, q_b_proj [heads*qk_head_dim, q_lora],
  // kv_a_proj_with_mqa [kv_lora + rope, H], kv_a_layernorm, kv_b_proj [heads*(nope+v), kv_lora],
  // o_proj [H, heads*v].
  bytes += Linear(d, attn + "q_a_proj", c.q_lora_rank, h) + Plain(d, c.q_lora_rank);
  bytes += Linear(d, attn + "q_b_proj", heads * c.qk_head_dim(), c.q_lora_rank);
  bytes += Linear(d, attn + "kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, h) +
           Plain(d, c.kv_lora_rank);
  bytes += Linear(d, attn + "kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim),
                  c.kv_lora_rank);
  bytes += Linear(d, attn + "o_proj", h, heads * c.v_head_dim);
  if (c.HasIndexer(layer_idx)) {
    // wq_b [idx_heads*idx_dim, q_lora], wk [idx_dim, H], k_norm weight+bias, weights_proj
    // [idx_heads, H] (unquantized).
    bytes += Linear(d, attn + "indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
    bytes += Linear(d, attn + "indexer.wk", c.index_head_dim, h) + Plain(d, 2 * c.index_head_dim);
    bytes += Plain(d, c.index_n_heads * h);
  }
  if (!c.IsMoeLayer(layer_idx)) {
    bytes += Linear(d, layer + "mlp.gate_proj", c.intermediate_size, h) +
             Linear(d, layer + "mlp.up_proj", c.intermediate_size, h) +
             Linear(d, layer + "mlp.down_proj", h, c.intermediate_size);
  } else {
    const int64_t e = c.n_routed_experts;
    const int64_t shared_width = c.moe_intermediate_size * c.n_shared_experts;
    bytes += e * h * d.router + e * 4;  // router gate [E, H] + f32 e_score_correction_bias [E]
    if (shared_width > 0) {
      const std::string shared = layer + "mlp.shared_experts.";
      bytes += Linear(d, shared + "gate_proj", shared_width, h) +
               Linear(d, shared + "up_proj", shared_width, h) +
               Linear(d, shared + "down_proj", h, shared_width);
    }
    bytes += e * ExpertBytes(c, d, layer_idx);  // RoutedExpertBytes
  }
  if (layer_idx >= c.num_hidden_layers) {
    // MTP extras: enorm, hnorm, shared_head.norm [H]; eh_proj [H, 2H] unquantized.
    bytes += Plain(d, 3 * h) + Plain(d, 2 * h * h);
  }
  return bytes;
}

// The routed experts' share of LayerBytes (all n_routed_experts).
int64_t RoutedExpertBytes(const ModelConfig& c, const Dtypes& d, int layer_idx) {
  if (!c.IsMoeLayer(layer_idx)) return 0;
  return int64_t{c.n_routed_experts} * ExpertBytes(c, d, layer_idx);
}

absl::StatusOr<Dtypes> DtypesOf(const ModelConfig& c) {
  Dtypes d;
  if (c.torch_dtype == "float32") {
    d.plain = 4;
  } else if (!c.torch_dtype.empty() && c.torch_dtype != "bfloat16" &&
             c.torch_dtype != "float16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: field `torch_dtype`: \"", c.torch_dtype,
        "\" is not supported; expected bfloat16, float16 or float32"));
  }
  if (c.quantization.has_value()) {
    if (c.quantization->method == engine::QuantMethod::kFp8Block) {
      d.fp8 = true;
      d.block_rows = c.quantization->block_rows;
      d.block_cols = c.quantization->block_cols;
    } else {
      d.quant = &*c.quantization;
      if (c.quantization->method == engine::QuantMethod::kPackQuantized) d.router = 4;
    }
  }
  d.router = std::max(d.router, d.plain);
  return d;
}

// Reads one safetensors header and adds each tensor's byte length to its group.
absl::Status AddSafetensorsHeader(const std::filesystem::path& path, WeightSizes* sizes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  unsigned char len_bytes[8];
  if (!in.read(reinterpret_cast<char*>(len_bytes), 8)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.string(), ": shorter than a safetensors header; expected a safetensors file "
                       "(a Git LFS pointer means the weights were not downloaded)"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len == 0 || header_len > (uint64_t{100} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.string(), ": safetensors header length ", header_len,
        " is implausible; expected a safetensors file (a Git LFS pointer means the weights were "
        "not downloaded)"));
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len))) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": truncated safetensors header"));
  }
  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": safetensors header is not a JSON object"));
  }
  const int num_layers = static_cast<int>(sizes->layer_bytes.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const nlohmann::json& entry = it.value();
    const nlohmann::json* offsets =
        entry.is_object() && entry.contains("data_offsets") ? &entry["data_offsets"] : nullptr;
    if (offsets == nullptr || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned() ||
        (*offsets)[1].get<uint64_t>() < (*offsets)[0].get<uint64_t>()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path.string(), ": tensor `", it.key(), "` has no valid data_offsets"));
    }
    const int64_t bytes =
        static_cast<int64_t>((*offsets)[1].get<uint64_t>() - (*offsets)[0].get<uint64_t>());
    const std::string& name = it.key();
    constexpr std::string_view kLayers = "model.layers.";
    if (name.rfind("model.embed_tokens.", 0) == 0) {
      sizes->embedding_bytes += bytes;
    } else if (name.rfind("lm_head.", 0) == 0) {
      sizes->lm_head_bytes += bytes;
    } else if (name.rfind("model.norm.", 0) == 0) {
      sizes->final_norm_bytes += bytes;
    } else if (name.rfind(kLayers, 0) == 0) {
      size_t end = name.find('.', kLayers.size());
      int layer = -1;
      if (end != std::string::npos && end > kLayers.size() && end - kLayers.size() <= 6) {
        layer = std::atoi(name.substr(kLayers.size(), end - kLayers.size()).c_str());
      }
      if (layer >= 0 && layer < num_layers) {
        sizes->layer_bytes[layer] += bytes;
        // mlp.experts.<e>.* or the fused mlp.experts.{gate_up_proj,down_proj}; not
        // mlp.shared_experts.*.
        if (name.compare(end, 13, ".mlp.experts.") == 0) sizes->routed_expert_bytes[layer] += bytes;
      } else {
        sizes->other_bytes += bytes;
      }
    } else {
      sizes->other_bytes += bytes;
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t WeightSizes::total_bytes() const {
  int64_t total = embedding_bytes + lm_head_bytes + final_norm_bytes + other_bytes;
  for (int64_t b : layer_bytes) total += b;
  return total;
}

std::string_view WeightSourceName(WeightSizes::Source source) {
  switch (source) {
    case WeightSizes::Source::kIndexTotal:
      return "estimate scaled to model.safetensors.index.json total_size";
    case WeightSizes::Source::kSafetensorsHeaders:
      return "safetensors headers";
    default:
      return "estimated from config.json";
  }
}

absl::StatusOr<WeightSizes> EstimateWeightSizes(const ModelConfig& config) {
  GLM_ASSIGN_OR_RETURN(Dtypes d, DtypesOf(config));
  WeightSizes sizes;
  sizes.source = WeightSizes::Source::kEstimated;
  const int total_layers = config.num_hidden_layers + config.num_mtp_layers();
  for (int i = 0; i < total_layers; ++i) {
    sizes.layer_bytes.push_back(LayerBytes(config, d, i));
    sizes.routed_expert_bytes.push_back(RoutedExpertBytes(config, d, i));
  }
  sizes.embedding_bytes = Plain(d, config.vocab_size * config.hidden_size);
  sizes.lm_head_bytes = config.tie_word_embeddings ? 0
                        : d.quant != nullptr
                            ? Linear(d, "lm_head", config.vocab_size, config.hidden_size)
                            : sizes.embedding_bytes;
  sizes.final_norm_bytes = Plain(d, config.hidden_size);
  return sizes;
}

absl::StatusOr<WeightSizes> LoadWeightSizes(const std::string& model_dir,
                                            const ModelConfig& config) {
  namespace fs = std::filesystem;
  std::vector<fs::path> shards;
  std::error_code ec;
  for (fs::directory_iterator it(model_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".safetensors") shards.push_back(it->path());
  }
  std::sort(shards.begin(), shards.end());
  if (!shards.empty()) {
    WeightSizes sizes;
    sizes.source = WeightSizes::Source::kSafetensorsHeaders;
    sizes.layer_bytes.assign(config.num_hidden_layers + config.num_mtp_layers(), 0);
    sizes.routed_expert_bytes.assign(sizes.layer_bytes.size(), 0);
    for (const auto& shard : shards) {
      GLM_RETURN_IF_ERROR(AddSafetensorsHeader(shard, &sizes));
    }
    return sizes;
  }
  GLM_ASSIGN_OR_RETURN(WeightSizes sizes, EstimateWeightSizes(config));
  const fs::path index = fs::path(model_dir) / "model.safetensors.index.json";
  std::ifstream in(index);
  if (!in) return sizes;
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  const nlohmann::json* total = nullptr;
  if (j.is_object() && j.contains("metadata") && j["metadata"].is_object() &&
      j["metadata"].contains("total_size")) {
    total = &j["metadata"]["total_size"];
  }
  if (total == nullptr || !total->is_number_integer() || total->get<int64_t>() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        index.string(), ": field `metadata.total_size`: missing or not a positive integer; "
                        "expected the checkpoint's total tensor bytes"));
  }
  // Keep the estimated distribution, scale it to the real total.
  const long double scale =
      static_cast<long double>(total->get<int64_t>()) / static_cast<long double>(sizes.total_bytes());
  auto scaled = [&](int64_t b) { return static_cast<int64_t>(static_cast<long double>(b) * scale); };
  for (auto& b : sizes.layer_bytes) b = scaled(b);
  for (auto& b : sizes.routed_expert_bytes) b = scaled(b);
  sizes.embedding_bytes = scaled(sizes.embedding_bytes);
  sizes.lm_head_bytes = scaled(sizes.lm_head_bytes);
  sizes.final_norm_bytes = scaled(sizes.final_norm_bytes);
  sizes.other_bytes = total->get<int64_t>() - sizes.total_bytes();  // rounding remainder
  sizes.source = WeightSizes::Source::kIndexTotal;
  return sizes;
}

}  // namespace glm::controller
