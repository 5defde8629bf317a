// Predicates choosing which checkpoint tensors a WeightStore opens (a pipeline stage's layers).
#pragma once

#include <functional>
#include <optional>
#include <string_view>

namespace glm::engine {

// True for the tensor names to load. An empty std::function means "all tensors".
using TensorFilter = std::function<bool(std::string_view name)>;

// The layer index of "model.layers.<N>.<...>", or nullopt for other names.
std::optional<int> LayerIndexOf(std::string_view name);

// Which tensors a pipeline stage needs.
struct LayerSelection {
  int first_layer = 0;   // inclusive
  int last_layer = -1;   // inclusive; last_layer < first_layer selects no decoder layers
  bool embedding = false;  // model.embed_tokens.*
  bool head = false;       // model.norm.* and lm_head.*
  // MTP layers are stored as model.layers.<N> with N >= num_hidden_layers. When
  // num_hidden_layers >= 0 the range [first_layer, last_layer] is clipped to the decoder layers
  // and `mtp` alone decides whether every layer N >= num_hidden_layers is included. When
  // num_hidden_layers < 0 (unknown) MTP layers are selected only by the range.
  int num_hidden_layers = -1;
  bool mtp = false;
};

// model.layers.{first_layer..last_layer}.* (inclusive; MTP layers too when their index falls in
// the range), plus embed_tokens when `embedding` and model.norm / lm_head when `head`.
// Example: the last stage of a 78-layer model with its MTP layer:
//   LayerRangeFilter(60, 78, /*embedding=*/true, /*head=*/true)
// (the MTP layer needs the embedding and the head as well).
TensorFilter LayerRangeFilter(int first_layer, int last_layer, bool embedding, bool head);
TensorFilter LayerRangeFilter(const LayerSelection& selection);

}  // namespace glm::engine
