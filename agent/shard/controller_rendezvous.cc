#include "agent/shard/controller_rendezvous.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/rpc/status_map.h"

namespace glm::agent {
namespace {

using Clock = std::chrono::steady_clock;

// A controller that is restarting or not listening yet: worth retrying while time is left.
bool Transient(const grpc::Status& s) { return s.error_code() == grpc::StatusCode::UNAVAILABLE; }

constexpr std::chrono::milliseconds kRetryPause{100};

}  // namespace

ControllerRendezvous::ControllerRendezvous(const std::string& address,
                                           std::shared_ptr<grpc::ChannelCredentials> credentials,
                                           std::string name_space)
    : ControllerRendezvous(
          grpc::CreateChannel(address, credentials ? std::move(credentials)
                                                   : grpc::InsecureChannelCredentials()),
          address, std::move(name_space)) {}

ControllerRendezvous::ControllerRendezvous(std::shared_ptr<grpc::Channel> channel,
                                           std::string address, std::string name_space)
    : address_(std::move(address)),
      name_space_(std::move(name_space)),
      stub_(glm::v1::Controller::NewStub(std::move(channel))) {}

std::string ControllerRendezvous::Where(const std::string& key) const {
  return absl::StrCat("rendezvous key '", key, "' in namespace '", name_space_,
                      "' on the controller at ", address_);
}

absl::Status ControllerRendezvous::Put(const std::string& key, std::string value) {
  glm::v1::RendezvousPutRequest req;
  req.set_namespace_(name_space_);
  req.set_key(key);
  req.set_value(std::move(value));
  const Clock::time_point deadline = Clock::now() + kRpcTimeout;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
    glm::v1::RendezvousPutResponse resp;
    grpc::Status s = stub_->RendezvousPut(&ctx, req, &resp);
    if (s.ok()) return absl::OkStatus();
    if (!Transient(s) || Clock::now() + kRetryPause >= deadline) {
      absl::Status st = rpc::ToAbsl(s);
      return absl::Status(st.code(), absl::StrCat("Put of ", Where(key), ": ", st.message()));
    }
    std::this_thread::sleep_for(kRetryPause);
  }
}

absl::StatusOr<std::string> ControllerRendezvous::Get(const std::string& key,
                                                      std::chrono::milliseconds wait) {
  wait = std::max(wait, std::chrono::milliseconds(0));
  const Clock::time_point deadline = Clock::now() + wait;
  while (true) {
    const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - Clock::now()),
                               std::chrono::milliseconds(0));
    glm::v1::RendezvousGetRequest req;
    req.set_namespace_(name_space_);
    req.set_key(key);
    req.set_wait_ms(left.count());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + left + kRpcTimeout);
    glm::v1::RendezvousGetResponse resp;
    grpc::Status s = stub_->RendezvousGet(&ctx, req, &resp);
    if (s.ok()) return std::move(*resp.mutable_value());
    if (Transient(s) && Clock::now() + kRetryPause < deadline) {
      std::this_thread::sleep_for(kRetryPause);
      continue;
    }
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || Transient(s)) {
      return absl::DeadlineExceededError(
          absl::StrCat(Where(key), " did not appear within ", wait.count(), " ms (",
                       s.error_message(), "): a rank of the group did not start or cannot "
                       "reach the controller"));
    }
    absl::Status st = rpc::ToAbsl(s);
    return absl::Status(st.code(), absl::StrCat("Get of ", Where(key), ": ", st.message()));
  }
}

void ControllerRendezvous::DeleteNamespace() {
  glm::v1::RendezvousDeleteRequest req;
  req.set_namespace_(name_space_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  glm::v1::RendezvousDeleteResponse resp;
  (void)stub_->RendezvousDelete(&ctx, req, &resp);
}

}  // namespace glm::agent
