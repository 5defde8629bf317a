#include "agent/preflight/verbs.h"

#include <dlfcn.h>
#include <net/if.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#if __has_include(<infiniband/verbs.h>)
#include <infiniband/verbs.h>
#define GLM_HAVE_VERBS_HEADER 1
#else
#define GLM_HAVE_VERBS_HEADER 0
#endif

namespace glm::preflight {

int IbMtuEnumToBytes(int mtu_enum) {
  switch (mtu_enum) {
    case 1: return 256;
    case 2: return 512;
    case 3: return 1024;
    case 4: return 2048;
    case 5: return 4096;
    default: return 0;
  }
}

int RoceMtuForNetdevMtu(int netdev_mtu) {
  // IB_GRH_BYTES 40 + IB_UDP_BYTES 8 + IB_BTH_BYTES 12 + IB_EXT_XRC_BYTES 4 +
  // IB_EXT_ATOMICETH_BYTES 28 + IB_ICRC_BYTES 4 (include/rdma/ib_addr.h iboe_get_mtu).
  int payload = netdev_mtu - 96;
  for (int bytes = 4096; bytes >= 256; bytes /= 2) {
    if (payload >= bytes) return bytes;
  }
  return 0;
}

#if GLM_HAVE_VERBS_HEADER
namespace {

class LibibverbsProvider : public VerbsProvider {
 public:
  using GetDeviceListFn = ibv_device** (*)(int*);
  using FreeDeviceListFn = void (*)(ibv_device**);
  using GetDeviceNameFn = const char* (*)(ibv_device*);
  using OpenDeviceFn = ibv_context* (*)(ibv_device*);
  using CloseDeviceFn = int (*)(ibv_context*);
  using QueryPortFn = int (*)(ibv_context*, uint8_t, ibv_port_attr*);
  using QueryGidExFn = int (*)(ibv_context*, uint32_t, uint32_t, ibv_gid_entry*, uint32_t, size_t);

  explicit LibibverbsProvider(void* handle) : handle_(handle) {}
  ~LibibverbsProvider() override { dlclose(handle_); }

  absl::Status Resolve() {
    get_device_list_ = reinterpret_cast<GetDeviceListFn>(dlsym(handle_, "ibv_get_device_list"));
    free_device_list_ = reinterpret_cast<FreeDeviceListFn>(dlsym(handle_, "ibv_free_device_list"));
    get_device_name_ = reinterpret_cast<GetDeviceNameFn>(dlsym(handle_, "ibv_get_device_name"));
    open_device_ = reinterpret_cast<OpenDeviceFn>(dlsym(handle_, "ibv_open_device"));
    close_device_ = reinterpret_cast<CloseDeviceFn>(dlsym(handle_, "ibv_close_device"));
    query_port_ = reinterpret_cast<QueryPortFn>(dlsym(handle_, "ibv_query_port"));
    // rdma-core >= 31 (IBVERBS_1.11); optional.
    query_gid_ex_ = reinterpret_cast<QueryGidExFn>(dlsym(handle_, "_ibv_query_gid_ex"));
    if (!get_device_list_ || !free_device_list_ || !get_device_name_ || !open_device_ ||
        !close_device_ || !query_port_) {
      return absl::UnavailableError("libibverbs.so.1 lacks a required ibv_* symbol");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> DeviceNames() override {
    int n = 0;
    ibv_device** list = get_device_list_(&n);
    if (list == nullptr) {
      return absl::UnavailableError(absl::StrCat("ibv_get_device_list failed: ", std::strerror(errno)));
    }
    std::vector<std::string> names;
    for (int i = 0; i < n; ++i) names.push_back(get_device_name_(list[i]));
    free_device_list_(list);
    return names;
  }

  absl::StatusOr<ibv_context*> Open(const std::string& hca) {
    int n = 0;
    ibv_device** list = get_device_list_(&n);
    if (list == nullptr) return absl::UnavailableError("ibv_get_device_list failed");
    ibv_device* device = nullptr;
    for (int i = 0; i < n; ++i) {
      if (hca == get_device_name_(list[i])) device = list[i];
    }
    if (device == nullptr) {
      free_device_list_(list);
      return absl::NotFoundError(absl::StrCat("libibverbs has no device ", hca));
    }
    ibv_context* ctx = open_device_(device);
    free_device_list_(list);
    if (ctx == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("ibv_open_device(", hca, ") failed: ", std::strerror(errno)));
    }
    return ctx;
  }

  absl::StatusOr<std::vector<GidEntry>> QueryGidTable(const std::string& hca, int port) override {
    if (query_gid_ex_ == nullptr) {
      return absl::UnavailableError("libibverbs lacks _ibv_query_gid_ex (rdma-core < 31)");
    }
    absl::StatusOr<ibv_context*> ctx = Open(hca);
    if (!ctx.ok()) return ctx.status();
    ibv_port_attr attr;
    std::memset(&attr, 0, sizeof(attr));
    int rc = query_port_(*ctx, static_cast<uint8_t>(port), &attr);
    std::vector<GidEntry> table;
    for (int i = 0; rc == 0 && i < attr.gid_tbl_len; ++i) {
      ibv_gid_entry e;
      std::memset(&e, 0, sizeof(e));
      if (query_gid_ex_(*ctx, static_cast<uint32_t>(port), static_cast<uint32_t>(i), &e, 0,
                        sizeof(e)) != 0) {
        continue;  // ENODATA: unused entry
      }
      GidEntry g;
      g.hca = hca;
      g.port = port;
      g.index = i;
      static const char kHex[] = "0123456789abcdef";
      bool zero = true;
      for (int b = 0; b < 16; ++b) {
        if (b > 0 && b % 2 == 0) g.gid.push_back(':');
        g.gid.push_back(kHex[e.gid.raw[b] >> 4]);
        g.gid.push_back(kHex[e.gid.raw[b] & 0xf]);
        zero = zero && e.gid.raw[b] == 0;
      }
      if (zero) continue;
      g.type = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2"
               : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? "IB/RoCE v1"
                                                     : "IB";
      char name[IF_NAMESIZE] = {};
      if (e.ndev_ifindex != 0 && if_indextoname(e.ndev_ifindex, name) != nullptr) g.netdev = name;
      table.push_back(std::move(g));
    }
    close_device_(*ctx);
    if (rc != 0) {
      return absl::UnavailableError(
          absl::StrCat("ibv_query_port(", hca, ", ", port, ") failed: ", std::strerror(rc)));
    }
    return table;
  }

  absl::StatusOr<VerbsPortInfo> QueryPort(const std::string& hca, int port) override {
    absl::StatusOr<ibv_context*> opened = Open(hca);
    if (!opened.ok()) return opened.status();
    ibv_context* ctx = *opened;
    ibv_port_attr attr;
    std::memset(&attr, 0, sizeof(attr));
    int rc = query_port_(ctx, static_cast<uint8_t>(port), &attr);
    close_device_(ctx);
    if (rc != 0) {
      return absl::UnavailableError(
          absl::StrCat("ibv_query_port(", hca, ", ", port, ") failed: ", std::strerror(rc)));
    }
    VerbsPortInfo info;
    info.state = attr.state;
    info.active_mtu_bytes = IbMtuEnumToBytes(attr.active_mtu);
    info.max_mtu_bytes = IbMtuEnumToBytes(attr.max_mtu);
    info.ethernet = attr.link_layer == IBV_LINK_LAYER_ETHERNET;
    return info;
  }

 private:
  void* handle_;
  GetDeviceListFn get_device_list_ = nullptr;
  FreeDeviceListFn free_device_list_ = nullptr;
  GetDeviceNameFn get_device_name_ = nullptr;
  OpenDeviceFn open_device_ = nullptr;
  CloseDeviceFn close_device_ = nullptr;
  QueryPortFn query_port_ = nullptr;
  QueryGidExFn query_gid_ex_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<VerbsProvider>> OpenLibibverbs() {
  dlerror();
  void* handle = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::UnavailableError(absl::StrCat("libibverbs.so.1 not loadable: ", err ? err : "?"));
  }
  auto provider = std::make_unique<LibibverbsProvider>(handle);
  if (absl::Status s = provider->Resolve(); !s.ok()) return s;
  return std::unique_ptr<VerbsProvider>(std::move(provider));
}
#else
absl::StatusOr<std::unique_ptr<VerbsProvider>> OpenLibibverbs() {
  return absl::UnavailableError("built without <infiniband/verbs.h>; libibverbs checks skipped");
}
#endif

}  // namespace glm::preflight
