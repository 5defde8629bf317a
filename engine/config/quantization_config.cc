#include "engine/config/quantization_config.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

using json = nlohmann::ordered_json;

constexpr char kFp8Expected[] =
    "\"fp8\" (128x128 block-scaled e4m3), \"compressed-tensors\" (pack-quantized INT4/INT8), "
    "\"modelopt\" (NVFP4) or no quantization_config (bf16)";

std::string Describe(const json& v) {
  std::string dumped = v.dump();
  if (dumped.size() > 60) dumped = dumped.substr(0, 57) + "...";
  return absl::StrCat(v.type_name(), " ", dumped);
}

// "<source>: field `<field>`: <what>; expected <expected>", as config.json errors read.
class Fields {
 public:
  Fields(std::string_view source, std::string_view prefix) : source_(source), prefix_(prefix) {}

  absl::Status Error(std::string_view field, std::string_view what,
                     std::string_view expected) const {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(source_), ": field `",
                                                   ToAbsl(Path(field)), "`: ", ToAbsl(what),
                                                   "; expected ", ToAbsl(expected)));
  }
  std::string Path(std::string_view field) const {
    return field.empty() ? std::string(prefix_) : absl::StrCat(ToAbsl(prefix_), ".", ToAbsl(field));
  }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::string prefix_;
};

const json* Member(const json& object, std::string_view key) {
  auto it = object.find(std::string(key));
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// An optional string member that must equal `want` when present (or always when `required`).
absl::Status ExpectString(const Fields& f, const json& object, std::string_view key,
                          std::string_view want, bool required, std::string_view expected) {
  const json* v = Member(object, key);
  if (v == nullptr) {
    if (required) return f.Error(key, "missing", expected);
    return absl::OkStatus();
  }
  if (!v->is_string() || v->get<std::string>() != want) {
    return f.Error(key, absl::StrCat("got ", Describe(*v)), expected);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ModulePattern>> PatternList(const Fields& f, const json& object,
                                                       std::string_view key,
                                                       ModulePattern::Kind plain) {
  std::vector<ModulePattern> out;
  const json* list = Member(object, key);
  if (list == nullptr) return out;
  if (!list->is_array()) {
    return f.Error(key, absl::StrCat("got ", Describe(*list)), "a list of module names/patterns");
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string field = f.Path(absl::StrCat(ToAbsl(key), "[", i, "]"));
    if (!(*list)[i].is_string()) {
      return Fields(f.source(), field).Error("", absl::StrCat("got ", Describe((*list)[i])),
                                             "a string");
    }
    auto pattern = ModulePattern::Parse((*list)[i].get<std::string>(), plain,
                                        absl::StrCat(f.source(), ": field `", field, "`"));
    if (!pattern.ok()) return pattern.status();
    out.push_back(std::move(pattern).value());
  }
  return out;
}

// fnmatch without FNM_PATHNAME: '*' any run (dots included), '?' one character, [set] / [!set].
bool GlobMatch(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star_p = std::string_view::npos, star_t = 0;
  auto class_match = [&](size_t at, char c, size_t* next) {
    size_t i = at + 1;
    bool negate = i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^');
    if (negate) ++i;
    bool matched = false;
    bool first = true;
    for (; i < pattern.size() && (first || pattern[i] != ']'); ++i, first = false) {
      if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
        if (pattern[i] <= c && c <= pattern[i + 2]) matched = true;
        i += 2;
      } else if (pattern[i] == c) {
        matched = true;
      }
    }
    if (i >= pattern.size()) return -1;  // no closing ']': the '[' is a literal
    *next = i + 1;
    return matched != negate ? 1 : 0;
  };
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star_p = p++;
      star_t = t;
      continue;
    }
    if (p < pattern.size()) {
      if (pattern[p] == '?') {
        ++p;
        ++t;
        continue;
      }
      if (pattern[p] == '[') {
        size_t next = 0;
        const int m = class_match(p, text[t], &next);
        if (m == 1) {
          p = next;
          ++t;
          continue;
        }
        if (m == -1 && text[t] == '[') {
          ++p;
          ++t;
          continue;
        }
      } else if (pattern[p] == text[t]) {
        ++p;
        ++t;
        continue;
      }
    }
    if (star_p == std::string_view::npos) return false;
    p = star_p + 1;
    t = ++star_t;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

absl::StatusOr<QuantizationConfig> ParseFp8(const json& q, const Fields& f,
                                           QuantizationConfig out) {
  auto fmt = q.find("fmt");
  if (fmt != q.end() && !fmt->is_null()) {
    if (!fmt->is_string() || fmt->get<std::string>() != "e4m3") {
      return f.Error("fmt", absl::StrCat("got ", Describe(*fmt)), "\"e4m3\"");
    }
    out.fmt = fmt->get<std::string>();
  }
  auto act = q.find("activation_scheme");
  if (act != q.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "dynamic") {
      return f.Error("activation_scheme", absl::StrCat("got ", Describe(*act)), "\"dynamic\"");
    }
  }
  auto block = q.find("weight_block_size");
  if (block == q.end() || block->is_null()) {
    return f.Error("weight_block_size", "missing",
                   "[128, 128] (per-tensor fp8 scaling is not supported)");
  }
  if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
      !(*block)[1].is_number_integer() || (*block)[0].get<int64_t>() <= 0 ||
      (*block)[1].get<int64_t>() <= 0 || (*block)[0].get<int64_t>() > 65536 ||
      (*block)[1].get<int64_t>() > 65536) {
    return f.Error("weight_block_size", absl::StrCat("got ", Describe(*block)),
                   "two positive integers, e.g. [128, 128]");
  }
  out.block_rows = static_cast<int>((*block)[0].get<int64_t>());
  out.block_cols = static_cast<int>((*block)[1].get<int64_t>());
  auto skip = q.find("modules_to_not_convert");
  if (skip != q.end() && !skip->is_null()) {
    if (!skip->is_array()) {
      return f.Error("modules_to_not_convert", absl::StrCat("got ", Describe(*skip)),
                     "a list of module names");
    }
    for (size_t i = 0; i < skip->size(); ++i) {
      if (!(*skip)[i].is_string()) {
        return f.Error(absl::StrCat("modules_to_not_convert[", i, "]"),
                       absl::StrCat("got ", Describe((*skip)[i])), "a string");
      }
      out.modules_to_not_convert.push_back((*skip)[i].get<std::string>());
    }
  }
  return out;
}

constexpr char kCtWeightsExpected[] =
    "symmetric integer weights: num_bits 4 or 8, type \"int\", symmetric true, strategy "
    "\"group\" (with group_size) or \"channel\", no actorder, dynamic false (the "
    "compressed-tensors pack-quantized W4A16/W8A16 layout)";

absl::Status ParseCtWeights(const json& w, const Fields& f, QuantGroup* group) {
  if (!w.is_object()) return f.Error("", absl::StrCat("got ", Describe(w)), kCtWeightsExpected);
  const json* bits = Member(w, "num_bits");
  if (bits == nullptr || !bits->is_number_integer() ||
      (bits->get<int64_t>() != 4 && bits->get<int64_t>() != 8)) {
    return f.Error("num_bits", bits == nullptr ? "missing" : absl::StrCat("got ", Describe(*bits)),
                   "4 or 8 (INT4 / INT8 pack-quantized)");
  }
  group->num_bits = static_cast<int>(bits->get<int64_t>());
  GLM_RETURN_IF_ERROR(ExpectString(f, w, "type", "int", /*required=*/true,
                                   "\"int\" (float/FP8/FP4 groups are not supported in "
                                   "pack-quantized checkpoints)"));
  const json* sym = Member(w, "symmetric");
  if (sym == nullptr || !sym->is_boolean() || !sym->get<bool>()) {
    return f.Error("symmetric", sym == nullptr ? "missing" : absl::StrCat("got ", Describe(*sym)),
                   "true (asymmetric weights with zero points are not supported)");
  }
  if (const json* zp = Member(w, "zero_point"); zp != nullptr) {
    return f.Error("zero_point", absl::StrCat("got ", Describe(*zp)),
                   "absent (zero points are not supported)");
  }
  if (const json* dynamic = Member(w, "dynamic");
      dynamic != nullptr && !(dynamic->is_boolean() && !dynamic->get<bool>())) {
    return f.Error("dynamic", absl::StrCat("got ", Describe(*dynamic)),
                   "false (static weight scales)");
  }
  if (const json* actorder = Member(w, "actorder");
      actorder != nullptr && !(actorder->is_boolean() && !actorder->get<bool>())) {
    return f.Error("actorder", absl::StrCat("got ", Describe(*actorder)),
                   "null (activation ordering / g_idx is not supported)");
  }
  if (const json* block = Member(w, "block_structure"); block != nullptr) {
    return f.Error("block_structure", absl::StrCat("got ", Describe(*block)),
                   "null (block strategies are not supported; use group or channel)");
  }
  const json* strategy = Member(w, "strategy");
  if (strategy == nullptr || !strategy->is_string()) {
    return f.Error("strategy",
                   strategy == nullptr ? "missing" : absl::StrCat("got ", Describe(*strategy)),
                   "\"group\" or \"channel\"");
  }
  const json* size = Member(w, "group_size");
  if (strategy->get<std::string>() == "group") {
    if (size == nullptr || !size->is_number_integer() || size->get<int64_t>() <= 0 ||
        size->get<int64_t>() > (int64_t{1} << 20)) {
      return f.Error("group_size",
                     size == nullptr ? "missing" : absl::StrCat("got ", Describe(*size)),
                     "a positive group size (e.g. 128) for strategy \"group\"");
    }
    group->group_size = static_cast<int>(size->get<int64_t>());
  } else if (strategy->get<std::string>() == "channel") {
    if (size != nullptr && !(size->is_number_integer() && size->get<int64_t>() == -1)) {
      return f.Error("group_size", absl::StrCat("got ", Describe(*size)),
                     "null or -1 for strategy \"channel\"");
    }
    group->group_size = 0;
  } else {
    return f.Error("strategy", absl::StrCat("got ", Describe(*strategy)),
                   "\"group\" or \"channel\" (tensor, block and token strategies are not "
                   "supported)");
  }
  return absl::OkStatus();
}

absl::StatusOr<QuantizationConfig> ParseCompressedTensors(const json& q, const Fields& f,
                                                         QuantizationConfig out) {
  out.method = QuantMethod::kPackQuantized;
  constexpr char kFormatExpected[] =
      "\"pack-quantized\" (other compressed-tensors formats are not supported)";
  const json* format = Member(q, "format");
  if (format != nullptr && (!format->is_string() || format->get<std::string>() != "pack-quantized")) {
    return f.Error("format", absl::StrCat("got ", Describe(*format)), kFormatExpected);
  }
  if (const json* kv = Member(q, "kv_cache_scheme"); kv != nullptr) {
    return f.Error("kv_cache_scheme", absl::StrCat("got ", Describe(*kv)),
                   "null (the KV cache dtype is chosen at serve time: model.kv_cache_dtype)");
  }
  if (const json* sparsity = Member(q, "sparsity_config");
      sparsity != nullptr && !(sparsity->is_object() && sparsity->empty())) {
    return f.Error("sparsity_config", absl::StrCat("got ", Describe(*sparsity)),
                   "null (sparse compressed formats are not supported)");
  }
  const json* groups = Member(q, "config_groups");
  if (groups == nullptr || !groups->is_object() || groups->empty()) {
    return f.Error("config_groups",
                   groups == nullptr ? "missing" : absl::StrCat("got ", Describe(*groups)),
                   "an object of named groups, each {targets, weights}");
  }
  for (auto it = groups->begin(); it != groups->end(); ++it) {
    const Fields g(f.source(), f.Path(absl::StrCat("config_groups.", it.key())));
    const json& group_json = it.value();
    if (!group_json.is_object()) {
      return g.Error("", absl::StrCat("got ", Describe(group_json)), "an object {targets, weights}");
    }
    QuantGroup group;
    group.name = it.key();
    if (const json* gf = Member(group_json, "format");
        gf != nullptr && (!gf->is_string() || gf->get<std::string>() != "pack-quantized")) {
      return g.Error("format", absl::StrCat("got ", Describe(*gf)), kFormatExpected);
    }
    if (format == nullptr && Member(group_json, "format") == nullptr) {
      return f.Error("format", "missing", kFormatExpected);
    }
    for (const char* key : {"input_activations", "output_activations"}) {
      if (const json* act = Member(group_json, key); act != nullptr) {
        return g.Error(key, absl::StrCat("got ", Describe(*act)),
                       "null (weight-only quantization; activations stay bf16)");
      }
    }
    const json* targets = Member(group_json, "targets");
    if (targets == nullptr || !targets->is_array() || targets->empty()) {
      return g.Error("targets",
                     targets == nullptr ? "missing" : absl::StrCat("got ", Describe(*targets)),
                     "a non-empty list of module names or \"re:\" regexes");
    }
    GLM_ASSIGN_OR_RETURN(group.targets,
                         PatternList(g, group_json, "targets", ModulePattern::Kind::kExact));
    const json* weights = Member(group_json, "weights");
    if (weights == nullptr) return g.Error("weights", "missing", kCtWeightsExpected);
    GLM_RETURN_IF_ERROR(ParseCtWeights(*weights, Fields(f.source(), g.Path("weights")), &group));
    out.groups.push_back(std::move(group));
  }
  GLM_ASSIGN_OR_RETURN(out.ignore, PatternList(f, q, "ignore", ModulePattern::Kind::kExact));
  return out;
}

// The NVFP4 fields shared by hf_quant_config.json's `quantization` and config.json's modelopt
// `quantization_config`: quant_algo, group_size, kv_cache_quant_algo and the exclude globs
// under `exclude_key`.
absl::StatusOr<QuantizationConfig> ParseModelOpt(const json& q, const Fields& f,
                                                 std::string_view exclude_key,
                                                 QuantizationConfig out) {
  out.method = QuantMethod::kNvfp4;
  const json* algo = Member(q, "quant_algo");
  if (algo == nullptr || !algo->is_string() || algo->get<std::string>() != "NVFP4") {
    return f.Error("quant_algo", algo == nullptr ? "missing" : absl::StrCat("got ", Describe(*algo)),
                   "\"NVFP4\" (ModelOpt FP8, MIXED_PRECISION and other algorithms are not "
                   "supported)");
  }
  if (const json* size = Member(q, "group_size");
      size != nullptr && !(size->is_number_integer() && size->get<int64_t>() == 16)) {
    return f.Error("group_size", absl::StrCat("got ", Describe(*size)), "16 (NVFP4 block size)");
  }
  if (const json* kv = Member(q, "kv_cache_quant_algo"); kv != nullptr) {
    if (!kv->is_string()) {
      return f.Error("kv_cache_quant_algo", absl::StrCat("got ", Describe(*kv)),
                     "a string such as \"FP8\", or null");
    }
    out.kv_cache_quant_algo = kv->get<std::string>();
  }
  QuantGroup group;
  group.name = "NVFP4";
  group.num_bits = 4;
  group.group_size = 16;
  out.groups.push_back(std::move(group));
  GLM_ASSIGN_OR_RETURN(out.ignore, PatternList(f, q, exclude_key, ModulePattern::Kind::kGlob));
  return out;
}

absl::StatusOr<json> ParseJson(std::string_view text, std::string_view source,
                               std::string_view what) {
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(source), ": not valid JSON (", e.what(),
                                                   "); expected ", ToAbsl(what)));
  }
  return root;
}

}  // namespace

absl::StatusOr<ModulePattern> ModulePattern::Parse(std::string text, Kind plain,
                                                   std::string_view field) {
  ModulePattern p;
  if (text.rfind("re:", 0) == 0) {
    p.kind_ = Kind::kRegex;
    try {
      p.regex_ = std::make_shared<const std::regex>(text.substr(3), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          ToAbsl(field), ": regex \"", text.substr(3), "\" does not compile (", e.what(),
          "); expected an ECMAScript-compatible regex (no (?P<name>) groups or inline flags)"));
    }
  } else if (plain == Kind::kExact && text == "Linear") {
    p.kind_ = Kind::kClassName;
  } else {
    p.kind_ = plain;
  }
  p.text_ = std::move(text);
  return p;
}

bool ModulePattern::Matches(std::string_view module) const {
  switch (kind_) {
    case Kind::kExact:
      return module == text_;
    case Kind::kClassName:
      return true;
    case Kind::kRegex:
      return std::regex_search(module.begin(), module.end(), *regex_,
                               std::regex_constants::match_continuous);
    case Kind::kGlob:
      return GlobMatch(text_, module);
  }
  return false;
}

const ModulePattern* QuantizationConfig::IgnoredBy(std::string_view module) const {
  for (const ModulePattern& p : ignore) {
    if (p.Matches(module)) return &p;
  }
  return nullptr;
}

std::vector<const QuantGroup*> QuantizationConfig::GroupsOf(std::string_view module) const {
  std::vector<const QuantGroup*> out;
  if (method == QuantMethod::kFp8Block || IgnoredBy(module) != nullptr) return out;
  // Specificity of the best target of each group: 0 exact, 1 regex/glob, 2 class, 3 untargeted.
  std::vector<std::pair<int, const QuantGroup*>> ranked;
  for (const QuantGroup& g : groups) {
    int best = g.targets.empty() ? 3 : 4;
    for (const ModulePattern& t : g.targets) {
      if (!t.Matches(module)) continue;
      const int rank = t.kind() == ModulePattern::Kind::kExact       ? 0
                       : t.kind() == ModulePattern::Kind::kClassName ? 2
                                                                     : 1;
      best = std::min(best, rank);
    }
    if (best < 4) ranked.emplace_back(best, &g);
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [rank, g] : ranked) out.push_back(g);
  return out;
}

const QuantGroup* QuantizationConfig::GroupOf(std::string_view module) const {
  std::vector<const QuantGroup*> all = GroupsOf(module);
  return all.empty() ? nullptr : all.front();
}

std::string QuantizationConfig::Describe() const {
  switch (method) {
    case QuantMethod::kFp8Block:
      return "fp8 block-scaled";
    case QuantMethod::kPackQuantized:
      return "compressed-tensors pack-quantized";
    case QuantMethod::kNvfp4:
      return "ModelOpt NVFP4";
  }
  return quant_method;
}

absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(std::string_view object_json,
                                                           std::string_view source) {
  const Fields f(source, "quantization_config");
  GLM_ASSIGN_OR_RETURN(json q, ParseJson(object_json, source, "a quantization_config object"));
  if (!q.is_object()) {
    return f.Error("", absl::StrCat("got ", Describe(q)),
                   absl::StrCat("an object with quant_method ", kFp8Expected));
  }
  QuantizationConfig out;
  out.source = std::string(source);
  const json* method = Member(q, "quant_method");
  if (method == nullptr || !method->is_string()) {
    return f.Error("quant_method", "missing or not a string", kFp8Expected);
  }
  out.quant_method = method->get<std::string>();
  if (out.quant_method == "fp8") return ParseFp8(q, f, std::move(out));
  if (out.quant_method == "compressed-tensors") {
    return ParseCompressedTensors(q, f, std::move(out));
  }
  if (out.quant_method == "modelopt") {
    // Newer exports put the fields at the top; some nest hf_quant_config's `quantization`.
    if (const json* nested = Member(q, "quantization");
        nested != nullptr && nested->is_object() && Member(q, "quant_algo") == nullptr) {
      const Fields nf(source, "quantization_config.quantization");
      return ParseModelOpt(*nested, nf,
                           Member(*nested, "exclude_modules") ? "exclude_modules" : "ignore",
                           std::move(out));
    }
    return ParseModelOpt(q, f, Member(q, "exclude_modules") ? "exclude_modules" : "ignore",
                         std::move(out));
  }
  return f.Error("quant_method", absl::StrCat("unsupported method \"", out.quant_method, "\""),
                 kFp8Expected);
}

absl::StatusOr<QuantizationConfig> ParseHfQuantConfig(std::string_view json_text,
                                                      std::string_view source) {
  GLM_ASSIGN_OR_RETURN(json root, ParseJson(json_text, source,
                                            "ModelOpt's hf_quant_config.json object"));
  const Fields f(source, "quantization");
  const json* q = root.is_object() ? Member(root, "quantization") : nullptr;
  if (q == nullptr || !q->is_object()) {
    return f.Error("", "missing or not an object",
                   "{\"quant_algo\": \"NVFP4\", \"group_size\": 16, \"exclude_modules\": [...]}");
  }
  QuantizationConfig out;
  out.source = std::string(source);
  out.quant_method = "modelopt";
  return ParseModelOpt(*q, f, "exclude_modules", std::move(out));
}

}  // namespace glm::engine
