#include "agent/stage/nccl_loader.h"

#include <dlfcn.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace glm::stage {

absl::StatusOr<int> ParseNcclVersion(const std::string& version) {
  std::vector<std::string> parts = absl::StrSplit(version, '.');
  int v[3] = {0, 0, 0};
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &v[0]) ||
      !absl::SimpleAtoi(parts[1], &v[1]) || !absl::SimpleAtoi(parts[2], &v[2]) || v[0] < 0 ||
      v[1] < 0 || v[1] > 99 || v[2] < 0 || v[2] > 99) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL version '", version,
                                                   "' is not MAJOR.MINOR.PATCH (e.g. \"2.30.4\")"));
  }
  if (v[0] > 2 || (v[0] == 2 && v[1] >= 9)) return v[0] * 10000 + v[1] * 100 + v[2];
  return v[0] * 1000 + v[1] * 100 + v[2];
}

std::string FormatNcclVersion(int code) {
  if (code >= 10000) return absl::StrCat(code / 10000, ".", (code % 10000) / 100, ".", code % 100);
  return absl::StrCat(code / 1000, ".", (code % 1000) / 100, ".", code % 100);
}

NcclLibrary::~NcclLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

absl::StatusOr<std::unique_ptr<NcclLibrary>> NcclLibrary::Load(
    const std::string& path, const std::string& expected_version) {
  int expected_code = 0;
  if (!expected_version.empty()) {
    absl::StatusOr<int> code = ParseNcclVersion(expected_version);
    if (!code.ok()) return code.status();
    expected_code = *code;
  }
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load NCCL library ", path, ": ", err ? err : "unknown dlopen error",
        "; fix: stage the library the cluster YAML names (nccl.library) and check its "
        "dependencies with `ldd ", path, "`"));
  }
  std::unique_ptr<NcclLibrary> lib(new NcclLibrary());
  lib->handle_ = handle;
  lib->path_ = path;

  struct Entry {
    const char* symbol;
    void** slot;
    bool optional = false;  // May be absent: the slot stays null and its user falls back.
  };
  nccl::FunctionTable& t = lib->table_;
  const Entry entries[] = {
      {"ncclGetVersion", reinterpret_cast<void**>(&t.GetVersion)},
      {"ncclGetUniqueId", reinterpret_cast<void**>(&t.GetUniqueId)},
      {"ncclCommInitRank", reinterpret_cast<void**>(&t.CommInitRank)},
      // NCCL < 2.14 has no ncclCommInitRankConfig; NcclCommunicator then uses the blocking
      // ncclCommInitRank.
      {"ncclCommInitRankConfig", reinterpret_cast<void**>(&t.CommInitRankConfig), true},
      {"ncclCommDestroy", reinterpret_cast<void**>(&t.CommDestroy)},
      {"ncclCommAbort", reinterpret_cast<void**>(&t.CommAbort)},
      {"ncclCommGetAsyncError", reinterpret_cast<void**>(&t.CommGetAsyncError)},
      {"ncclGetErrorString", reinterpret_cast<void**>(&t.GetErrorString)},
      {"ncclAllReduce", reinterpret_cast<void**>(&t.AllReduce)},
      {"ncclAllGather", reinterpret_cast<void**>(&t.AllGather)},
      {"ncclReduceScatter", reinterpret_cast<void**>(&t.ReduceScatter)},
      {"ncclBroadcast", reinterpret_cast<void**>(&t.Broadcast)},
      {"ncclSend", reinterpret_cast<void**>(&t.Send)},
      {"ncclRecv", reinterpret_cast<void**>(&t.Recv)},
      {"ncclGroupStart", reinterpret_cast<void**>(&t.GroupStart)},
      {"ncclGroupEnd", reinterpret_cast<void**>(&t.GroupEnd)},
  };
  for (const Entry& e : entries) {
    dlerror();
    void* sym = dlsym(handle, e.symbol);
    if (sym == nullptr && !e.optional) {
      return absl::FailedPreconditionError(absl::StrCat(
          "NCCL library ", path, " does not export ", e.symbol,
          "; it is not a usable NCCL build; fix: point nccl.library at a libnccl.so.2 from an "
          "NCCL release"));
    }
    *e.slot = sym;
  }
  int code = 0;
  if (nccl::Result rc = t.GetVersion(&code); rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("ncclGetVersion in ", path, " returned error ", rc));
  }
  lib->version_code_ = code;
  if (expected_code != 0 && code != expected_code) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL library ", path, " is version ", FormatNcclVersion(code), " (code ", code,
        "), expected ", expected_version, " (code ", expected_code,
        "); fix: stage NCCL ", expected_version, " at that path or change nccl.expected_version"));
  }
  return lib;
}

}  // namespace glm::stage
