// The RoCE GID table: reading it from sysfs, classifying entries, and choosing the index NCCL
// must use (NCCL_IB_GID_INDEX). The right entry is RoCE v2, bound to the fabric netdev, and
// carries the node's fabric IPv4 as an IPv4-mapped address (::ffff:a.b.c.d). Link-local entries
// (fe80::/10, ::ffff:169.254.0.0/16) time out at QP setup (NVIDIA/nccl#769, #426).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/preflight/check.h"
#include "agent/preflight/sysfs.h"

namespace glm::preflight {

// "0000:0000:0000:0000:0000:ffff:c0a8:6401" → "::ffff:192.168.100.1"; fe80 etc. in short IPv6
// form; returns the input unchanged when it does not parse.
std::string FormatGid(const std::string& sysfs_gid);

// The IPv4 carried by an IPv4-mapped GID ("192.168.100.1"), or nullopt.
std::optional<std::string> GidIpv4(const std::string& sysfs_gid);

bool GidIsZero(const std::string& sysfs_gid);
// fe80::/10 or IPv4-mapped 169.254.0.0/16.
bool GidIsLinkLocal(const std::string& sysfs_gid);

// Every non-zero entry of <sysfs>/class/infiniband/<hca>/ports/<port>/gids/*, with the type and
// netdev from gid_attrs/{types,ndevs}/<i> (empty when unreadable, as the kernel does for unused
// entries). Sorted by index. NotFound when the port has no gids directory.
absl::StatusOr<std::vector<GidEntry>> ReadGidTable(const SystemRoots& roots, const std::string& hca,
                                                   int port);

// A stable fingerprint of a GID table (AgentStatus.gid_fingerprint): "xxh64:" + 16 lowercase
// hex digits of XXH64 (seed 0) over the entries sorted by (hca, port, index), one line each,
// "<hca> <port> <index> <gid> <type> <netdev>\n" in their sysfs spellings. Independent of the
// order the entries come in; any changed, added or removed entry changes it. "" for an empty
// table.
std::string GidTableFingerprint(std::vector<GidEntry> table);

// Lowest-index entry that is RoCE v2, on `netdev`, and carries `fabric_ip`. Nullopt when none.
std::optional<GidEntry> ResolveGidIndex(const std::vector<GidEntry>& table,
                                        const std::string& fabric_ip, const std::string& netdev);

// What the gid.index check needs to know about the node.
struct GidCheckInput {
  std::string node;
  std::string hca;
  int port = 1;
  std::optional<int> gid_index;  // nullopt = "auto".
  std::string fabric_ip;
  std::string netdev;
};

// The gid.index check. On success `resolved` holds the entry NCCL should use. On failure the fix
// names the index that would be right (this HCA or another one), or how to persist the fabric IP.
// When sysfs has no GID table for the port and `verbs` is given, the table comes from
// libibverbs (ibv_query_gid_ex) instead; the evidence says which source was used.
class VerbsProvider;
CheckResult CheckGidIndex(const SystemRoots& roots, const GidCheckInput& input,
                          std::optional<GidEntry>* resolved, VerbsProvider* verbs = nullptr);

}  // namespace glm::preflight
