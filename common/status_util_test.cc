#include "common/status_util.h"

#include "gtest/gtest.h"

namespace glm {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status Quarter(int x, int* out) {
  GLM_ASSIGN_OR_RETURN(int half, Half(x));
  GLM_ASSIGN_OR_RETURN(*out, Half(half));
  return absl::OkStatus();
}

TEST(StatusUtil, AssignOrReturnPropagatesErrors) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(Quarter(6, &out).message(), "odd");
}

TEST(StatusUtil, AnnotateKeepsCode) {
  auto s = Annotate(absl::NotFoundError("no file"), "cluster.yaml:3:5");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "cluster.yaml:3:5: no file");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

TEST(StatusUtil, EditDistance) {
  EXPECT_EQ(EditDistance("tensor", "tensr"), 1u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("pipeline", "pipeline"), 0u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

}  // namespace
}  // namespace glm
