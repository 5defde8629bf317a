// Test helper: dlopen an NCCL build and fill a FunctionTable with dlsym, the way the agent's
// loader (agent/stage/nccl_loader) does, without the engine tests depending on agent/.
#pragma once

#include <dlfcn.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/dist/nccl_table.h"

namespace glm::engine::testing {

struct DlopenedNccl {
  void* handle = nullptr;
  nccl::FunctionTable table{};
};

// The handle stays open for the life of the test process.
inline absl::StatusOr<DlopenedNccl> DlopenNccl(const std::string& path) {
  DlopenedNccl lib;
  lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib.handle == nullptr) {
    return absl::NotFoundError(absl::StrCat("dlopen ", path, ": ", dlerror()));
  }
  absl::Status missing;
  auto sym = [&](auto& field, const char* name) {
    void* p = dlsym(lib.handle, name);
    if (p == nullptr && missing.ok()) {
      missing = absl::NotFoundError(absl::StrCat(path, " has no ", name));
    }
    field = reinterpret_cast<std::remove_reference_t<decltype(field)>>(p);
  };
  nccl::FunctionTable& t = lib.table;
  sym(t.GetVersion, "ncclGetVersion");
  sym(t.GetUniqueId, "ncclGetUniqueId");
  sym(t.CommInitRank, "ncclCommInitRank");
  // Optional, as in the loader: NCCL < 2.14 lacks it (the slot stays null).
  t.CommInitRankConfig = reinterpret_cast<decltype(t.CommInitRankConfig)>(
      dlsym(lib.handle, "ncclCommInitRankConfig"));
  sym(t.CommDestroy, "ncclCommDestroy");
  sym(t.CommAbort, "ncclCommAbort");
  sym(t.CommGetAsyncError, "ncclCommGetAsyncError");
  sym(t.GetErrorString, "ncclGetErrorString");
  sym(t.AllReduce, "ncclAllReduce");
  sym(t.AllGather, "ncclAllGather");
  sym(t.ReduceScatter, "ncclReduceScatter");
  sym(t.Broadcast, "ncclBroadcast");
  sym(t.Send, "ncclSend");
  sym(t.Recv, "ncclRecv");
  sym(t.GroupStart, "ncclGroupStart");
  sym(t.GroupEnd, "ncclGroupEnd");
  if (!missing.ok()) return missing;
  return lib;
}

}  // namespace glm::engine::testing
