#include "engine/weights/tensor_view.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace glm::engine {

int64_t TensorView::num_elements() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace glm::engine
