// Weight quantization a checkpoint declares, from config.json `quantization_config` or ModelOpt's
// hf_quant_config.json. Formats and tensor layouts: ../shared/specs/quantized-checkpoints.md.
//
//   fp8                 quant_method "fp8": e4m3 weights with 128x128 block scales
//                       ("<m>.weight_scale_inv"), spec glm5-architecture.md §4.
//   compressed-tensors  quant_method "compressed-tensors", format "pack-quantized": symmetric
//                       INT4/INT8 packed into I32 ("<m>.weight_packed", "<m>.weight_scale",
//                       "<m>.weight_shape"), one scale per `group_size` inputs or per output
//                       channel. config_groups[*].targets choose the modules (plain names, the
//                       class name "Linear" = every linear module, or "re:<regex>" matched from
//                       the start of the name as Python's re.match does); `ignore` wins.
//   modelopt NVFP4      hf_quant_config.json quantization.quant_algo "NVFP4", or config.json
//                       quant_method "modelopt" + quant_algo "NVFP4": e2m1 weights (U8, two per
//                       byte), E4M3 scales per 16 inputs, an F32 per-tensor weight_scale_2 and a
//                       static input_scale. exclude_modules / ignore are fnmatch globs.
//
// Anything else (zero points, activation ordering, float groups, activation quantization, other
// bit widths, strategies or formats) is refused at parse time with the field, its value and what
// is supported. Immutable after parsing; copies share compiled patterns; thread-safe to read.
#pragma once

#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace glm::engine {

enum class QuantMethod {
  kFp8Block,       // quant_method "fp8"
  kPackQuantized,  // compressed-tensors pack-quantized INT4/INT8
  kNvfp4,          // ModelOpt NVFP4
};

// A module-name pattern as written in a checkpoint's config.
class ModulePattern {
 public:
  enum class Kind {
    kExact,      // the whole module name
    kClassName,  // compressed-tensors "Linear": every linear module
    kRegex,      // compressed-tensors "re:<regex>", anchored at the start only (re.match)
    kGlob,       // ModelOpt fnmatch glob: '*' and '?' match any characters including '.'
  };
  // `text` as written; `plain` is how a pattern without "re:" is read (kExact for
  // compressed-tensors, kGlob for ModelOpt). kInvalidArgument (naming `field`) for a regex that
  // does not compile.
  static absl::StatusOr<ModulePattern> Parse(std::string text, Kind plain,
                                             std::string_view field);
  bool Matches(std::string_view module) const;
  const std::string& text() const { return text_; }
  Kind kind() const { return kind_; }

 private:
  std::string text_;
  Kind kind_ = Kind::kExact;
  std::shared_ptr<const std::regex> regex_;
};

// One scheme of quantized modules: a compressed-tensors config_group, or ModelOpt's NVFP4.
struct QuantGroup {
  std::string name;                    // config_groups key; "NVFP4" for ModelOpt
  std::vector<ModulePattern> targets;  // empty: every module not ignored (ModelOpt)
  int num_bits = 4;                    // 4 or 8 (INT); 4 for NVFP4 (e2m1)
  int group_size = 128;                // inputs per scale; 0 = one scale per output channel
};

struct QuantizationConfig {
  std::string quant_method;   // as written: "fp8", "compressed-tensors", "modelopt"
  QuantMethod method = QuantMethod::kFp8Block;
  std::string source;         // the file it was read from, for messages
  // fp8
  std::string fmt = "e4m3";
  int block_rows = 128;       // weight_block_size[0]
  int block_cols = 128;       // weight_block_size[1]
  std::vector<std::string> modules_to_not_convert;
  // compressed-tensors and ModelOpt
  std::vector<QuantGroup> groups;      // in file order; the first matching group wins
  std::vector<ModulePattern> ignore;   // CT `ignore`, ModelOpt `exclude_modules` / `ignore`
  std::string kv_cache_quant_algo;     // ModelOpt, informational ("FP8" or "")

  // The group that quantizes linear module `module` ("model.layers.3.mlp.experts.0.up_proj"),
  // or nullptr when it is ignored or not targeted. Always nullptr for fp8 (the tensors say).
  // When several groups target it, an exact name beats a regex beats "Linear", then file order
  // (GroupsOf lists them all in that order).
  const QuantGroup* GroupOf(std::string_view module) const;
  std::vector<const QuantGroup*> GroupsOf(std::string_view module) const;
  // The ignore pattern matching `module`, or nullptr.
  const ModulePattern* IgnoredBy(std::string_view module) const;
  // "compressed-tensors pack-quantized" / "ModelOpt NVFP4" / "fp8 block" for messages.
  std::string Describe() const;
};

// Parses config.json's `quantization_config` object (JSON text of that object). Messages read
// "<source>: field `quantization_config.<f>`: <what>; expected <supported>".
absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(std::string_view object_json,
                                                           std::string_view source);

// Parses ModelOpt's hf_quant_config.json (the whole file's text).
absl::StatusOr<QuantizationConfig> ParseHfQuantConfig(std::string_view json_text,
                                                      std::string_view source);

}  // namespace glm::engine
