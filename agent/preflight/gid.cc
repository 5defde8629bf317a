#include "agent/preflight/gid.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/preflight/verbs.h"
#include "xxhash.h"

namespace glm::preflight {
namespace {

// Parses the sysfs GID spelling (8 groups of 4 hex digits) or any inet_pton IPv6 spelling.
std::optional<std::array<uint8_t, 16>> ParseGid(const std::string& gid) {
  std::array<uint8_t, 16> bytes{};
  std::vector<std::string> groups = absl::StrSplit(gid, ':');
  if (groups.size() == 8 && std::all_of(groups.begin(), groups.end(), [](const std::string& g) {
        return g.size() == 4;
      })) {
    for (size_t i = 0; i < 8; ++i) {
      char* end = nullptr;
      unsigned long v = std::strtoul(groups[i].c_str(), &end, 16);
      if (end == nullptr || *end != '\0') return std::nullopt;
      bytes[2 * i] = static_cast<uint8_t>(v >> 8);
      bytes[2 * i + 1] = static_cast<uint8_t>(v & 0xff);
    }
    return bytes;
  }
  if (inet_pton(AF_INET6, gid.c_str(), bytes.data()) == 1) return bytes;
  return std::nullopt;
}

bool IsV4Mapped(const std::array<uint8_t, 16>& b) {
  for (int i = 0; i < 10; ++i) {
    if (b[i] != 0) return false;
  }
  return b[10] == 0xff && b[11] == 0xff;
}

std::string Ipv4Of(const std::array<uint8_t, 16>& b) {
  return absl::StrCat(b[12], ".", b[13], ".", b[14], ".", b[15]);
}

// Why `e` is not the right entry, or "" when it is.
std::string WhyWrong(const GidEntry& e, const std::string& fabric_ip, const std::string& netdev) {
  if (GidIsZero(e.gid)) return "the entry is empty (all-zero GID)";
  if (GidIsLinkLocal(e.gid)) {
    return absl::StrCat("the entry is link-local (", FormatGid(e.gid),
                        "); link-local GIDs time out at QP setup");
  }
  if (e.type != "RoCE v2") {
    return absl::StrCat("the entry is ", e.type.empty() ? "of unknown type" : e.type,
                        ", not RoCE v2");
  }
  std::optional<std::string> ip = GidIpv4(e.gid);
  if (!ip.has_value()) return absl::StrCat("the entry is an IPv6 address (", FormatGid(e.gid), "), not the fabric IPv4");
  if (*ip != fabric_ip) {
    return absl::StrCat("the entry carries ", *ip, ", not the fabric IP ", fabric_ip);
  }
  if (e.netdev != netdev) {
    return absl::StrCat("the entry is bound to netdev '", e.netdev, "', not '", netdev, "'");
  }
  return "";
}

std::string DescribeTable(const std::vector<GidEntry>& table) {
  std::vector<std::string> rows;
  for (const GidEntry& e : table) {
    rows.push_back(absl::StrCat(e.index, "=", FormatGid(e.gid), "/", e.type.empty() ? "?" : e.type,
                                "/", e.netdev.empty() ? "?" : e.netdev));
  }
  return rows.empty() ? "(empty)" : absl::StrJoin(rows, " ");
}

}  // namespace

std::string FormatGid(const std::string& sysfs_gid) {
  std::optional<std::array<uint8_t, 16>> b = ParseGid(sysfs_gid);
  if (!b.has_value()) return sysfs_gid;
  if (IsV4Mapped(*b)) return absl::StrCat("::ffff:", Ipv4Of(*b));
  char buf[INET6_ADDRSTRLEN];
  if (inet_ntop(AF_INET6, b->data(), buf, sizeof(buf)) == nullptr) return sysfs_gid;
  return buf;
}

std::optional<std::string> GidIpv4(const std::string& sysfs_gid) {
  std::optional<std::array<uint8_t, 16>> b = ParseGid(sysfs_gid);
  if (!b.has_value() || !IsV4Mapped(*b)) return std::nullopt;
  return Ipv4Of(*b);
}

bool GidIsZero(const std::string& sysfs_gid) {
  std::optional<std::array<uint8_t, 16>> b = ParseGid(sysfs_gid);
  if (!b.has_value()) return false;
  return std::all_of(b->begin(), b->end(), [](uint8_t x) { return x == 0; });
}

bool GidIsLinkLocal(const std::string& sysfs_gid) {
  std::optional<std::array<uint8_t, 16>> b = ParseGid(sysfs_gid);
  if (!b.has_value()) return false;
  if ((*b)[0] == 0xfe && ((*b)[1] & 0xc0) == 0x80) return true;
  return IsV4Mapped(*b) && (*b)[12] == 169 && (*b)[13] == 254;
}

absl::StatusOr<std::vector<GidEntry>> ReadGidTable(const SystemRoots& roots, const std::string& hca,
                                                   int port) {
  std::string port_dir =
      absl::StrCat(roots.sysfs, "/class/infiniband/", hca, "/ports/", port);
  std::string gids_dir = absl::StrCat(port_dir, "/gids");
  if (!PathExists(gids_dir)) {
    return absl::NotFoundError(absl::StrCat(gids_dir, ": no GID table for ", hca, " port ", port));
  }
  std::vector<GidEntry> table;
  for (const std::string& name : ListDir(gids_dir)) {
    int index = 0;
    if (!absl::SimpleAtoi(name, &index)) continue;
    absl::StatusOr<std::string> gid = ReadTrimmed(absl::StrCat(gids_dir, "/", name));
    if (!gid.ok() || gid->empty() || GidIsZero(*gid)) continue;
    GidEntry e;
    e.hca = hca;
    e.port = port;
    e.index = index;
    e.gid = *gid;
    absl::StatusOr<std::string> type = ReadTrimmed(absl::StrCat(port_dir, "/gid_attrs/types/", name));
    if (type.ok()) e.type = *type;
    absl::StatusOr<std::string> ndev = ReadTrimmed(absl::StrCat(port_dir, "/gid_attrs/ndevs/", name));
    if (ndev.ok()) e.netdev = *ndev;
    table.push_back(std::move(e));
  }
  std::sort(table.begin(), table.end(),
            [](const GidEntry& a, const GidEntry& b) { return a.index < b.index; });
  return table;
}

std::string GidTableFingerprint(std::vector<GidEntry> table) {
  if (table.empty()) return "";
  std::sort(table.begin(), table.end(), [](const GidEntry& a, const GidEntry& b) {
    return std::tie(a.hca, a.port, a.index) < std::tie(b.hca, b.port, b.index);
  });
  std::string text;
  for (const GidEntry& e : table) {
    absl::StrAppend(&text, e.hca, " ", e.port, " ", e.index, " ", e.gid, " ", e.type, " ",
                    e.netdev, "\n");
  }
  const XXH64_hash_t h = XXH64(text.data(), text.size(), 0);
  return absl::StrCat("xxh64:", absl::Hex(h, absl::kZeroPad16));
}

std::optional<GidEntry> ResolveGidIndex(const std::vector<GidEntry>& table,
                                        const std::string& fabric_ip, const std::string& netdev) {
  for (const GidEntry& e : table) {
    if (WhyWrong(e, fabric_ip, netdev).empty()) return e;
  }
  return std::nullopt;
}

CheckResult CheckGidIndex(const SystemRoots& roots, const GidCheckInput& in,
                          std::optional<GidEntry>* resolved, VerbsProvider* verbs) {
  CheckResult r;
  r.id = "gid.index";
  resolved->reset();
  const std::string configured =
      in.gid_index.has_value() ? std::to_string(*in.gid_index) : std::string("auto");
  absl::StatusOr<std::vector<GidEntry>> table = ReadGidTable(roots, in.hca, in.port);
  std::string source = "sysfs";
  if (!table.ok() && verbs != nullptr) {
    absl::StatusOr<std::vector<GidEntry>> from_verbs = verbs->QueryGidTable(in.hca, in.port);
    if (from_verbs.ok()) {
      table = std::move(from_verbs);
      source = "libibverbs";
    }
  }
  if (!table.ok()) {
    r.status = CheckStatus::kFail;
    r.message = absl::StrCat("cannot read the GID table of ", in.hca, " port ", in.port);
    r.evidence = std::string(table.status().message());
    r.fix = absl::StrCat("check that HCA '", in.hca, "' exists (rdma.hca) and that sysfs is mounted");
    return r;
  }
  r.evidence = absl::StrCat("gid table (", source, ") ", in.hca, " port ", in.port, ": ",
                            DescribeTable(*table));
  std::optional<GidEntry> right = ResolveGidIndex(*table, in.fabric_ip, in.netdev);

  if (right.has_value() && (!in.gid_index.has_value() || *in.gid_index == right->index)) {
    *resolved = right;
    r.status = CheckStatus::kPass;
    r.message = absl::StrCat("gid_index ", configured, " → ", right->Describe());
    return r;
  }

  r.status = CheckStatus::kFail;
  std::string what;
  if (in.gid_index.has_value()) {
    auto it = std::find_if(table->begin(), table->end(),
                           [&](const GidEntry& e) { return e.index == *in.gid_index; });
    what = it == table->end()
               ? absl::StrCat("gid_index ", *in.gid_index, " on ", in.hca, " port ", in.port,
                              " is empty (all-zero GID)")
               : absl::StrCat("gid_index ", *in.gid_index, " on ", in.hca, " port ", in.port,
                              " is wrong: ", WhyWrong(*it, in.fabric_ip, in.netdev));
  } else {
    what = absl::StrCat("gid_index auto: no entry on ", in.hca, " port ", in.port,
                        " is RoCE v2 with fabric IP ", in.fabric_ip, " on ", in.netdev);
  }

  if (right.has_value()) {
    r.message = absl::StrCat(what, "; the right entry is index ", right->index, " (",
                             right->Describe(), ")");
    r.fix = absl::StrCat("set gid_index: ", right->index, " for node ", in.node,
                         " (or gid_index: auto, which resolves per node)");
    return r;
  }

  // No right entry on this HCA: is the fabric IP on another HCA's table?
  std::optional<GidEntry> elsewhere;
  for (const std::string& other : ListDir(absl::StrCat(roots.sysfs, "/class/infiniband"))) {
    if (other == in.hca) continue;
    for (const std::string& port_name :
         ListDir(absl::StrCat(roots.sysfs, "/class/infiniband/", other, "/ports"))) {
      int port = 0;
      if (!absl::SimpleAtoi(port_name, &port)) continue;
      absl::StatusOr<std::vector<GidEntry>> t = ReadGidTable(roots, other, port);
      if (!t.ok()) continue;
      for (const GidEntry& e : *t) {
        if (e.type == "RoCE v2" && GidIpv4(e.gid) == in.fabric_ip && !elsewhere.has_value()) {
          elsewhere = e;
        }
      }
    }
  }
  bool only_link_local = !table->empty() && std::all_of(table->begin(), table->end(), [](const GidEntry& e) {
    return GidIsLinkLocal(e.gid);
  });
  r.message = absl::StrCat(what, "; no entry on this port carries ", in.fabric_ip,
                           only_link_local ? " (the port has only link-local GIDs: its netdev has no routable IPv4)" : "");
  if (elsewhere.has_value()) {
    r.fix = absl::StrCat("the fabric IP ", in.fabric_ip, " is on ", elsewhere->Describe(),
                         ": set hca: ", elsewhere->hca, ", netdev: ", elsewhere->netdev,
                         ", gid_index: ", elsewhere->index, " for node ", in.node,
                         "; or assign ", in.fabric_ip, " to ", in.netdev,
                         " persistently (e.g. netplan addresses:) and re-run preflight");
  } else {
    r.fix = absl::StrCat("assign the fabric IP ", in.fabric_ip, " to ", in.netdev,
                         " persistently (e.g. netplan: ethernets: ", in.netdev, ": addresses: [",
                         in.fabric_ip, "/<prefix>], dhcp4: false; then `netplan apply`), "
                         "check `ip -4 addr show ", in.netdev, "`, and re-run preflight");
  }
  return r;
}

}  // namespace glm::preflight
