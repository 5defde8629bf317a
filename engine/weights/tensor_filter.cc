#include "engine/weights/tensor_filter.h"

#include <charconv>

namespace glm::engine {
namespace {

constexpr std::string_view kLayerPrefix = "model.layers.";

bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

}  // namespace

std::optional<int> LayerIndexOf(std::string_view name) {
  if (!StartsWith(name, kLayerPrefix)) return std::nullopt;
  std::string_view rest = name.substr(kLayerPrefix.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  const std::string_view digits = rest.substr(0, dot);
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;  // "01" is not a layer index
  int index = 0;
  auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return index;
}

TensorFilter LayerRangeFilter(const LayerSelection& selection) {
  return [selection](std::string_view name) {
    if (std::optional<int> layer = LayerIndexOf(name)) {
      if (selection.num_hidden_layers >= 0 && *layer >= selection.num_hidden_layers) {
        return selection.mtp;
      }
      return *layer >= selection.first_layer && *layer <= selection.last_layer;
    }
    if (StartsWith(name, "model.embed_tokens.")) return selection.embedding;
    if (StartsWith(name, "model.norm.") || StartsWith(name, "lm_head.")) return selection.head;
    return false;
  };
}

TensorFilter LayerRangeFilter(int first_layer, int last_layer, bool embedding, bool head) {
  LayerSelection selection;
  selection.first_layer = first_layer;
  selection.last_layer = last_layer;
  selection.embedding = embedding;
  selection.head = head;
  return LayerRangeFilter(selection);
}

}  // namespace glm::engine
