#include "controller/gateway/openai/errors.h"

#include <gtest/gtest.h>

namespace glm::openai {
namespace {

TEST(ErrorsTest, TypeFollowsStatus) {
  EXPECT_EQ(ErrorTypeForStatus(400), "BadRequestError");
  EXPECT_EQ(ErrorTypeForStatus(401), "AuthenticationError");
  EXPECT_EQ(ErrorTypeForStatus(404), "NotFoundError");
  EXPECT_EQ(ErrorTypeForStatus(413), "BadRequestError");
  EXPECT_EQ(ErrorTypeForStatus(429), "RateLimitError");
  EXPECT_EQ(ErrorTypeForStatus(500), "InternalServerError");
  EXPECT_EQ(ErrorTypeForStatus(502), "InternalServerError");
  EXPECT_EQ(ErrorTypeForStatus(503), "ServiceUnavailableError");
  EXPECT_EQ(ErrorTypeForStatus(418), "BadRequestError");
}

TEST(ErrorsTest, HelpersSetStatusTypeAndParam) {
  ApiError bad = BadRequest("n", "only n=1 is supported");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.type, "BadRequestError");
  EXPECT_EQ(bad.param, "n");
  EXPECT_EQ(NotFound("model", "no such model").status, 404);
  EXPECT_EQ(NotFound("model", "no such model").type, "NotFoundError");
  EXPECT_EQ(PayloadTooLarge("too big").status, 413);
  EXPECT_EQ(RateLimited("busy").type, "RateLimitError");
  EXPECT_EQ(InternalError("oops").status, 500);
  EXPECT_EQ(Unavailable("draining").type, "ServiceUnavailableError");
}

TEST(ErrorsTest, BodyIsTheEnvelopeWithNullParamWhenEmpty) {
  EXPECT_EQ(ErrorBody(BadRequest("n", "only n=1 is supported")),
            R"({"error":{"message":"only n=1 is supported","type":"BadRequestError",)"
            R"("param":"n","code":400}})");
  EXPECT_EQ(ErrorBody(Unavailable("draining")),
            R"({"error":{"message":"draining","type":"ServiceUnavailableError","param":null,)"
            R"("code":503}})");
  // A hand-built error without a type gets the one of its status.
  EXPECT_EQ(ErrorBody(ApiError{429, "", "slow down", ""}),
            R"({"error":{"message":"slow down","type":"RateLimitError","param":null,"code":429}})");
}

TEST(ErrorsTest, ResultHoldsValueOrError) {
  Result<int> value = 7;
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(value.value(), 7);
  Result<int> error = BadRequest("x", "bad x");
  ASSERT_FALSE(error.ok());
  EXPECT_EQ(error.error().param, "x");
}

}  // namespace
}  // namespace glm::openai
