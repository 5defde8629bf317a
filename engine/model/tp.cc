#include "engine/model/tp.h"

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "engine/backend/backend.h"
#include "engine/dist/communicator.h"

namespace glm::engine {

void TpGroup::AllReduce(Backend* backend, const MatView& x) {
  if (size_ == 1) return;
  const size_t count = static_cast<size_t>(x.rows * x.cols);
  if (count == 0) return;
  if (x.ld != x.cols) {  // a programming error: the layers reduce workspace matrices
    if (status_.ok()) {
      status_ = absl::InternalError(absl::StrCat(
          "TP all-reduce of a [", x.rows, ", ", x.cols, "] view with row stride ", x.ld,
          "; it needs contiguous rows"));
    }
    return;
  }
  absl::Status st;
  if (comm_->DeviceMemory()) {
    if (backend->HostMemory()) {  // a setup error: the transport decision never picks this
      st = absl::FailedPreconditionError(absl::StrCat(
          "the TP communicator takes device memory but the ", backend->name(),
          " backend's memory is host memory"));
    } else {
      st = comm_->AllReduceSum(x.data, count);
      pending_ = pending_ || st.ok();
    }
  } else if (backend->HostMemory()) {
    st = comm_->AllReduceSum(x.data, count);
  } else {
    staging_.resize(count);
    backend->CopyToHost(staging_.data(), x.data, count * sizeof(float));
    st = comm_->AllReduceSum(staging_.data(), count);
    if (st.ok()) backend->CopyToDevice(x.data, staging_.data(), count * sizeof(float));
  }
  if (!st.ok() && status_.ok()) {
    status_ = Annotate(st, absl::StrCat("TP all-reduce on rank ", rank_, " of ", size_));
  }
}

const absl::Status& TpGroup::Finish() {
  if (!pending_) return status_;
  pending_ = false;
  if (!status_.ok()) return status_;
  if (absl::Status st = comm_->Synchronize(); !st.ok()) {
    status_ = Annotate(st, absl::StrCat("TP all-reduce on rank ", rank_, " of ", size_,
                                        " (waiting for the step's collectives)"));
  }
  return status_;
}

}  // namespace glm::engine
