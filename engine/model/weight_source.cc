#include "engine/model/weight_source.h"

#include "absl/strings/str_cat.h"

namespace glm::engine {

absl::StatusOr<std::vector<float>> InMemoryWeights::ReadFloat(const std::string& name,
                                                              std::vector<int64_t>* shape) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor ", name, " is not in the weight set"));
  }
  if (shape != nullptr) *shape = it->second.shape;
  return it->second.data;
}

}  // namespace glm::engine
