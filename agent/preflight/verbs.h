// Optional libibverbs view of the RDMA ports (the sysfs view is always read). The real provider
// dlopens libibverbs.so.1 at run time, so the agent binary never needs it installed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/preflight/check.h"

namespace glm::preflight {

struct VerbsPortInfo {
  int state = 0;             // ibv_port_state: 4 = ACTIVE.
  int active_mtu_bytes = 0;  // 256..4096.
  int max_mtu_bytes = 0;
  bool ethernet = false;     // link_layer == IBV_LINK_LAYER_ETHERNET.
};

// Thread-compatible. Implementations: LibibverbsProvider (real), tests' fakes.
class VerbsProvider {
 public:
  virtual ~VerbsProvider() = default;
  virtual absl::StatusOr<std::vector<std::string>> DeviceNames() = 0;
  virtual absl::StatusOr<VerbsPortInfo> QueryPort(const std::string& hca, int port) = 0;
  // Non-zero GID entries (ibv_query_gid_ex), in the sysfs spelling with the sysfs type names
  // ("IB/RoCE v1", "RoCE v2") and the netdev name, so they compare with ReadGidTable's.
  virtual absl::StatusOr<std::vector<GidEntry>> QueryGidTable(const std::string& hca, int port) = 0;
};

// dlopen("libibverbs.so.1"); Unavailable (with the dlerror text) when it cannot be loaded.
absl::StatusOr<std::unique_ptr<VerbsProvider>> OpenLibibverbs();

// IB MTU enum value (1..5) → bytes (256..4096); 0 for anything else.
int IbMtuEnumToBytes(int mtu_enum);
// The active RoCE MTU the kernel derives from a netdev MTU (iboe_get_mtu): the largest IB MTU
// not above netdev_mtu minus the 96 bytes of RoCE v2 headers. 0 when below 256.
int RoceMtuForNetdevMtu(int netdev_mtu);

}  // namespace glm::preflight
