#include "agent/shard/releasing_weights.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace glm::agent {

ReleasingWeights::ReleasingWeights(const engine::WeightStore* store,
                                   pagecache::PageCacheManager* pages, TensorFn on_tensor)
    : store_(store), pages_(pages), on_tensor_(std::move(on_tensor)) {}

ReleasingWeights::~ReleasingWeights() { Finish().IgnoreError(); }

bool ReleasingWeights::Has(const std::string& name) const { return store_->Contains(name); }

absl::StatusOr<std::vector<float>> ReleasingWeights::ReadFloat(const std::string& name,
                                                               std::vector<int64_t>* shape) {
  // The previous tensor is on the device now (the loader uploads before asking for the next).
  if (absl::Status s = ReleasePending(); !s.ok() && release_error_.ok()) release_error_ = s;
  GLM_ASSIGN_OR_RETURN(std::vector<int64_t> logical, store_->ShapeOf(name));
  if (shape != nullptr) *shape = logical;
  absl::StatusOr<std::vector<float>> data = store_->ReadFloat(name);
  // The weight with its scales (and, for quantized formats, weight_shape / input_scale).
  uint64_t bytes = 0;
  for (std::string& part : store_->PartsOf(name)) {
    if (std::optional<engine::WeightStore::TensorLocation> where = store_->LocationOf(part)) {
      bytes += where->length;
    }
    pending_.push_back(std::move(part));
  }
  if (!data.ok()) return data.status();
  ++tensors_read_;
  bytes_read_ += bytes;
  fp32_bytes_ += data->size() * sizeof(float);
  if (on_tensor_) on_tensor_(name, tensors_read_, bytes_read_);
  return data;
}

absl::StatusOr<ReleasingWeights::FileState*> ReleasingWeights::File(const std::string& path) {
  auto it = files_.find(path);
  if (it != files_.end()) return &it->second;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": open for page-cache release: ",
                                            std::strerror(errno)));
  }
  FileState& state = files_[path];
  state.fd = fd;
  // The header was read at Open and is not needed again: it counts as released, so the folio
  // holding it and the first tensors can go too.
  if (std::optional<uint64_t> data = store_->DataOffsetOf(path); data.has_value() && *data > 0) {
    state.released[0] = *data;
    store_->ReleaseMappedRange(path, 0, *data);
  }
  return &state;
}

absl::Status ReleasingWeights::ReleasePending() {
  constexpr uint64_t kFolioSpan = uint64_t{2} << 20;  // the largest page-cache folio (PMD)
  std::vector<std::string> names;
  names.swap(pending_);
  if (pages_ == nullptr) return absl::OkStatus();
  absl::Status first;
  for (const std::string& name : names) {
    std::optional<engine::WeightStore::TensorLocation> where = store_->LocationOf(name);
    if (!where.has_value() || where->length == 0) continue;
    absl::StatusOr<FileState*> file = File(where->path);
    if (!file.ok()) {
      if (first.ok()) first = file.status();
      continue;
    }
    // Merge [offset, offset + length) into the file's released spans.
    std::map<uint64_t, uint64_t>& spans = (*file)->released;
    uint64_t begin = where->offset, end = where->offset + where->length;
    auto it = spans.upper_bound(begin);
    if (it != spans.begin() && std::prev(it)->second >= begin) {
      --it;
      begin = it->first;
      end = std::max(end, it->second);
      it = spans.erase(it);
    }
    while (it != spans.end() && it->first <= end) {
      end = std::max(end, it->second);
      it = spans.erase(it);
    }
    spans[begin] = end;
    // The tensor widened to folio boundaries, within what is already released.
    const uint64_t from = std::max(begin, where->offset / kFolioSpan * kFolioSpan);
    const uint64_t to = std::min(
        end, (where->offset + where->length + kFolioSpan - 1) / kFolioSpan * kFolioSpan);
    // Our own mapping of the range goes first (the kernel never evicts a mapped page). All of
    // [from, to) is loaded and released, so nothing still needed is unmapped.
    store_->ReleaseMappedRange(where->path, from, to - from);
    absl::Status s = pages_->ReleaseRange(
        (*file)->fd, from, to - from,
        absl::StrCat(std::filesystem::path(where->path).filename().string(), ":", name));
    if (s.ok()) {
      ++ranges_released_;
    } else if (first.ok()) {
      first = s;
    }
  }
  return first;
}

absl::Status ReleasingWeights::Finish() {
  absl::Status s = ReleasePending();
  for (auto& [path, file] : files_) ::close(file.fd);
  files_.clear();
  if (!s.ok() && release_error_.ok()) release_error_ = s;
  absl::Status out = release_error_;
  release_error_ = absl::OkStatus();
  return out;
}

}  // namespace glm::agent
