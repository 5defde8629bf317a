#include "engine/pipeline/tp_transport.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace glm::engine::pipeline {

std::string TpRankDevice::Encode() const {
  return absl::StrCat("backend=", backend, ";gpu=", device_uuid, ";nccl=", nccl_version);
}

absl::StatusOr<TpRankDevice> TpRankDevice::Decode(const std::string& text) {
  std::map<std::string, std::string> fields;
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(text, ';'))) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    fields[kv.first] = kv.second;
  }
  TpRankDevice d;
  auto backend = fields.find("backend");
  auto gpu = fields.find("gpu");
  auto nccl = fields.find("nccl");
  if (backend == fields.end() || backend->second.empty() || gpu == fields.end() ||
      nccl == fields.end() || !absl::SimpleAtoi(nccl->second, &d.nccl_version) ||
      d.nccl_version < 0) {
    return absl::DataLossError(absl::StrCat(
        "TP rank device record '", text, "' is not 'backend=<name>;gpu=<uuid>;nccl=<version>'"));
  }
  d.backend = backend->second;
  d.device_uuid = gpu->second;
  return d;
}

std::string TpTransportChoice::Describe() const {
  return nccl() ? std::string("nccl") : absl::StrCat("gloo (", reason, ")");
}

TpTransportChoice ChooseTpTransport(const std::vector<TpRankDevice>& ranks) {
  TpTransportChoice gloo;
  const int n = static_cast<int>(ranks.size());
  if (n < 2) {
    gloo.reason = "one rank: nothing to all-reduce";
    return gloo;
  }
  for (int r = 0; r < n; ++r) {
    if (ranks[r].backend != "cuda") {
      gloo.reason = absl::StrCat("rank ", r, " runs the ", ranks[r].backend, " backend");
      return gloo;
    }
  }
  for (int r = 0; r < n; ++r) {
    if (ranks[r].device_uuid.empty()) {
      gloo.reason = absl::StrCat("host path: rank ", r, " reports no GPU id");
      return gloo;
    }
  }
  for (int r = 0; r < n; ++r) {
    if (ranks[r].nccl_version == 0) {
      gloo.reason = absl::StrCat("host path: rank ", r, " has no NCCL library loaded");
      return gloo;
    }
  }
  for (int r = 1; r < n; ++r) {
    if (ranks[r].nccl_version != ranks[0].nccl_version) {
      gloo.reason = absl::StrCat("host path: ranks 0 and ", r, " hold different NCCL versions (",
                                 ranks[0].nccl_version, " vs ", ranks[r].nccl_version, ")");
      return gloo;
    }
  }
  std::map<std::string, int> first_on;
  for (int r = 0; r < n; ++r) {
    auto [it, inserted] = first_on.emplace(ranks[r].device_uuid, r);
    if (!inserted) {
      gloo.reason = absl::StrCat("host path: ranks ", it->second, " and ", r, " share GPU ",
                                 ranks[r].device_uuid);
      return gloo;
    }
  }
  TpTransportChoice nccl;
  nccl.transport = TpTransport::kNccl;
  return nccl;
}

}  // namespace glm::engine::pipeline
