#include "agent/service/host_facts.h"

#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace glm::agent {
namespace {

namespace fs = std::filesystem;

struct MemInfo {
  int64_t total = -1;
  int64_t available = -1;
  std::string evidence;
};

MemInfo ReadMemInfo(const std::string& proc_root) {
  MemInfo info;
  std::string path = proc_root + "/meminfo";
  std::ifstream in(path);
  if (!in) {
    info.evidence = absl::StrCat(path, ": unreadable");
    return info;
  }
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kb = 0;
    fields >> key >> kb;
    if (key == "MemTotal:") {
      info.total = kb * 1024;
      absl::StrAppend(&info.evidence, path, " ", line, "; ");
    } else if (key == "MemAvailable:") {
      info.available = kb * 1024;
      absl::StrAppend(&info.evidence, path, " ", line, "; ");
    }
  }
  return info;
}

std::vector<std::string> FindGpuDevices(const std::string& dev_root) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dev_root, ec)) {
    std::string name = entry.path().filename().string();
    if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
        std::all_of(name.begin() + 6, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      found.push_back(entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

glm::v1::Check MakeCheck(std::string id, glm::v1::CheckStatus status, std::string message,
                         std::string evidence, std::string fix) {
  glm::v1::Check check;
  check.set_id(std::move(id));
  check.set_status(status);
  check.set_message(std::move(message));
  check.set_evidence(std::move(evidence));
  if (status != glm::v1::CHECK_STATUS_PASS) check.set_fix(std::move(fix));
  return check;
}

// The directory itself or its nearest existing parent (the model dir may not exist yet).
fs::path NearestExisting(fs::path p) {
  std::error_code ec;
  if (p.empty()) p = fs::current_path(ec);
  p = fs::absolute(p, ec);
  while (!p.empty() && !fs::exists(p, ec)) {
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  return p;
}

}  // namespace

glm::v1::HostFacts GatherHostFacts(const HostProbePaths& paths) {
  glm::v1::HostFacts facts;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) facts.set_hostname(host);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  facts.set_cpu_count(cpus > 0 ? static_cast<int32_t>(cpus)
                               : static_cast<int32_t>(std::thread::hardware_concurrency()));
  MemInfo mem = ReadMemInfo(paths.proc_root);
  facts.set_mem_total_bytes(std::max<int64_t>(mem.total, 0));
  facts.set_mem_available_bytes(std::max<int64_t>(mem.available, 0));
  struct utsname uts {};
  if (uname(&uts) == 0) {
    facts.set_kernel(uts.release);
    facts.set_arch(uts.machine);
  }
  for (auto& dev : FindGpuDevices(paths.dev_root)) facts.add_gpu_devices(dev);
  facts.set_nvidia_driver(FirstLine(paths.proc_root + "/driver/nvidia/version"));
  return facts;
}

std::vector<glm::v1::Check> RunHostChecks(const HostRequirements& req,
                                          const HostProbePaths& paths) {
  using glm::v1::CHECK_STATUS_FAIL;
  using glm::v1::CHECK_STATUS_PASS;
  using glm::v1::CHECK_STATUS_WARN;
  std::vector<glm::v1::Check> checks;

  // CPU count.
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  std::string cpu_evidence = absl::StrCat("sysconf(_SC_NPROCESSORS_ONLN)=", cpus);
  if (cpus < 1) {
    checks.push_back(MakeCheck("host.cpu.count", CHECK_STATUS_FAIL,
                               "could not determine the number of online CPUs", cpu_evidence,
                               "check that /sys/devices/system/cpu is mounted and readable"));
  } else if (cpus < 2) {
    checks.push_back(MakeCheck("host.cpu.count", CHECK_STATUS_WARN,
                               absl::StrCat(cpus, " online CPU; the agent, loader and engine "
                                                  "threads will contend"),
                               cpu_evidence, "give the node at least 2 CPUs"));
  } else {
    checks.push_back(MakeCheck("host.cpu.count", CHECK_STATUS_PASS,
                               absl::StrCat(cpus, " online CPUs"), cpu_evidence, ""));
  }

  // Memory.
  MemInfo mem = ReadMemInfo(paths.proc_root);
  if (mem.total <= 0) {
    checks.push_back(MakeCheck("host.memory.total", CHECK_STATUS_FAIL,
                               "MemTotal not found in " + paths.proc_root + "/meminfo",
                               mem.evidence, "make /proc/meminfo readable by the agent"));
  } else if (req.required_memory_bytes > mem.total) {
    checks.push_back(MakeCheck(
        "host.memory.total", CHECK_STATUS_FAIL,
        absl::StrCat("MemTotal ", HumanBytes(mem.total), " < ",
                     HumanBytes(req.required_memory_bytes), " the shard needs"),
        mem.evidence,
        "use a node with more memory, lower this node's memory budget, or spread the model over "
        "more pipeline stages"));
  } else {
    checks.push_back(MakeCheck("host.memory.total", CHECK_STATUS_PASS,
                               absl::StrCat("MemTotal ", HumanBytes(mem.total)), mem.evidence,
                               ""));
  }
  if (mem.available < 0) {
    checks.push_back(MakeCheck("host.memory.available", CHECK_STATUS_WARN,
                               "MemAvailable not reported by the kernel", mem.evidence,
                               "use a kernel that reports MemAvailable (3.14+)"));
  } else if (req.required_memory_bytes > mem.available) {
    checks.push_back(MakeCheck(
        "host.memory.available", CHECK_STATUS_FAIL,
        absl::StrCat("MemAvailable ", HumanBytes(mem.available), " < ",
                     HumanBytes(req.required_memory_bytes), " the shard needs"),
        mem.evidence,
        "stop other memory users on the node (containers, old engine processes) or drop the page "
        "cache (sync; echo 1 > /proc/sys/vm/drop_caches)"));
  } else {
    checks.push_back(MakeCheck("host.memory.available", CHECK_STATUS_PASS,
                               absl::StrCat("MemAvailable ", HumanBytes(mem.available)),
                               mem.evidence, ""));
  }

  // Disk free for the model dir.
  fs::path dir = NearestExisting(req.model_dir);
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) != 0) {
    checks.push_back(MakeCheck(
        "host.disk.free", CHECK_STATUS_FAIL,
        absl::StrCat("cannot stat the filesystem of '", dir.string(), "'"),
        absl::StrCat("model_dir='", req.model_dir, "'"),
        "create the model directory on a mounted filesystem, or fix model.path in cluster.yaml"));
  } else {
    int64_t free_bytes = static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
    std::string evidence = absl::StrCat("statvfs('", dir.string(), "') f_bavail*f_frsize=",
                                        free_bytes);
    if (req.required_disk_bytes > free_bytes) {
      checks.push_back(MakeCheck(
          "host.disk.free", CHECK_STATUS_FAIL,
          absl::StrCat(HumanBytes(free_bytes), " free at '", dir.string(), "' < ",
                       HumanBytes(req.required_disk_bytes), " the shard's weights need"),
          evidence, "free space on that filesystem or point model.path at a larger one"));
    } else {
      checks.push_back(MakeCheck("host.disk.free", CHECK_STATUS_PASS,
                                 absl::StrCat(HumanBytes(free_bytes), " free at '",
                                              dir.string(), "'"),
                                 evidence, ""));
    }
  }

  // GPU presence.
  auto gpus = FindGpuDevices(paths.dev_root);
  std::string driver = FirstLine(paths.proc_root + "/driver/nvidia/version");
  std::string gpu_evidence = absl::StrCat(paths.dev_root, "/nvidia[0-9]*: ", gpus.size(),
                                          " found; ", paths.proc_root,
                                          "/driver/nvidia/version: ",
                                          driver.empty() ? "absent" : driver);
  if (gpus.empty() && driver.empty()) {
    checks.push_back(MakeCheck(
        "host.gpu.present", req.require_gpu ? CHECK_STATUS_FAIL : CHECK_STATUS_WARN,
        req.require_gpu ? "no NVIDIA GPU found" : "no NVIDIA GPU found; the CPU backend will be used",
        gpu_evidence,
        "install the NVIDIA driver and check that /dev/nvidia0 exists (nvidia-smi lists the GPU)"));
  } else if (gpus.empty()) {
    checks.push_back(MakeCheck("host.gpu.present", CHECK_STATUS_WARN,
                               "NVIDIA driver loaded but no /dev/nvidia[0-9]* device node",
                               gpu_evidence,
                               "run nvidia-modprobe (or nvidia-smi once as root) to create the "
                               "device nodes"));
  } else {
    checks.push_back(MakeCheck("host.gpu.present", CHECK_STATUS_PASS,
                               absl::StrCat(gpus.size(), " NVIDIA GPU device(s)"), gpu_evidence,
                               ""));
  }
  return checks;
}

}  // namespace glm::agent
