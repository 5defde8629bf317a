#include "agent/preflight/gpu.h"

#include <dlfcn.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace glm::preflight {
namespace {

absl::StatusOr<std::vector<GpuInfo>> ProbeLibcuda() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return absl::UnavailableError("libcuda.so.1 not loadable");
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  using GetFn = int (*)(int*, int);
  using NameFn = int (*)(char*, int, int);
  using AttrFn = int (*)(int*, int, int);
  auto init = reinterpret_cast<InitFn>(dlsym(h, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(h, "cuDeviceGetCount"));
  auto get = reinterpret_cast<GetFn>(dlsym(h, "cuDeviceGet"));
  auto name = reinterpret_cast<NameFn>(dlsym(h, "cuDeviceGetName"));
  auto attr = reinterpret_cast<AttrFn>(dlsym(h, "cuDeviceGetAttribute"));
  std::vector<GpuInfo> gpus;
  absl::Status status;
  if (!init || !count || !get || !name || !attr) {
    status = absl::UnavailableError("libcuda.so.1 lacks cuInit/cuDeviceGet* symbols");
  } else if (int rc = init(0); rc != 0) {
    status = absl::UnavailableError(absl::StrCat("cuInit failed with CUresult ", rc));
  } else {
    int n = 0;
    if (count(&n) == 0) {
      for (int i = 0; i < n; ++i) {
        int dev = 0;
        if (get(&dev, i) != 0) continue;
        GpuInfo g;
        char buf[256] = {};
        if (name(buf, sizeof(buf), dev) == 0) g.name = buf;
        // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76.
        attr(&g.cc_major, 75, dev);
        attr(&g.cc_minor, 76, dev);
        gpus.push_back(g);
      }
    }
  }
  dlclose(h);
  if (!status.ok()) return status;
  return gpus;
}

}  // namespace

absl::StatusOr<std::vector<GpuInfo>> ProbeGpus(const SystemRoots& roots) {
  if (roots.proc == "/proc") {
    absl::StatusOr<std::vector<GpuInfo>> cuda = ProbeLibcuda();
    if (cuda.ok() && !cuda->empty()) return cuda;
  }
  std::string dir = absl::StrCat(roots.proc, "/driver/nvidia/gpus");
  std::vector<GpuInfo> gpus;
  for (const std::string& bus : ListDir(dir)) {
    GpuInfo g;
    g.name = bus;
    absl::StatusOr<std::string> info = ReadTrimmed(absl::StrCat(dir, "/", bus, "/information"));
    if (info.ok()) {
      for (absl::string_view line : absl::StrSplit(*info, '\n')) {
        if (absl::ConsumePrefix(&line, "Model:")) g.name = std::string(absl::StripAsciiWhitespace(line));
      }
    }
    gpus.push_back(g);
  }
  return gpus;
}

}  // namespace glm::preflight
