// TpGroup (tp.h) on its own: which path an all-reduce takes for each pairing of backend memory
// (host / device) and communicator memory (Communicator::DeviceMemory), and Finish(), which
// waits for a device communicator's enqueued all-reduces once per step (and only then) and keeps
// its failure. The "device" backend is the CPU backend claiming device memory, so every copy it
// is asked for is counted.
#include "engine/model/tp.h"

#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/dist/testing/fake_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

using ::testing::HasSubstr;

class FakeDeviceBackend : public CpuBackend {
 public:
  FakeDeviceBackend() : CpuBackend(1) {}
  std::string name() const override { return "fake-device"; }
  bool HostMemory() const override { return false; }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    ++copies_to_host;
    CpuBackend::CopyToHost(dst, src, bytes);
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    ++copies_to_device;
    CpuBackend::CopyToDevice(dst, src, bytes);
  }
  int copies_to_host = 0;
  int copies_to_device = 0;
};

struct Mat {
  explicit Mat(int64_t rows, int64_t cols) : data(rows * cols, 1.0f) {
    view.data = data.data();
    view.rows = rows;
    view.cols = cols;
    view.ld = cols;
  }
  std::vector<float> data;
  MatView view;
};

TEST(TpGroupTest, DeviceCommunicatorReducesDeviceMemoryInPlaceWithoutHostCopies) {
  FakeDeviceBackend backend;
  FakeCommunicator comm(0, 2);
  comm.device_memory = true;
  TpGroup tp(0, 2, &comm);
  Mat x(3, 4);  // [3, 4]
  tp.AllReduce(&backend, x.view);
  tp.AllReduce(&backend, x.view);
  EXPECT_EQ(comm.num_all_reduce, 2);
  EXPECT_EQ(comm.last_all_reduce_data, x.view.data);
  EXPECT_EQ(backend.copies_to_host, 0);
  EXPECT_EQ(backend.copies_to_device, 0);
  EXPECT_EQ(comm.num_synchronize, 0);  // enqueued, not waited for
  ASSERT_TRUE(tp.Finish().ok());
  EXPECT_EQ(comm.num_synchronize, 1);  // once for the step, not per all-reduce
  ASSERT_TRUE(tp.Finish().ok());
  EXPECT_EQ(comm.num_synchronize, 1);  // nothing enqueued since: no wait
}

TEST(TpGroupTest, HostCommunicatorOnADeviceBackendStagesThroughHostMemory) {
  FakeDeviceBackend backend;
  FakeCommunicator comm(1, 2);
  TpGroup tp(1, 2, &comm);
  Mat x(2, 5);  // [2, 5]
  tp.AllReduce(&backend, x.view);
  EXPECT_EQ(comm.num_all_reduce, 1);
  EXPECT_NE(comm.last_all_reduce_data, x.view.data);  // a host copy
  EXPECT_EQ(backend.copies_to_host, 1);
  EXPECT_EQ(backend.copies_to_device, 1);
  ASSERT_TRUE(tp.Finish().ok());
  EXPECT_EQ(comm.num_synchronize, 0);  // Gloo completed inside AllReduceSum
}

TEST(TpGroupTest, HostCommunicatorOnAHostBackendReducesInPlace) {
  CpuBackend backend(1);
  FakeCommunicator comm(0, 2);
  TpGroup tp(0, 2, &comm);
  Mat x(1, 8);  // [1, 8]
  tp.AllReduce(&backend, x.view);
  EXPECT_EQ(comm.last_all_reduce_data, x.view.data);
  ASSERT_TRUE(tp.Finish().ok());
  EXPECT_EQ(comm.num_synchronize, 0);
}

TEST(TpGroupTest, DeviceCommunicatorOnAHostBackendIsAnError) {
  CpuBackend backend(1);
  FakeCommunicator comm(0, 2);
  comm.device_memory = true;
  TpGroup tp(0, 2, &comm);
  Mat x(1, 8);  // [1, 8]
  tp.AllReduce(&backend, x.view);
  EXPECT_EQ(comm.num_all_reduce, 0);
  EXPECT_THAT(tp.status().message(), HasSubstr("takes device memory"));
  EXPECT_FALSE(tp.Finish().ok());
}

TEST(TpGroupTest, FinishKeepsTheSynchronizeFailure) {
  FakeDeviceBackend backend;
  FakeCommunicator comm(1, 2);
  comm.device_memory = true;
  comm.synchronize_status = absl::UnavailableError("NCCL rank 1 of 2: asynchronous error");
  TpGroup tp(1, 2, &comm);
  Mat x(1, 8);  // [1, 8]
  tp.AllReduce(&backend, x.view);
  const absl::Status st = tp.Finish();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("TP all-reduce on rank 1 of 2"));
  EXPECT_THAT(st.message(), HasSubstr("asynchronous error"));
  // Sticky: the group is dead; later steps fail without waiting again.
  tp.AllReduce(&backend, x.view);
  EXPECT_EQ(tp.Finish().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(comm.num_synchronize, 1);
}

TEST(TpGroupTest, OneRankNeverCommunicates) {
  FakeDeviceBackend backend;
  FakeCommunicator comm(0, 1);
  comm.device_memory = true;
  TpGroup tp(0, 1, &comm);
  Mat x(2, 2);  // [2, 2]
  tp.AllReduce(&backend, x.view);
  ASSERT_TRUE(tp.Finish().ok());
  EXPECT_EQ(comm.num_all_reduce, 0);
  EXPECT_EQ(comm.num_synchronize, 0);
}

}  // namespace
}  // namespace glm::engine
