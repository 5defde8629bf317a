// A Communicator for tests of code that issues collectives (the model's TP all-reduce) without a
// group behind it: AllReduceSum leaves the data as it is (each rank's partial), counts the calls,
// notes the pointer and returns `all_reduce_status`; Synchronize counts its calls and returns
// `synchronize_status`; DeviceMemory() returns `device_memory` (a stand-in for NCCL's device
// path). The point-to-point and broadcast calls, which such code must not issue, return
// Unimplemented.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "engine/dist/communicator.h"

namespace glm::engine {

class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(int rank, int size, absl::Status all_reduce_status = absl::OkStatus())
      : rank_(rank), size_(size), all_reduce_status_(std::move(all_reduce_status)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool DeviceMemory() const override { return device_memory; }
  absl::Status AllReduceSum(float* data, size_t) override {
    ++num_all_reduce;
    last_all_reduce_data = data;
    return all_reduce_status_;
  }
  absl::Status Send(const float*, size_t, int) override { return Unused("Send"); }
  absl::Status Recv(float*, size_t, int) override { return Unused("Recv"); }
  absl::Status SendRecv(const float*, size_t, int, float*, size_t, int) override {
    return Unused("SendRecv");
  }
  absl::Status Broadcast(float*, size_t, int) override { return Unused("Broadcast"); }
  absl::Status Barrier() override { return Unused("Barrier"); }
  absl::Status Synchronize() override {
    ++num_synchronize;
    return synchronize_status;
  }

  bool device_memory = false;
  absl::Status synchronize_status;
  int num_all_reduce = 0;
  int num_synchronize = 0;
  const float* last_all_reduce_data = nullptr;

 private:
  static absl::Status Unused(const char* op) {
    return absl::UnimplementedError(std::string("FakeCommunicator: ") + op + " is not expected");
  }
  int rank_, size_;
  absl::Status all_reduce_status_;
};

}  // namespace glm::engine
