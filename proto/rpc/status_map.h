// The one place absl::Status and grpc::Status are mapped onto each other (codes match 1:1).
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace glm::rpc {

grpc::Status ToGrpc(const absl::Status& status);
absl::Status ToAbsl(const grpc::Status& status);

}  // namespace glm::rpc
