#include "engine/config/model_config.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_util.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

using json = nlohmann::ordered_json;

constexpr char kModelType[] = "glm_moe_dsa";
constexpr char kArchitecture[] = "GlmMoeDsaForCausalLM";

// Upper bounds far above any GLM-5-class model; they keep byte counts (products of these) within
// int64 and stop a hostile config from allocating per-layer tables of billions of entries.
constexpr int64_t kMaxVocab = int64_t{1} << 22;
constexpr int64_t kMaxWidth = int64_t{1} << 17;
constexpr int64_t kMaxFfn = int64_t{1} << 20;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 4096;
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxPositions = int64_t{1} << 30;

// Collects the source name so every message reads
// "<source>: field `x`: what was wrong; expected ...".
class Reader {
 public:
  Reader(const json& root, std::string_view source) : root_(root), source_(source) {}

  absl::Status Error(std::string_view field, std::string_view what,
                     std::string_view expected) const {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(source_), ": field `", ToAbsl(field),
                                                   "`: ", ToAbsl(what), "; expected ",
                                                   ToAbsl(expected)));
  }

  std::string_view source() const { return source_; }

  const json* Find(std::string_view field) const {
    auto it = root_.find(std::string(field));
    if (it == root_.end()) return nullptr;
    return &*it;
  }

  // Present and not null.
  bool Has(std::string_view field) const {
    const json* v = Find(field);
    return v != nullptr && !v->is_null();
  }

  static std::string Describe(const json& v) {
    std::string dumped = v.dump();
    if (dumped.size() > 60) dumped = dumped.substr(0, 57) + "...";
    return absl::StrCat(v.type_name(), " ", dumped);
  }

  // Integer field in [min_value, max_value]. Required fields error when absent; optional ones
  // keep `*out`. The upper bounds keep size arithmetic (bytes = product of dims) in int64.
  absl::Status Int(std::string_view field, bool required, int64_t* out, int64_t min_value,
                   int64_t max_value = int64_t{1} << 40) const {
    const json* v = Find(field);
    if (v == nullptr || v->is_null()) {
      if (required) {
        return Error(field, "missing", absl::StrCat("an integer in ", min_value, "..", max_value));
      }
      if (*out < min_value || *out > max_value) {
        return Error(field, absl::StrCat("default ", *out, " is out of range"),
                     absl::StrCat("an integer in ", min_value, "..", max_value));
      }
      return absl::OkStatus();
    }
    if (!v->is_number_integer()) {
      // Accept integral floats ("2048.0") that some exporters write.
      if (v->is_number_float()) {
        double d = v->get<double>();
        if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) {
          *out = static_cast<int64_t>(d);
        } else {
          return Error(field, absl::StrCat("got ", Describe(*v)), "an integer");
        }
      } else {
        return Error(field, absl::StrCat("got ", Describe(*v)), "an integer");
      }
    } else if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Error(field, absl::StrCat("got ", Describe(*v)), "a 64-bit integer");
    } else {
      *out = v->get<int64_t>();
    }
    if (*out < min_value || *out > max_value) {
      return Error(field, absl::StrCat("got ", *out),
                   absl::StrCat("an integer in ", min_value, "..", max_value));
    }
    return absl::OkStatus();
  }

  absl::Status Int32(std::string_view field, bool required, int* out, int64_t min_value,
                     int64_t max_value = INT32_MAX) const {
    int64_t wide = *out;
    GLM_RETURN_IF_ERROR(Int(field, required, &wide, min_value, std::min<int64_t>(max_value, INT32_MAX)));
    *out = static_cast<int>(wide);
    return absl::OkStatus();
  }

  absl::Status Double(std::string_view field, double* out, bool positive) const {
    const json* v = Find(field);
    if (v == nullptr || v->is_null()) return absl::OkStatus();
    if (!v->is_number()) return Error(field, absl::StrCat("got ", Describe(*v)), "a number");
    double d = v->get<double>();
    if (!std::isfinite(d) || (positive && d <= 0)) {
      return Error(field, absl::StrCat("got ", v->dump()),
                   positive ? "a finite number > 0" : "a finite number");
    }
    *out = d;
    return absl::OkStatus();
  }

  absl::Status Bool(std::string_view field, bool* out) const {
    const json* v = Find(field);
    if (v == nullptr || v->is_null()) return absl::OkStatus();
    if (!v->is_boolean()) return Error(field, absl::StrCat("got ", Describe(*v)), "true or false");
    *out = v->get<bool>();
    return absl::OkStatus();
  }

  absl::Status String(std::string_view field, std::string* out) const {
    const json* v = Find(field);
    if (v == nullptr || v->is_null()) return absl::OkStatus();
    if (!v->is_string()) return Error(field, absl::StrCat("got ", Describe(*v)), "a string");
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

  // Optional string field that, when present, must equal one of `allowed`.
  absl::Status OneOf(std::string_view field, const std::vector<std::string>& allowed) const {
    std::string value;
    if (!Has(field)) return absl::OkStatus();
    GLM_RETURN_IF_ERROR(String(field, &value));
    for (const auto& a : allowed) {
      if (value == a) return absl::OkStatus();
    }
    return Error(field, absl::StrCat("unsupported value \"", value, "\""),
                 absl::StrCat("one of: ", absl::StrJoin(allowed, ", ")));
  }

 private:
  const json& root_;
  std::string_view source_;
};

absl::Status ParseIndexerTypes(const Reader& r, ModelConfig* c) {
  const int n = c->num_hidden_layers;
  c->indexer_types.clear();
  if (r.Has("indexer_types")) {
    const json& list = *r.Find("indexer_types");
    if (!list.is_array()) {
      return r.Error("indexer_types", absl::StrCat("got ", Reader::Describe(list)),
                     "a list of \"full\" / \"shared\"");
    }
    if (static_cast<int64_t>(list.size()) != n) {
      return r.Error("indexer_types", absl::StrCat("has ", list.size(), " entries"),
                     absl::StrCat("one per layer, num_hidden_layers = ", n));
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const json& e = list[i];
      std::string field = absl::StrCat("indexer_types[", i, "]");
      if (e.is_string() && e.get<std::string>() == "full") {
        c->indexer_types.push_back(IndexerType::kFull);
      } else if (e.is_string() && e.get<std::string>() == "shared") {
        c->indexer_types.push_back(IndexerType::kShared);
      } else {
        return r.Error(field, absl::StrCat("got ", Reader::Describe(e)), "\"full\" or \"shared\"");
      }
    }
  } else if (r.Has("index_topk_pattern")) {
    const json& pattern = *r.Find("index_topk_pattern");
    if (!pattern.is_string()) {
      return r.Error("index_topk_pattern", absl::StrCat("got ", Reader::Describe(pattern)),
                     "a string of 'F' (full) / 'S' (shared), one letter per layer");
    }
    const std::string p = pattern.get<std::string>();
    if (static_cast<int64_t>(p.size()) != n) {
      return r.Error("index_topk_pattern", absl::StrCat("has ", p.size(), " letters"),
                     absl::StrCat("one letter per layer, num_hidden_layers = ", n));
    }
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] == 'F' || p[i] == 'f') {
        c->indexer_types.push_back(IndexerType::kFull);
      } else if (p[i] == 'S' || p[i] == 's') {
        c->indexer_types.push_back(IndexerType::kShared);
      } else {
        return r.Error("index_topk_pattern",
                       absl::StrCat("letter ", i, " is '", std::string(1, p[i]), "'"),
                       "only 'F' (full) or 'S' (shared)");
      }
    }
  } else {
    // HF-cfg __post_init__: layer i is full iff max(i - offset + 1, 0) % freq == 0.
    int64_t freq = 1;
    int64_t offset = 2;
    GLM_RETURN_IF_ERROR(r.Int("index_topk_freq", false, &freq, 1));
    GLM_RETURN_IF_ERROR(r.Int("index_skip_topk_offset", false, &offset, 0));
    for (int i = 0; i < n; ++i) {
      int64_t shifted = std::max<int64_t>(i - offset + 1, 0);
      c->indexer_types.push_back(shifted % freq == 0 ? IndexerType::kFull : IndexerType::kShared);
    }
  }
  if (n > 0 && c->indexer_types[0] == IndexerType::kShared) {
    return r.Error(r.Has("indexer_types") ? "indexer_types" : "index_topk_pattern",
                   "layer 0 is \"shared\" but there is no previous full layer to reuse top-k from",
                   "layer 0 to be \"full\"");
  }
  return absl::OkStatus();
}

absl::Status ParseMlpLayerTypes(const Reader& r, ModelConfig* c) {
  const int n = c->num_hidden_layers;
  c->mlp_layer_types.clear();
  if (r.Has("mlp_layer_types")) {
    const json& list = *r.Find("mlp_layer_types");
    if (!list.is_array()) {
      return r.Error("mlp_layer_types", absl::StrCat("got ", Reader::Describe(list)),
                     "a list of \"dense\" / \"sparse\"");
    }
    if (static_cast<int64_t>(list.size()) != n) {
      return r.Error("mlp_layer_types", absl::StrCat("has ", list.size(), " entries"),
                     absl::StrCat("one per layer, num_hidden_layers = ", n));
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const json& e = list[i];
      if (e.is_string() && e.get<std::string>() == "dense") {
        c->mlp_layer_types.push_back(MlpType::kDense);
      } else if (e.is_string() && e.get<std::string>() == "sparse") {
        c->mlp_layer_types.push_back(MlpType::kSparse);
      } else {
        return r.Error(absl::StrCat("mlp_layer_types[", i, "]"),
                       absl::StrCat("got ", Reader::Describe(e)), "\"dense\" or \"sparse\"");
      }
    }
  } else {
    for (int i = 0; i < n; ++i) {
      c->mlp_layer_types.push_back(i < c->first_k_dense_replace ? MlpType::kDense
                                                                : MlpType::kSparse);
    }
  }
  return absl::OkStatus();
}

absl::Status ParseRope(const Reader& r, ModelConfig* c) {
  GLM_RETURN_IF_ERROR(r.Double("rope_theta", &c->rope_theta, /*positive=*/true));
  if (r.Has("rope_parameters")) {
    const json& rp = *r.Find("rope_parameters");
    if (!rp.is_object()) {
      return r.Error("rope_parameters", absl::StrCat("got ", Reader::Describe(rp)),
                     "an object {\"rope_theta\": number, \"rope_type\": \"default\"}");
    }
    Reader sub(rp, "");
    const json* theta = sub.Find("rope_theta");
    if (theta != nullptr && !theta->is_null()) {
      if (!theta->is_number() || !std::isfinite(theta->get<double>()) ||
          theta->get<double>() <= 0) {
        return r.Error("rope_parameters.rope_theta", absl::StrCat("got ", Reader::Describe(*theta)),
                       "a number > 0");
      }
      c->rope_theta = theta->get<double>();
    }
    const json* type = sub.Find("rope_type");
    if (type != nullptr && !type->is_null()) {
      if (!type->is_string()) {
        return r.Error("rope_parameters.rope_type", absl::StrCat("got ", Reader::Describe(*type)),
                       "a string");
      }
      c->rope_type = type->get<std::string>();
    }
  }
  if (r.Has("rope_scaling")) {
    const json& rs = *r.Find("rope_scaling");
    if (rs.is_object() && rs.contains("rope_type") && rs["rope_type"].is_string()) {
      c->rope_type = rs["rope_type"].get<std::string>();
    } else if (rs.is_object() && rs.contains("type") && rs["type"].is_string()) {
      c->rope_type = rs["type"].get<std::string>();
    }
  }
  if (c->rope_type != "default") {
    return r.Error("rope_parameters.rope_type",
                   absl::StrCat("unsupported RoPE type \"", c->rope_type, "\""),
                   "\"default\" (GLM-5 uses plain RoPE; YaRN scaling is not implemented)");
  }
  return absl::OkStatus();
}

absl::Status ParseEos(const Reader& r, ModelConfig* c) {
  c->eos_token_ids.clear();
  if (!r.Has("eos_token_id")) return absl::OkStatus();
  const json& v = *r.Find("eos_token_id");
  auto one = [&](const json& e, std::string_view field) -> absl::Status {
    if (!e.is_number_integer() || e.get<int64_t>() < 0) {
      return r.Error(field, absl::StrCat("got ", Reader::Describe(e)),
                     "a non-negative token id");
    }
    c->eos_token_ids.push_back(e.get<int64_t>());
    return absl::OkStatus();
  };
  if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      GLM_RETURN_IF_ERROR(one(v[i], absl::StrCat("eos_token_id[", i, "]")));
    }
    return absl::OkStatus();
  }
  return one(v, "eos_token_id");
}

absl::Status ParseQuantization(const Reader& r, ModelConfig* c) {
  c->quantization.reset();
  if (!r.Has("quantization_config")) return absl::OkStatus();
  GLM_ASSIGN_OR_RETURN(QuantizationConfig q, ParseQuantizationConfig(
                                                 r.Find("quantization_config")->dump(), r.source()));
  c->quantization = std::move(q);
  return absl::OkStatus();
}

absl::Status ParseRoot(const json& root, std::string_view source, ModelConfig* c) {
  Reader r(root, source);
  // Identity.
  if (!r.Has("model_type")) {
    return r.Error("model_type", "missing", "\"glm_moe_dsa\"");
  }
  GLM_RETURN_IF_ERROR(r.String("model_type", &c->model_type));
  if (c->model_type != kModelType) {
    return r.Error("model_type", absl::StrCat("got \"", c->model_type, "\""),
                   "\"glm_moe_dsa\" (GLM-5 family; other architectures are not supported)");
  }
  if (r.Has("architectures")) {
    const json& arch = *r.Find("architectures");
    bool ok = arch.is_array() && !arch.empty();
    if (ok) {
      for (const auto& a : arch) {
        if (!a.is_string() || a.get<std::string>() != kArchitecture) ok = false;
      }
    }
    if (!ok) {
      return r.Error("architectures", absl::StrCat("got ", Reader::Describe(arch)),
                     "[\"GlmMoeDsaForCausalLM\"]");
    }
  }

  // Required dimensions.
  GLM_RETURN_IF_ERROR(r.Int("vocab_size", true, &c->vocab_size, 1, kMaxVocab));
  GLM_RETURN_IF_ERROR(r.Int("hidden_size", true, &c->hidden_size, 1, kMaxWidth));
  GLM_RETURN_IF_ERROR(r.Int("intermediate_size", true, &c->intermediate_size, 1, kMaxFfn));
  GLM_RETURN_IF_ERROR(r.Int("moe_intermediate_size", true, &c->moe_intermediate_size, 1, kMaxFfn));
  GLM_RETURN_IF_ERROR(r.Int32("num_hidden_layers", true, &c->num_hidden_layers, 1, kMaxLayers));
  GLM_RETURN_IF_ERROR(r.Int32("num_attention_heads", true, &c->num_attention_heads, 1, kMaxHeads));
  c->num_key_value_heads = c->num_attention_heads;
  GLM_RETURN_IF_ERROR(r.Int32("num_key_value_heads", false, &c->num_key_value_heads, 1, kMaxHeads));
  GLM_RETURN_IF_ERROR(r.Int("q_lora_rank", true, &c->q_lora_rank, 1, kMaxWidth));
  GLM_RETURN_IF_ERROR(r.Int("kv_lora_rank", true, &c->kv_lora_rank, 1, kMaxWidth));
  GLM_RETURN_IF_ERROR(r.Int("qk_nope_head_dim", true, &c->qk_nope_head_dim, 1, kMaxHeadDim));
  GLM_RETURN_IF_ERROR(r.Int("qk_rope_head_dim", true, &c->qk_rope_head_dim, 2, kMaxHeadDim));
  GLM_RETURN_IF_ERROR(r.Int("v_head_dim", true, &c->v_head_dim, 1, kMaxHeadDim));
  GLM_RETURN_IF_ERROR(r.Int32("index_n_heads", true, &c->index_n_heads, 1, kMaxHeads));
  GLM_RETURN_IF_ERROR(r.Int("index_head_dim", true, &c->index_head_dim, 1, kMaxHeadDim));
  GLM_RETURN_IF_ERROR(r.Int("index_topk", true, &c->index_topk, 1, kMaxPositions));
  GLM_RETURN_IF_ERROR(
      r.Int("max_position_embeddings", true, &c->max_position_embeddings, 1, kMaxPositions));
  GLM_RETURN_IF_ERROR(r.Int32("n_routed_experts", true, &c->n_routed_experts, 1, kMaxExperts));
  GLM_RETURN_IF_ERROR(r.Int32("num_experts_per_tok", true, &c->num_experts_per_tok, 1, kMaxExperts));

  // Optional with HF defaults (HF-cfg).
  c->n_shared_experts = 1;
  GLM_RETURN_IF_ERROR(r.Int32("n_shared_experts", false, &c->n_shared_experts, 0, 64));
  c->routed_scaling_factor = 2.5;
  GLM_RETURN_IF_ERROR(r.Double("routed_scaling_factor", &c->routed_scaling_factor, true));
  c->n_group = 1;
  c->topk_group = 1;
  GLM_RETURN_IF_ERROR(r.Int32("n_group", false, &c->n_group, 1));
  GLM_RETURN_IF_ERROR(r.Int32("topk_group", false, &c->topk_group, 1));
  GLM_RETURN_IF_ERROR(r.Bool("norm_topk_prob", &c->norm_topk_prob));
  c->first_k_dense_replace = 3;
  GLM_RETURN_IF_ERROR(r.Int32("first_k_dense_replace", false, &c->first_k_dense_replace, 0));
  c->num_nextn_predict_layers = 0;
  GLM_RETURN_IF_ERROR(
      r.Int32("num_nextn_predict_layers", false, &c->num_nextn_predict_layers, 0, 16));
  GLM_RETURN_IF_ERROR(r.Double("rms_norm_eps", &c->rms_norm_eps, true));
  GLM_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c->tie_word_embeddings));
  if (r.Has("dtype")) {
    GLM_RETURN_IF_ERROR(r.String("dtype", &c->torch_dtype));
  } else {
    GLM_RETURN_IF_ERROR(r.String("torch_dtype", &c->torch_dtype));
  }

  // Things the engine implements one way only.
  GLM_RETURN_IF_ERROR(r.OneOf("hidden_act", {"silu"}));
  GLM_RETURN_IF_ERROR(r.OneOf("scoring_func", {"sigmoid"}));
  GLM_RETURN_IF_ERROR(r.OneOf("topk_method", {"noaux_tc"}));
  bool bias = false;
  GLM_RETURN_IF_ERROR(r.Bool("attention_bias", &bias));
  if (bias) return r.Error("attention_bias", "got true", "false (GLM-5 linears have no bias)");
  GLM_RETURN_IF_ERROR(r.Bool("mlp_bias", &bias));
  if (bias) return r.Error("mlp_bias", "got true", "false (GLM-5 linears have no bias)");
  int64_t moe_layer_freq = 1;
  GLM_RETURN_IF_ERROR(r.Int("moe_layer_freq", false, &moe_layer_freq, 1));
  if (moe_layer_freq != 1) {
    return r.Error("moe_layer_freq", absl::StrCat("got ", moe_layer_freq),
                   "1 (every layer after first_k_dense_replace is MoE)");
  }

  // Cross-field consistency.
  if (c->n_group != 1) {
    return r.Error("n_group", absl::StrCat("got ", c->n_group),
                   "1 (group-limited routing is not supported)");
  }
  if (c->topk_group != 1) {
    return r.Error("topk_group", absl::StrCat("got ", c->topk_group), "1 (n_group is 1)");
  }
  if (c->num_experts_per_tok > c->n_routed_experts) {
    return r.Error("num_experts_per_tok",
                   absl::StrCat(c->num_experts_per_tok, " is more than n_routed_experts = ",
                                c->n_routed_experts),
                   "at most n_routed_experts");
  }
  if (c->first_k_dense_replace > c->num_hidden_layers) {
    return r.Error("first_k_dense_replace",
                   absl::StrCat(c->first_k_dense_replace, " is more than num_hidden_layers = ",
                                c->num_hidden_layers),
                   "at most num_hidden_layers");
  }
  if (c->num_key_value_heads > c->num_attention_heads) {
    return r.Error("num_key_value_heads",
                   absl::StrCat(c->num_key_value_heads, " is more than num_attention_heads = ",
                                c->num_attention_heads),
                   "at most num_attention_heads");
  }
  if (c->qk_rope_head_dim % 2 != 0) {
    return r.Error("qk_rope_head_dim", absl::StrCat("got odd ", c->qk_rope_head_dim),
                   "an even number (RoPE rotates pairs)");
  }
  if (c->index_head_dim < c->qk_rope_head_dim) {
    return r.Error("index_head_dim",
                   absl::StrCat(c->index_head_dim, " is less than qk_rope_head_dim = ",
                                c->qk_rope_head_dim),
                   "at least qk_rope_head_dim (the first rope dims of each indexer head rotate)");
  }
  if (r.Has("qk_head_dim")) {
    int64_t qk_head_dim = 0;
    GLM_RETURN_IF_ERROR(r.Int("qk_head_dim", false, &qk_head_dim, 1));
    if (qk_head_dim != c->qk_head_dim()) {
      return r.Error("qk_head_dim", absl::StrCat("got ", qk_head_dim),
                     absl::StrCat("qk_nope_head_dim + qk_rope_head_dim = ", c->qk_head_dim()));
    }
  }
  if (c->tie_word_embeddings) {
    return r.Error("tie_word_embeddings", "got true", "false (GLM-5 has a separate lm_head)");
  }

  GLM_RETURN_IF_ERROR(ParseIndexerTypes(r, c));
  GLM_RETURN_IF_ERROR(ParseMlpLayerTypes(r, c));
  GLM_RETURN_IF_ERROR(ParseRope(r, c));
  GLM_RETURN_IF_ERROR(ParseEos(r, c));
  GLM_RETURN_IF_ERROR(ParseQuantization(r, c));
  return absl::OkStatus();
}

}  // namespace

bool ModelConfig::IsMoeLayer(int layer_idx) const {
  if (layer_idx >= num_hidden_layers) return true;
  if (layer_idx < 0) return false;
  if (static_cast<size_t>(layer_idx) < mlp_layer_types.size()) {
    return mlp_layer_types[layer_idx] == MlpType::kSparse;
  }
  return layer_idx >= first_k_dense_replace;
}

bool ModelConfig::HasIndexer(int layer_idx) const {
  if (layer_idx >= num_hidden_layers) return true;
  if (layer_idx < 0) return false;
  if (static_cast<size_t>(layer_idx) < indexer_types.size()) {
    return indexer_types[layer_idx] == IndexerType::kFull;
  }
  return true;
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view source) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(source), ": not valid JSON (", e.what(),
                     "); expected a Hugging Face config.json object"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        ToAbsl(source), ": top level is ", root.type_name(),
        "; expected a Hugging Face config.json object"));
  }
  ModelConfig config;
  GLM_RETURN_IF_ERROR(ParseRoot(root, source, &config));
  return config;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  std::string dir = model_dir;
  if (!dir.empty() && dir.back() != '/') dir += '/';
  const std::string path = dir + "config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        path, ": cannot open; expected the model directory to hold a Hugging Face config.json"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  GLM_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(buffer.str(), path));

  const std::string hf_quant_path = dir + "hf_quant_config.json";
  std::ifstream hf_quant(hf_quant_path, std::ios::binary);
  if (!hf_quant) return config;
  std::stringstream hf_quant_text;
  hf_quant_text << hf_quant.rdbuf();
  GLM_ASSIGN_OR_RETURN(QuantizationConfig q, ParseHfQuantConfig(hf_quant_text.str(), hf_quant_path));
  if (config.quantization.has_value() && config.quantization->method != q.method) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": field `quantization_config.quant_method`: \"", config.quantization->quant_method,
        "\" disagrees with ", hf_quant_path, " (", q.Describe(),
        "); expected both to describe the same checkpoint: remove the stale file"));
  }
  config.quantization = std::move(q);
  return config;
}

}  // namespace glm::engine
