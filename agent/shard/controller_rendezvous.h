// engine::Rendezvous over the controller's RendezvousPut / RendezvousGet RPCs: how the ranks of a
// shard group running in different agents find each other (controller/rendezvous is the store).
// Every key lives in one namespace, the group's key (replica and bring-up epoch), so a restarted
// group never reads a dead group's addresses.
//
// Get waits on the controller (wait_ms) with an RPC deadline a little past the wait; a controller
// that is briefly unreachable is retried until the caller's wait is spent. Errors name the
// controller address, the namespace and the key. Thread-safe (gRPC stubs are).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "engine/dist/rendezvous.h"
#include "glm/v1/controller.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"

namespace glm::agent {

class ControllerRendezvous final : public engine::Rendezvous {
 public:
  // `address`: the controller's host:port (StartShardRequest.rendezvous_address); `credentials`:
  // the node's client credentials (its cluster certificate under mTLS); null = insecure.
  ControllerRendezvous(const std::string& address,
                       std::shared_ptr<grpc::ChannelCredentials> credentials,
                       std::string name_space);
  // Over an existing channel (tests).
  ControllerRendezvous(std::shared_ptr<grpc::Channel> channel, std::string address,
                       std::string name_space);

  absl::Status Put(const std::string& key, std::string value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::milliseconds wait) override;

  // Drops the namespace on the controller (the group is gone); best effort.
  void DeleteNamespace();

  const std::string& name_space() const { return name_space_; }

  // Bound on a Put, and the slack added to a Get's wait for its RPC deadline.
  static constexpr std::chrono::milliseconds kRpcTimeout{10'000};

 private:
  std::string Where(const std::string& key) const;

  const std::string address_;
  const std::string name_space_;
  std::unique_ptr<glm::v1::Controller::Stub> stub_;
};

}  // namespace glm::agent
