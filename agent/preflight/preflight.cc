#include "agent/preflight/preflight.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/preflight/gid.h"
#include "agent/stage/nccl_loader.h"
#include "common/status_util.h"

namespace glm::preflight {
namespace {

constexpr char kContainerFix[] =
    "in a container pass --device=/dev/infiniband --cap-add=IPC_LOCK --ulimit memlock=-1";

std::string HcaDir(const SystemRoots& roots, const std::string& hca) {
  return absl::StrCat(roots.sysfs, "/class/infiniband/", hca);
}
std::string PortDir(const SystemRoots& roots, const NodePreflightConfig& node) {
  return absl::StrCat(HcaDir(roots, node.hca), "/ports/", node.port);
}

CheckResult Result(const char* id, CheckStatus status, std::string message, std::string evidence,
                   std::string fix) {
  return CheckResult{id, status, std::move(message), std::move(evidence), std::move(fix)};
}

std::string GiB(uint64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
}

// "Max locked memory  8388608  8388608  bytes" → soft limit; nullopt-like -1 when absent,
// UINT64_MAX for unlimited.
bool ParseLimitsLine(const std::string& limits, const std::string& name, uint64_t* soft,
                     std::string* line_out) {
  for (absl::string_view line : absl::StrSplit(limits, '\n')) {
    if (!absl::StartsWith(line, name)) continue;
    *line_out = std::string(line);
    line.remove_prefix(name.size());
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.empty()) return false;
    if (fields[0] == "unlimited") {
      *soft = UINT64_MAX;
      return true;
    }
    return absl::SimpleAtoi(fields[0], soft);
  }
  return false;
}

}  // namespace

CheckResult CheckHca(const SystemRoots& roots, const NodePreflightConfig& node) {
  std::string dir = HcaDir(roots, node.hca);
  std::vector<std::string> present = ListDir(absl::StrCat(roots.sysfs, "/class/infiniband"));
  std::string evidence = absl::StrCat(roots.sysfs, "/class/infiniband: [",
                                      absl::StrJoin(present, ", "), "]");
  if (PathExists(dir)) {
    return Result("rdma.hca", CheckStatus::kPass, absl::StrCat("HCA ", node.hca, " present"),
                  evidence, "");
  }
  if (present.empty()) {
    return Result("rdma.hca", CheckStatus::kFail,
                  absl::StrCat("no RDMA devices at all (HCA ", node.hca, " not found)"), evidence,
                  absl::StrCat("load the RDMA driver (e.g. `modprobe mlx5_ib`); ", kContainerFix));
  }
  std::string nearest = present.front();
  for (const std::string& p : present) {
    if (EditDistance(p, node.hca) < EditDistance(nearest, node.hca)) nearest = p;
  }
  return Result("rdma.hca", CheckStatus::kFail,
                absl::StrCat("HCA ", node.hca, " not found; present: ", absl::StrJoin(present, ", ")),
                evidence,
                absl::StrCat("set hca: ", nearest, " for node ", node.name,
                             " (did you mean it?) — `ibv_devices` lists the HCAs"));
}

CheckResult CheckUverbs(const SystemRoots& roots, const NodePreflightConfig& node) {
  // <sysfs>/class/infiniband_verbs/uverbsN/ibdev names the HCA each char device belongs to.
  std::string verbs_class = absl::StrCat(roots.sysfs, "/class/infiniband_verbs");
  std::string mine;
  for (const std::string& uv : ListDir(verbs_class)) {
    absl::StatusOr<std::string> ibdev = ReadTrimmed(absl::StrCat(verbs_class, "/", uv, "/ibdev"));
    if (ibdev.ok() && *ibdev == node.hca) mine = uv;
  }
  std::vector<std::string> dev_nodes;
  for (const std::string& name : ListDir(absl::StrCat(roots.dev, "/infiniband"))) {
    if (absl::StartsWith(name, "uverbs")) dev_nodes.push_back(name);
  }
  std::string evidence = absl::StrCat(
      "sysfs uverbs for ", node.hca, ": ", mine.empty() ? "(none)" : mine, "; ", roots.dev,
      "/infiniband: [", absl::StrJoin(dev_nodes, ", "), "]");
  if (!mine.empty()) {
    if (std::find(dev_nodes.begin(), dev_nodes.end(), mine) != dev_nodes.end()) {
      return Result("rdma.uverbs", CheckStatus::kPass,
                    absl::StrCat(roots.dev, "/infiniband/", mine, " present for ", node.hca),
                    evidence, "");
    }
    return Result("rdma.uverbs", CheckStatus::kFail,
                  absl::StrCat(roots.dev, "/infiniband/", mine, " (the verbs device of ", node.hca,
                               ") is missing: RDMA is not passed through, NCCL would fall back to TCP"),
                  evidence,
                  absl::StrCat(kContainerFix, "; on the host check `ls -l /dev/infiniband` and "
                               "`modprobe ib_uverbs`"));
  }
  if (dev_nodes.empty()) {
    return Result("rdma.uverbs", CheckStatus::kFail,
                  absl::StrCat("no ", roots.dev, "/infiniband/uverbs* device: RDMA is not usable"),
                  evidence, absl::StrCat("`modprobe ib_uverbs` on the host; ", kContainerFix));
  }
  return Result("rdma.uverbs", CheckStatus::kWarn,
                absl::StrCat("uverbs devices exist but none is mapped to ", node.hca, " in sysfs"),
                evidence, absl::StrCat("check `ls ", verbs_class, "/*/ibdev`"));
}

CheckResult CheckPortState(const SystemRoots& roots, const NodePreflightConfig& node,
                           VerbsProvider* verbs) {
  std::string dir = PortDir(roots, node);
  absl::StatusOr<std::string> state = ReadTrimmed(dir + "/state");
  absl::StatusOr<std::string> phys = ReadTrimmed(dir + "/phys_state");
  if (!state.ok()) {
    return Result("rdma.port_state", CheckStatus::kFail,
                  absl::StrCat("cannot read the state of ", node.hca, " port ", node.port),
                  std::string(state.status().message()),
                  absl::StrCat("check port: ", node.port, " for node ", node.name,
                               " (`ibv_devinfo -d ", node.hca, "` lists ports)"));
  }
  std::string evidence = absl::StrCat(dir, "/state=", *state, "; phys_state=",
                                      phys.ok() ? *phys : "?");
  if (verbs != nullptr) {
    absl::StatusOr<VerbsPortInfo> info = verbs->QueryPort(node.hca, node.port);
    absl::StrAppend(&evidence, "; ibv_query_port state=",
                    info.ok() ? std::to_string(info->state) : std::string(info.status().message()));
  }
  if (absl::StrContains(*state, "ACTIVE")) {
    return Result("rdma.port_state", CheckStatus::kPass,
                  absl::StrCat(node.hca, " port ", node.port, " is ACTIVE"), evidence, "");
  }
  return Result("rdma.port_state", CheckStatus::kFail,
                absl::StrCat(node.hca, " port ", node.port, " is ", *state, " (physical ",
                             phys.ok() ? *phys : "unknown", "), not ACTIVE"),
                evidence,
                absl::StrCat("bring the link up: check cable and switch port, `ip link set ",
                             node.netdev, " up`, then `ibv_devinfo -d ", node.hca,
                             "` should show PORT_ACTIVE"));
}

CheckResult CheckLinkLayer(const SystemRoots& roots, const NodePreflightConfig& node) {
  std::string path = PortDir(roots, node) + "/link_layer";
  absl::StatusOr<std::string> ll = ReadTrimmed(path);
  if (!ll.ok()) {
    return Result("rdma.link_layer", CheckStatus::kFail,
                  absl::StrCat("cannot read the link layer of ", node.hca, " port ", node.port),
                  std::string(ll.status().message()), "check rdma.hca and the port number");
  }
  std::string evidence = absl::StrCat(path, "=", *ll);
  if (*ll == "Ethernet") {
    return Result("rdma.link_layer", CheckStatus::kPass,
                  absl::StrCat(node.hca, " port ", node.port, " link layer is Ethernet (RoCE)"),
                  evidence, "");
  }
  return Result("rdma.link_layer", CheckStatus::kFail,
                absl::StrCat(node.hca, " port ", node.port, " link layer is ", *ll,
                             ", but the fabric is RoCE (Ethernet)"),
                evidence,
                absl::StrCat("pick the Ethernet/RoCE HCA for node ", node.name,
                             " or switch the port to Ethernet (mlxconfig LINK_TYPE_P", node.port,
                             "=2, then reboot)"));
}

CheckResult CheckNetdevMtu(const SystemRoots& roots, const NodePreflightConfig& node) {
  std::string path = absl::StrCat(roots.sysfs, "/class/net/", node.netdev, "/mtu");
  absl::StatusOr<std::string> text = ReadTrimmed(path);
  int mtu = 0;
  if (!text.ok() || !absl::SimpleAtoi(*text, &mtu)) {
    std::vector<std::string> present = ListDir(absl::StrCat(roots.sysfs, "/class/net"));
    return Result("mtu.netdev", CheckStatus::kFail,
                  absl::StrCat("netdev ", node.netdev, " not found (no ", path, ")"),
                  absl::StrCat("netdevs: [", absl::StrJoin(present, ", "), "]"),
                  absl::StrCat("set netdev: to the fabric interface of node ", node.name,
                               " (`ip -br link`)"));
  }
  std::string evidence = absl::StrCat(path, "=", mtu);
  if (node.fabric_mtu == 0) {
    return Result("mtu.netdev", CheckStatus::kWarn,
                  absl::StrCat(node.netdev, " MTU is ", mtu, "; fabric.mtu is not configured"),
                  evidence, "set fabric: mtu: in the cluster YAML (9000 for RoCE fabrics)");
  }
  if (mtu == node.fabric_mtu) {
    return Result("mtu.netdev", CheckStatus::kPass,
                  absl::StrCat(node.netdev, " MTU ", mtu, " matches fabric.mtu"), evidence, "");
  }
  std::string fix = absl::StrCat("`ip link set dev ", node.netdev, " mtu ", node.fabric_mtu,
                                 "` and persist it (netplan: ethernets: ", node.netdev, ": mtu: ",
                                 node.fabric_mtu, "); the switch ports must allow it too");
  if (mtu < node.fabric_mtu) {
    return Result("mtu.netdev", CheckStatus::kFail,
                  absl::StrCat(node.netdev, " MTU is ", mtu, ", fabric.mtu is ", node.fabric_mtu),
                  evidence, fix);
  }
  return Result("mtu.netdev", CheckStatus::kWarn,
                absl::StrCat(node.netdev, " MTU ", mtu, " is above fabric.mtu ", node.fabric_mtu),
                evidence, fix);
}

CheckResult CheckPortMtu(const SystemRoots& roots, const NodePreflightConfig& node,
                         VerbsProvider* verbs) {
  if (node.fabric_mtu == 0) {
    return Result("mtu.port", CheckStatus::kWarn, "fabric.mtu not configured; port MTU not checked",
                  "", "set fabric: mtu: in the cluster YAML");
  }
  int expected = RoceMtuForNetdevMtu(node.fabric_mtu);
  int active = 0;
  std::string source;
  if (verbs != nullptr) {
    absl::StatusOr<VerbsPortInfo> info = verbs->QueryPort(node.hca, node.port);
    if (info.ok()) {
      active = info->active_mtu_bytes;
      source = absl::StrCat("ibv_query_port active_mtu=", active, " max_mtu=", info->max_mtu_bytes);
    } else {
      source = absl::StrCat("ibv_query_port failed: ", info.status().message(), "; ");
    }
  }
  if (active == 0) {
    // RoCE derives the port MTU from its netdev (iboe_get_mtu), so the sysfs netdev MTU tells it.
    std::string path = absl::StrCat(roots.sysfs, "/class/net/", node.netdev, "/mtu");
    absl::StatusOr<std::string> text = ReadTrimmed(path);
    int netdev_mtu = 0;
    if (!text.ok() || !absl::SimpleAtoi(*text, &netdev_mtu)) {
      return Result("mtu.port", CheckStatus::kFail,
                    absl::StrCat("cannot determine the active MTU of ", node.hca, " port ", node.port),
                    absl::StrCat(source, "no ", path),
                    "fix mtu.netdev first (the RoCE port MTU follows the netdev MTU)");
    }
    active = RoceMtuForNetdevMtu(netdev_mtu);
    absl::StrAppend(&source, "derived from ", path, "=", netdev_mtu, " (RoCE: netdev MTU - 96, "
                    "rounded down to an IB MTU) → ", active);
  }
  if (active >= expected) {
    return Result("mtu.port", CheckStatus::kPass,
                  absl::StrCat(node.hca, " port ", node.port, " active MTU ", active,
                               " (expected ", expected, " for fabric.mtu ", node.fabric_mtu, ")"),
                  source, "");
  }
  return Result("mtu.port", CheckStatus::kFail,
                absl::StrCat(node.hca, " port ", node.port, " active MTU is ", active,
                             ", expected ", expected, " for fabric.mtu ", node.fabric_mtu),
                source,
                absl::StrCat("raise the MTU of ", node.netdev, " to ", node.fabric_mtu,
                             " (`ip link set dev ", node.netdev, " mtu ", node.fabric_mtu,
                             "`, persist in netplan) and on the switch ports"));
}

CheckResult CheckMemlock(const SystemRoots& roots, uint64_t memlock_min_bytes, bool* unlimited) {
  *unlimited = false;
  std::string path = absl::StrCat(roots.proc, "/self/limits");
  absl::StatusOr<std::string> limits = ReadTrimmed(path);
  uint64_t soft = 0;
  std::string line;
  if (!limits.ok() || !ParseLimitsLine(*limits, "Max locked memory", &soft, &line)) {
    return Result("memlock", CheckStatus::kFail, absl::StrCat("cannot read the memlock limit from ", path),
                  limits.ok() ? "no 'Max locked memory' line" : std::string(limits.status().message()),
                  "check that /proc is mounted");
  }
  const std::string fix = absl::StrCat(
      "raise the locked-memory limit to unlimited: systemd LimitMEMLOCK=infinity in the agent "
      "unit, or '* - memlock unlimited' in /etc/security/limits.conf; ", kContainerFix);
  if (soft == UINT64_MAX) {
    *unlimited = true;
    return Result("memlock", CheckStatus::kPass, "memlock limit is unlimited", line, "");
  }
  if (memlock_min_bytes != 0 && soft >= memlock_min_bytes) {
    return Result("memlock", CheckStatus::kWarn,
                  absl::StrCat("memlock limit is ", soft, " bytes (finite, above the ",
                               memlock_min_bytes, " minimum)"),
                  line, fix);
  }
  return Result("memlock", CheckStatus::kFail,
                absl::StrCat("memlock limit is ", soft,
                             " bytes; NCCL cannot register RDMA buffers and silently falls back "
                             "to TCP sockets"),
                line, fix);
}

CheckResult CheckCapIpcLock(const SystemRoots& roots, bool memlock_unlimited) {
  std::string path = absl::StrCat(roots.proc, "/self/status");
  absl::StatusOr<std::string> status = ReadTrimmed(path);
  if (!status.ok()) {
    return Result("cap_ipc_lock", CheckStatus::kFail, absl::StrCat("cannot read ", path),
                  std::string(status.status().message()), "check that /proc is mounted");
  }
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    if (!absl::ConsumePrefix(&line, "CapEff:")) continue;
    std::string hex(absl::StripAsciiWhitespace(line));
    uint64_t caps = std::strtoull(hex.c_str(), nullptr, 16);
    std::string evidence = absl::StrCat(path, " CapEff: ", hex);
    constexpr int kCapIpcLock = 14;
    if ((caps >> kCapIpcLock) & 1) {
      return Result("cap_ipc_lock", CheckStatus::kPass, "CAP_IPC_LOCK is in the effective set",
                    evidence, "");
    }
    return Result("cap_ipc_lock",
                  memlock_unlimited ? CheckStatus::kWarn : CheckStatus::kFail,
                  memlock_unlimited
                      ? "CAP_IPC_LOCK is missing (memlock is unlimited, so pinning still works)"
                      : "CAP_IPC_LOCK is missing and memlock is limited: RDMA memory registration will fail",
                  evidence,
                  "grant CAP_IPC_LOCK: systemd AmbientCapabilities=CAP_IPC_LOCK in the agent unit; "
                  "in a container --cap-add=IPC_LOCK");
  }
  return Result("cap_ipc_lock", CheckStatus::kFail, absl::StrCat("no CapEff line in ", path), "",
                "check that /proc is mounted");
}

CheckResult CheckGpu(const absl::StatusOr<std::vector<GpuInfo>>& gpus, bool require_gpu) {
  CheckStatus missing = require_gpu ? CheckStatus::kFail : CheckStatus::kWarn;
  if (!gpus.ok()) {
    return Result("gpu.present", missing, "cannot probe GPUs", std::string(gpus.status().message()),
                  "install the NVIDIA driver; in a container pass --gpus all");
  }
  if (gpus->empty()) {
    return Result("gpu.present", missing, "no NVIDIA GPU found (libcuda and /proc/driver/nvidia/gpus)",
                  "", "install the NVIDIA driver and check `nvidia-smi`; in a container pass --gpus all");
  }
  std::vector<std::string> names;
  bool cc_known = true;
  for (const GpuInfo& g : *gpus) {
    if (g.cc_major < 0) {
      cc_known = false;
      names.push_back(absl::StrCat(g.name, " (compute capability unknown)"));
    } else {
      names.push_back(absl::StrCat(g.name, " (sm_", g.cc_major, g.cc_minor, ")"));
    }
  }
  std::string message = absl::StrCat(gpus->size(), " GPU(s): ", absl::StrJoin(names, ", "));
  if (!cc_known) {
    return Result("gpu.present", CheckStatus::kWarn, message, "libcuda.so.1 not loadable",
                  "install the CUDA driver library (libcuda.so.1) so the compute capability can be read");
  }
  return Result("gpu.present", CheckStatus::kPass, message, "", "");
}

CheckResult CheckNcclVersion(const std::string& library, const std::string& expected_version,
                             bool stageable) {
  if (library.empty()) {
    return Result("nccl.version", CheckStatus::kWarn, "nccl.library is not configured",
                  "", "set nccl: library: and expected_version: in the cluster YAML to pin NCCL");
  }
  std::error_code ec;
  if (stageable && !std::filesystem::exists(library, ec)) {
    return Result("nccl.version", CheckStatus::kWarn,
                  absl::StrCat(library, " is missing; will be staged from a node holding the pinned "
                               "build (hash and version are verified in the Stage phase)"),
                  "no such file", "");
  }
  absl::StatusOr<std::unique_ptr<stage::NcclLibrary>> lib =
      stage::NcclLibrary::Load(library, expected_version);
  if (!lib.ok()) {
    std::string message(lib.status().message());
    std::string fix;
    if (size_t pos = message.find("; fix: "); pos != std::string::npos) {
      fix = message.substr(pos + 7);
      message.resize(pos);
    }
    if (stageable) {
      // Staging replaces a copy that differs from the pinned build; the controller turns this
      // back into a failure when this copy is the pinned build or no node holds it.
      return Result("nccl.version", CheckStatus::kWarn,
                    absl::StrCat(message, "; will be replaced by the pinned build in the Stage "
                                          "phase"),
                    library, fix);
    }
    return Result("nccl.version", CheckStatus::kFail, message, library, fix);
  }
  return Result("nccl.version", CheckStatus::kPass,
                absl::StrCat(library, " is NCCL ", (*lib)->version(),
                             expected_version.empty() ? "" : " as expected"),
                absl::StrCat("ncclGetVersion=", (*lib)->version_code()), "");
}

CheckResult CheckMemFree(const SystemRoots& roots, uint64_t min_bytes) {
  std::string path = absl::StrCat(roots.proc, "/meminfo");
  absl::StatusOr<std::string> meminfo = ReadTrimmed(path);
  uint64_t available_kb = 0;
  bool found = false;
  if (meminfo.ok()) {
    for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
      if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
      line = absl::StripAsciiWhitespace(line);
      absl::ConsumeSuffix(&line, "kB");
      found = absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &available_kb);
    }
  }
  if (!found) {
    return Result("mem.free", CheckStatus::kFail, absl::StrCat("cannot read MemAvailable from ", path),
                  "", "check that /proc is mounted");
  }
  uint64_t available = available_kb * 1024;
  std::string evidence = absl::StrCat(path, " MemAvailable: ", available_kb, " kB");
  if (available >= min_bytes) {
    return Result("mem.free", CheckStatus::kPass,
                  absl::StrCat(GiB(available), " available",
                               min_bytes ? absl::StrCat(" (plan needs ", GiB(min_bytes), ")") : ""),
                  evidence, "");
  }
  return Result("mem.free", CheckStatus::kFail,
                absl::StrCat("only ", GiB(available), " available, the plan needs ", GiB(min_bytes)),
                evidence,
                "stop other workloads on the node, drop the page cache (`sync; echo 3 > "
                "/proc/sys/vm/drop_caches`), or plan fewer layers/KV for this node");
}

CheckResult CheckDiskFree(const std::string& path, uint64_t min_bytes) {
  struct statvfs st;
  if (statvfs(path.c_str(), &st) != 0) {
    return Result("disk.free", CheckStatus::kFail, absl::StrCat("cannot statvfs ", path),
                  std::strerror(errno), "create the weights directory or fix its path");
  }
  uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  std::string evidence = absl::StrCat("statvfs(", path, ") f_bavail*f_frsize=", free_bytes);
  if (free_bytes >= min_bytes) {
    return Result("disk.free", CheckStatus::kPass,
                  absl::StrCat(GiB(free_bytes), " free at ", path,
                               min_bytes ? absl::StrCat(" (plan needs ", GiB(min_bytes), ")") : ""),
                  evidence, "");
  }
  return Result("disk.free", CheckStatus::kFail,
                absl::StrCat("only ", GiB(free_bytes), " free at ", path, ", staging needs ",
                             GiB(min_bytes)),
                evidence, "free disk space or point the weights directory at a larger filesystem");
}

PreflightReport RunNodePreflight(const PreflightOptions& options) {
  PreflightReport report;
  const NodePreflightConfig& node = options.node;
  report.node = node.name;

  VerbsProvider* verbs = options.verbs;
  std::unique_ptr<VerbsProvider> owned_verbs;
  if (verbs == nullptr && options.roots.sysfs == "/sys") {
    absl::StatusOr<std::unique_ptr<VerbsProvider>> opened = OpenLibibverbs();
    if (opened.ok()) {
      owned_verbs = std::move(*opened);
      verbs = owned_verbs.get();
    }
  }

  bool hca_ok = false;
  if (node.hca.empty()) {
    // No RDMA fabric configured (e.g. a local: true cluster): collectives go over TCP.
    report.checks.push_back(Result("rdma.hca", CheckStatus::kWarn,
                                   absl::StrCat("no hca configured for node ", node.name,
                                                "; RDMA, GID and port-MTU checks skipped"),
                                   "", "set hca:, netdev: and fabric_ip: to use an RDMA fabric"));
  } else {
    CheckResult hca = CheckHca(options.roots, node);
    hca_ok = hca.status == CheckStatus::kPass;
    report.checks.push_back(std::move(hca));
    report.checks.push_back(CheckUverbs(options.roots, node));
  }
  if (hca_ok) {
    report.checks.push_back(CheckPortState(options.roots, node, verbs));
    report.checks.push_back(CheckLinkLayer(options.roots, node));
  }
  if (node.netdev.empty()) {
    if (!node.hca.empty()) {
      report.checks.push_back(Result("mtu.netdev", CheckStatus::kFail,
                                     absl::StrCat("node ", node.name, " names hca ", node.hca,
                                                  " but no netdev"),
                                     "", "set netdev: to the HCA's Ethernet interface (`rdma link`)"));
    }
  } else {
    report.checks.push_back(CheckNetdevMtu(options.roots, node));
  }
  if (hca_ok && !node.netdev.empty()) {
    report.checks.push_back(CheckPortMtu(options.roots, node, verbs));
    GidCheckInput gid_in{node.name, node.hca, node.port, node.gid_index, node.fabric_ip, node.netdev};
    report.checks.push_back(CheckGidIndex(options.roots, gid_in, &report.gid, verbs));
  }
  bool memlock_unlimited = false;
  report.checks.push_back(CheckMemlock(options.roots, options.memlock_min_bytes, &memlock_unlimited));
  report.checks.push_back(CheckCapIpcLock(options.roots, memlock_unlimited));
  report.checks.push_back(CheckGpu(
      options.gpu_probe ? options.gpu_probe() : ProbeGpus(options.roots), options.require_gpu));
  report.checks.push_back(CheckNcclVersion(
      options.nccl_library_override.empty() ? node.nccl_library : options.nccl_library_override,
      node.nccl_expected_version, options.nccl_stageable));
  report.checks.push_back(CheckMemFree(options.roots, options.min_mem_available_bytes));
  report.checks.push_back(
      CheckDiskFree(options.disk_path.empty() ? "/" : options.disk_path, options.min_disk_free_bytes));
  for (const PreflightOptions::MtuPeer& peer : options.mtu_peers) {
    PathMtuOptions probe;
    probe.host = peer.fabric_ip;
    probe.port = peer.port;
    probe.target_mtu = node.fabric_mtu > 0 ? node.fabric_mtu : 1500;
    probe.timeout = options.mtu_probe_timeout;
    report.checks.push_back(PathMtuCheck(peer.name, ProbePathMtu(probe)));
  }
  return report;
}

}  // namespace glm::preflight
