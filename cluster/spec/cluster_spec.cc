#include "cluster/spec/cluster_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_util.h"
#include "yaml-cpp/yaml.h"

namespace glm::cluster {
namespace {

constexpr size_t kMaxInputBytes = 1 << 20;  // a cluster.yaml is a few KiB
constexpr int kMaxFlowDepth = 64;           // yaml-cpp recurses per nesting level
constexpr size_t kMaxErrors = 40;

SourceLocation LocOf(const YAML::Node& node) {
  YAML::Mark mark = node.Mark();
  if (mark.line < 0) return {};
  return {mark.line + 1, mark.column + 1};
}

std::string Quote(std::string_view s) {
  std::string out(s.substr(0, 80));
  if (s.size() > 80) out += "...";
  return absl::StrCat("\"", out, "\"");
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return Quote(node.Scalar());
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "an undefined value";
  }
}

std::optional<uint32_t> ParseIpv4(std::string_view s) {
  uint32_t value = 0;
  int parts = 0;
  size_t i = 0;
  while (parts < 4) {
    if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) return std::nullopt;
    int octet = 0;
    size_t digits = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      octet = octet * 10 + (s[i] - '0');
      if (++digits > 3 || octet > 255) return std::nullopt;
      ++i;
    }
    value = (value << 8) | static_cast<uint32_t>(octet);
    ++parts;
    if (parts < 4) {
      if (i >= s.size() || s[i] != '.') return std::nullopt;
      ++i;
    }
  }
  if (i != s.size()) return std::nullopt;
  return value;
}

bool IsHostname(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find('.', start);
    if (end == std::string_view::npos) end = s.size();
    std::string_view label = s.substr(start, end - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
    }
    start = end + 1;
    if (end == s.size()) break;
  }
  // All-numeric dotted names must be valid IPv4 (caught by the caller).
  return true;
}

bool IsIpv6(std::string_view s) {
  if (s.size() < 2 || s.find(':') == std::string_view::npos) return false;
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') return false;
  }
  return true;
}

// Splits "host:port" / "[v6]:port". Returns a reason on failure.
std::optional<std::string> ParseAddress(std::string_view text, bool allow_port_zero,
                                        std::string* host, int* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return "has no `:port`";
  std::string_view h = text.substr(0, colon);
  std::string_view p = text.substr(colon + 1);
  if (p.empty() || p.size() > 5 ||
      !std::all_of(p.begin(), p.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    return absl::StrCat("port ", Quote(p), " is not a number");
  }
  int port_value = std::stoi(std::string(p));
  if (port_value > 65535 || (port_value == 0 && !allow_port_zero)) {
    return absl::StrCat("port ", port_value, " is out of range");
  }
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
    if (!IsIpv6(h.substr(1, h.size() - 2))) return absl::StrCat("host ", Quote(h), " is not an IPv6 address");
  } else if (h.find(':') != std::string_view::npos) {
    return "IPv6 hosts need brackets, e.g. [::1]:47101";
  } else {
    bool numeric = !h.empty() && std::all_of(h.begin(), h.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c)) || c == '.';
    });
    if (numeric ? !ParseIpv4(h).has_value() : !IsHostname(h)) {
      return absl::StrCat("host ", Quote(h), " is not an IPv4 address or host name");
    }
  }
  *host = std::string(h);
  *port = port_value;
  return std::nullopt;
}

bool IsLoopbackHost(std::string_view host) {
  if (host == "localhost" || host == "[::1]") return true;
  auto ip = ParseIpv4(host);
  return ip.has_value() && (*ip >> 24) == 127;
}

std::string FormatIpv4(uint32_t ip) {
  return absl::StrCat(ip >> 24, ".", (ip >> 16) & 255, ".", (ip >> 8) & 255, ".", ip & 255);
}

// Keys of each section, for "did you mean" and "belongs under" hints.
const std::vector<std::pair<std::string, std::vector<std::string>>>& Sections() {
  static const auto* sections = new std::vector<std::pair<std::string, std::vector<std::string>>>{
      {"", {"name", "local", "controller", "model", "parallel", "nccl", "fabric", "node_defaults",
            "nodes", "page_cache", "lifecycle"}},
      {"controller", {"listen", "gateway", "tls", "insecure", "api_key_file", "gateway_queue"}},
      {"controller.tls", {"ca", "cert", "key"}},
      {"controller.gateway_queue", {"max_requests", "timeout_s"}},
      {"model", {"path", "served_name", "max_model_len", "kv_cache_dtype", "backend",
                 "weight_dtype", "kv_cache_bytes", "kv_cache_memory_fraction",
                 "activation_reserve_bytes", "max_num_seqs", "mtp_draft_tokens", "canary"}},
      {"model.canary", {"prompt", "prompt_ids", "expect", "expect_ids", "max_tokens"}},
      {"parallel", {"tensor", "pipeline", "replicas", "layer_partition", "micro_batches"}},
      {"nccl", {"library", "source", "expected_version", "env"}},
      {"fabric", {"mtu", "subnet", "link_bandwidth", "hop_latency_us"}},
      {"node_defaults", {"hca", "port", "gid_index", "netdev", "memory_budget_bytes",
                         "memory_bandwidth", "memory_bandwidth_efficiency"}},
      {"nodes[]", {"name", "agent", "fabric_ip", "hca", "port", "gid_index", "netdev",
                   "memory_budget_bytes", "memory_bandwidth", "memory_bandwidth_efficiency",
                   "gpu"}},
      {"page_cache", {"policy", "interval_s", "min_available_bytes"}},
      {"lifecycle", {"restart_budget", "restart_window_s", "drain_timeout_s"}},
  };
  return *sections;
}

const std::vector<std::string>& KeysOf(std::string_view section) {
  for (const auto& [name, keys] : Sections()) {
    if (name == section) return keys;
  }
  static const std::vector<std::string> kNone;
  return kNone;
}

struct Field {
  YAML::Node value;
  SourceLocation key_loc;
  SourceLocation value_loc;  // falls back to key_loc for empty values
};

class Parser;

// One YAML mapping whose keys were checked against a section of the schema.
class MapView {
 public:
  MapView() = default;
  MapView(std::string path, SourceLocation loc) : path_(std::move(path)), loc_(loc) {}
  bool valid() const { return valid_; }
  const Field* Get(std::string_view key) const {
    auto it = fields_.find(std::string(key));
    return it == fields_.end() ? nullptr : &it->second;
  }
  std::string Path(std::string_view key) const {
    return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", ToAbsl(key));
  }
  const std::string& path() const { return path_; }
  SourceLocation loc() const { return loc_; }

 private:
  friend class Parser;
  std::string path_;
  SourceLocation loc_;
  bool valid_ = false;
  std::map<std::string, Field> fields_;
};

class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  bool has_errors() const { return !errors_.empty(); }

  // Messages in file order (stable for equal positions).
  std::vector<std::string> SortedErrors() const {
    std::vector<std::pair<std::pair<int, int>, std::string>> sorted = errors_;
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::string> out;
    for (auto& e : sorted) out.push_back(std::move(e.second));
    return out;
  }

  void Error(SourceLocation loc, std::string_view field, std::string_view what,
             std::string_view expected) {
    if (errors_.size() >= kMaxErrors) return;
    std::string where = loc.line > 0 ? absl::StrCat(source_, ":", loc.line, ":", loc.column)
                                     : source_;
    errors_.push_back({{loc.line, loc.column},
                       absl::StrCat(where, ": field `", ToAbsl(field), "`: ", ToAbsl(what),
                                    "; expected ", ToAbsl(expected))});
  }

  // Checks that `node` is a mapping whose keys belong to `section`; `path` names it in messages.
  MapView Map(const YAML::Node& node, std::string path, std::string_view section,
              SourceLocation fallback) {
    SourceLocation loc = LocOf(node);
    if (loc.line == 0) loc = fallback;
    MapView view(path, loc);
    if (!node.IsMap()) {
      Error(loc, path.empty() ? "(top level)" : path, absl::StrCat("got ", Describe(node)),
            absl::StrCat("a mapping with keys: ", absl::StrJoin(KeysOf(section), ", ")));
      return view;
    }
    view.valid_ = true;
    const auto& allowed = KeysOf(section);
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node key = it->first;  // a copy: `it->` yields a temporary
      SourceLocation key_loc = LocOf(key);
      if (!key.IsScalar()) {
        Error(key_loc, path.empty() ? "(top level)" : path, "a key is not a plain name",
              absl::StrCat("one of: ", absl::StrJoin(allowed, ", ")));
        continue;
      }
      const std::string& name = key.Scalar();
      std::string field_path = view.Path(name);
      if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
        UnknownKey(key_loc, field_path, name, section, allowed);
        continue;
      }
      if (view.fields_.count(name) > 0) {
        Error(key_loc, field_path,
              absl::StrCat("is given twice (first at line ", view.fields_[name].key_loc.line, ")"),
              "each key once");
        continue;
      }
      Field field;
      field.value = it->second;
      field.key_loc = key_loc;
      field.value_loc = LocOf(it->second);
      if (field.value_loc.line == 0 || it->second.IsNull()) field.value_loc = key_loc;
      view.fields_[name] = field;
    }
    return view;
  }

  void UnknownKey(SourceLocation loc, const std::string& field_path, const std::string& name,
                  std::string_view section, const std::vector<std::string>& allowed) {
    std::string hint;
    size_t best = std::string::npos;
    for (const auto& candidate : allowed) {
      size_t d = EditDistance(name, candidate);
      if (d < best) {
        best = d;
        hint = candidate;
      }
    }
    // A key of another section, spelled right, is misplaced rather than misspelled (`mtu` under
    // a node is fabric's, not a typo of `gpu`).
    std::string what;
    for (const auto& [other, keys] : Sections()) {
      if (other == section || other.empty()) continue;
      if (std::find(keys.begin(), keys.end(), name) != keys.end()) {
        what = absl::StrCat("unknown key here; `", name, "` belongs under `", other, "`");
        break;
      }
    }
    if (what.empty()) {
      const size_t limit = std::max<size_t>(2, name.size() / 3);
      what = best <= limit ? absl::StrCat("unknown key; did you mean `", hint, "`?")
                           : std::string("unknown key");
    }
    Error(loc, field_path, what, absl::StrCat("one of: ", absl::StrJoin(allowed, ", ")));
  }

  // Scalar getters. Each returns false (after recording an error) when the value is unusable,
  // true when it was absent-and-optional or parsed into *out.
  bool Present(const MapView& m, std::string_view key, bool required, std::string_view expected,
               const Field** out) {
    *out = m.valid() ? m.Get(key) : nullptr;
    if (*out == nullptr || (*out)->value.IsNull()) {
      if (required && m.valid()) {
        Error(*out ? (*out)->key_loc : m.loc(), m.Path(key), *out ? "is empty" : "is missing",
              expected);
      }
      *out = nullptr;
      return !required;
    }
    return true;
  }

  bool Scalar(const MapView& m, const Field& f, std::string_view key, std::string_view expected) {
    if (f.value.IsScalar()) return true;
    Error(f.value_loc, m.Path(key), absl::StrCat("got ", Describe(f.value)), expected);
    return false;
  }

  bool String(const MapView& m, std::string_view key, bool required, std::string* out) {
    const Field* f;
    if (!Present(m, key, required, "a string", &f)) return false;
    if (f == nullptr) return true;
    if (!Scalar(m, *f, key, "a string")) return false;
    if (f->value.Scalar().empty()) {
      Error(f->value_loc, m.Path(key), "is an empty string", "a non-empty string");
      return false;
    }
    *out = f->value.Scalar();
    return true;
  }

  bool Int(const MapView& m, std::string_view key, bool required, int64_t lo, int64_t hi,
           int64_t* out) {
    std::string expected = absl::StrCat("an integer in ", lo, "..", hi);
    const Field* f;
    if (!Present(m, key, required, expected, &f)) return false;
    if (f == nullptr) return true;
    if (!Scalar(m, *f, key, expected)) return false;
    std::optional<int64_t> v = ParseInteger(f->value.Scalar());
    if (!v.has_value()) {
      Error(f->value_loc, m.Path(key), absl::StrCat("got ", Quote(f->value.Scalar())), expected);
      return false;
    }
    if (*v < lo || *v > hi) {
      Error(f->value_loc, m.Path(key), absl::StrCat("got ", *v), expected);
      return false;
    }
    *out = *v;
    return true;
  }

  bool Int32(const MapView& m, std::string_view key, bool required, int lo, int hi, int* out) {
    int64_t v = *out;
    if (!Int(m, key, required, lo, hi, &v)) return false;
    *out = static_cast<int>(v);
    return true;
  }

  bool Double(const MapView& m, std::string_view key, double lo, double hi, bool lo_open,
              std::optional<double>* out) {
    std::string expected =
        absl::StrCat("a number in ", lo_open ? "(" : "[", lo, ", ", hi, "]");
    const Field* f;
    if (!Present(m, key, false, expected, &f)) return false;
    if (f == nullptr) return true;
    if (!Scalar(m, *f, key, expected)) return false;
    const std::string& s = f->value.Scalar();
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) {
      Error(f->value_loc, m.Path(key), absl::StrCat("got ", Quote(s)), expected);
      return false;
    }
    if (v < lo || v > hi || (lo_open && v == lo)) {
      Error(f->value_loc, m.Path(key), absl::StrCat("got ", s), expected);
      return false;
    }
    *out = v;
    return true;
  }

  bool Bool(const MapView& m, std::string_view key, bool* out) {
    const Field* f;
    if (!Present(m, key, false, "true or false", &f)) return false;
    if (f == nullptr) return true;
    if (!Scalar(m, *f, key, "true or false")) return false;
    const std::string& s = f->value.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") {
      *out = true;
    } else if (s == "false" || s == "False" || s == "FALSE") {
      *out = false;
    } else {
      Error(f->value_loc, m.Path(key), absl::StrCat("got ", Quote(s)), "true or false");
      return false;
    }
    return true;
  }

  bool Size(const MapView& m, std::string_view key, bool allow_zero,
            std::optional<int64_t>* out) {
    constexpr char kExpected[] = "a byte size: an integer or a number with a unit, e.g. 96GiB";
    const Field* f;
    if (!Present(m, key, false, kExpected, &f)) return false;
    if (f == nullptr) return true;
    if (!Scalar(m, *f, key, kExpected)) return false;
    absl::StatusOr<int64_t> v = ParseByteSize(f->value.Scalar());
    if (!v.ok()) {
      Error(f->value_loc, m.Path(key), ToStd(v.status().message()), kExpected);
      return false;
    }
    if (*v == 0 && !allow_zero) {
      Error(f->value_loc, m.Path(key), "is zero", "a size above zero");
      return false;
    }
    *out = *v;
    return true;
  }

  // A rate with a unit (ParseRate), above zero and below 1 PB/s; `example` shows the fix.
  bool Rate(const MapView& m, std::string_view key, std::string_view example,
            std::optional<double>* out) {
    std::string expected = absl::StrCat(
        "a rate with its unit, e.g. ", ToAbsl(example),
        " (GB/s = gigabytes per second, Gb/s = gigabits per second)");
    const Field* f;
    if (!Present(m, key, false, expected, &f)) return false;
    if (f == nullptr) return true;
    if (!Scalar(m, *f, key, expected)) return false;
    absl::StatusOr<double> v = ParseRate(f->value.Scalar());
    if (!v.ok()) {
      Error(f->value_loc, m.Path(key), ToStd(v.status().message()), expected);
      return false;
    }
    if (*v <= 0 || *v >= 1e15) {
      Error(f->value_loc, m.Path(key), absl::StrCat("got ", Quote(f->value.Scalar())),
            absl::StrCat("a rate above zero and below 1PB/s, e.g. ", ToAbsl(example)));
      return false;
    }
    *out = *v;
    return true;
  }

  // Picks one of `choices` (exact match); otherwise reports the accepted values, then `note`
  // (what they mean, when a wrong value is a likely mix-up).
  bool Enum(const MapView& m, std::string_view key, const std::vector<std::string>& choices,
            std::string* out, std::string_view note = "") {
    std::string expected = absl::StrCat("one of: ", absl::StrJoin(choices, ", "));
    if (!note.empty()) absl::StrAppend(&expected, " (", ToAbsl(note), ")");
    const Field* f;
    if (!Present(m, key, false, expected, &f)) return false;
    if (f == nullptr) return true;
    if (!Scalar(m, *f, key, expected)) return false;
    const std::string& s = f->value.Scalar();
    if (std::find(choices.begin(), choices.end(), s) == choices.end()) {
      Error(f->value_loc, m.Path(key), absl::StrCat("got ", Quote(s)), expected);
      return false;
    }
    *out = s;
    return true;
  }

  static std::optional<int64_t> ParseInteger(const std::string& s) {
    if (s.empty() || s.size() > 19) return std::nullopt;
    size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
    if (i == s.size()) return std::nullopt;
    int64_t v = 0;
    for (; i < s.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(s[i]))) return std::nullopt;
      v = v * 10 + (s[i] - '0');
    }
    return s[0] == '-' ? -v : v;
  }

 private:
  std::string source_;
  std::vector<std::pair<std::pair<int, int>, std::string>> errors_;  // ((line, column), text)
};

// Maximum bracket nesting outside quotes; guards yaml-cpp's recursive descent.
int FlowDepth(std::string_view text) {
  int depth = 0;
  int max_depth = 0;
  char quote = 0;
  for (char c : text) {
    if (quote != 0) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    } else if (c == '\n') {
      quote = 0;
    }
  }
  return max_depth;
}

struct NodeDefaults {
  std::string hca;
  std::optional<int64_t> port;
  std::optional<std::optional<int>> gid_index;
  std::string netdev;
  std::optional<int64_t> memory_budget_bytes;
  std::optional<double> memory_bandwidth_bytes_per_s;
  std::optional<double> memory_bandwidth_efficiency;
};

// Parses `gid_index`: integer 0..255 or "auto". Returns false on error.
bool ParseGidIndex(Parser& p, const MapView& m, std::optional<std::optional<int>>* out) {
  const Field* f;
  constexpr char kExpected[] = "an integer 0..255 or `auto`";
  if (!p.Present(m, "gid_index", false, kExpected, &f)) return false;
  if (f == nullptr) return true;
  if (!p.Scalar(m, *f, "gid_index", kExpected)) return false;
  const std::string& s = f->value.Scalar();
  if (s == "auto") {
    *out = std::optional<int>();
    return true;
  }
  std::optional<int64_t> v = Parser::ParseInteger(s);
  if (!v.has_value() || *v < 0 || *v > 255) {
    p.Error(f->value_loc, m.Path("gid_index"), absl::StrCat("got ", Quote(s)), kExpected);
    return false;
  }
  *out = std::optional<int>(static_cast<int>(*v));
  return true;
}

void ParseNodeCommon(Parser& p, const MapView& m, NodeDefaults* d) {
  p.String(m, "hca", false, &d->hca);
  int64_t port = 1;
  if (m.Get("port") != nullptr && p.Int(m, "port", false, 1, 255, &port) &&
      m.Get("port")->value.IsScalar()) {
    d->port = port;
  }
  ParseGidIndex(p, m, &d->gid_index);
  p.String(m, "netdev", false, &d->netdev);
  p.Size(m, "memory_budget_bytes", false, &d->memory_budget_bytes);
  p.Rate(m, "memory_bandwidth", "273GB/s (DGX Spark) or 4.8TB/s (H200)",
         &d->memory_bandwidth_bytes_per_s);
  p.Double(m, "memory_bandwidth_efficiency", 0.0, 1.0, /*lo_open=*/true,
           &d->memory_bandwidth_efficiency);
}

void ParseController(Parser& p, const Field* f, ControllerSpec* c) {
  if (f == nullptr || f->value.IsNull()) return;
  MapView m = p.Map(f->value, "controller", "controller", f->key_loc);
  for (auto [key, out] : {std::pair<const char*, std::string*>{"listen", &c->listen},
                          {"gateway", &c->gateway}}) {
    std::string value;
    if (p.String(m, key, false, &value) && !value.empty()) {
      std::string host;
      int port = 0;
      if (auto why = ParseAddress(value, /*allow_port_zero=*/true, &host, &port)) {
        p.Error(m.Get(key)->value_loc, m.Path(key), absl::StrCat(Quote(value), " ", *why),
                "host:port, e.g. 0.0.0.0:47100 (port 0 picks a free port)");
      } else {
        *out = value;
      }
    }
  }
  p.Bool(m, "insecure", &c->insecure);
  p.String(m, "api_key_file", false, &c->api_key_file);
  const Field* queue = m.valid() ? m.Get("gateway_queue") : nullptr;
  if (queue != nullptr && !queue->value.IsNull()) {
    MapView q = p.Map(queue->value, "controller.gateway_queue", "controller.gateway_queue",
                      queue->key_loc);
    p.Int32(q, "max_requests", false, 1, 1 << 20, &c->gateway_queue.max_requests);
    std::optional<double> timeout;
    if (p.Double(q, "timeout_s", 0.0, 3600.0, /*lo_open=*/false, &timeout) && timeout) {
      c->gateway_queue.timeout_s = *timeout;
    }
  }
  const Field* tls = m.valid() ? m.Get("tls") : nullptr;
  if (tls != nullptr && !tls->value.IsNull()) {
    MapView t = p.Map(tls->value, "controller.tls", "controller.tls", tls->key_loc);
    TlsFiles files;
    bool ok = p.String(t, "ca", true, &files.ca);
    ok = p.String(t, "cert", true, &files.cert) && ok;
    ok = p.String(t, "key", true, &files.key) && ok;
    if (ok && t.valid()) c->tls = files;
  }
}

// A list of token ids (each 0 .. 2^31-1) at `path`; false after reporting an error.
bool TokenIds(Parser& p, const Field& f, const std::string& path, std::vector<int32_t>* out) {
  if (!f.value.IsSequence() || f.value.size() == 0) {
    p.Error(f.value_loc, path,
            f.value.IsSequence() ? std::string("is an empty list")
                                 : absl::StrCat("got ", Describe(f.value)),
            "a non-empty list of token ids, e.g. [9707, 11, 1879]");
    return false;
  }
  bool ok = true;
  for (size_t i = 0; i < f.value.size(); ++i) {
    const YAML::Node& e = f.value[i];
    std::optional<int64_t> v =
        e.IsScalar() ? Parser::ParseInteger(e.Scalar()) : std::optional<int64_t>();
    if (!v.has_value() || *v < 0 || *v > INT32_MAX) {
      SourceLocation loc = LocOf(e);
      if (loc.line == 0) loc = f.value_loc;
      p.Error(loc, absl::StrCat(path, "[", i, "]"), absl::StrCat("got ", Describe(e)),
              "a token id >= 0");
      ok = false;
      continue;
    }
    out->push_back(static_cast<int32_t>(*v));
  }
  return ok;
}

void ParseCanary(Parser& p, const Field* f, CanarySpec* canary) {
  if (f == nullptr || f->value.IsNull()) return;
  MapView m = p.Map(f->value, "model.canary", "model.canary", f->key_loc);
  if (!m.valid()) return;
  canary->present = true;
  p.String(m, "prompt", false, &canary->prompt);
  p.String(m, "expect", false, &canary->expect);
  for (const auto& [key, ids] : {std::pair<const char*, std::vector<int32_t>*>{
                                     "prompt_ids", &canary->prompt_ids},
                                 {"expect_ids", &canary->expect_ids}}) {
    if (const Field* list = m.Get(key)) TokenIds(p, *list, m.Path(key), ids);
  }
  p.Int32(m, "max_tokens", false, 1, 4096, &canary->max_tokens);
  for (const auto& [text, ids] : {std::pair<const char*, const char*>{"prompt", "prompt_ids"},
                                  {"expect", "expect_ids"}}) {
    const Field* a = m.Get(text);
    const Field* b = m.Get(ids);
    if (a != nullptr && b != nullptr) {
      p.Error(b->key_loc, m.Path(ids), absl::StrCat("is given together with `", m.Path(text), "`"),
              absl::StrCat("one of ", text, " (text) and ", ids, " (token ids)"));
    }
  }
  if (m.Get("prompt") != nullptr && canary->prompt.empty()) {
    p.Error(m.Get("prompt")->value_loc, m.Path("prompt"), "is empty", "some prompt text");
  }
  if (!canary->expect_ids.empty() && canary->max_tokens > 0 &&
      canary->max_tokens < static_cast<int>(canary->expect_ids.size())) {
    p.Error(m.Get("max_tokens")->value_loc, m.Path("max_tokens"),
            absl::StrCat("is ", canary->max_tokens, ", fewer than the ",
                         canary->expect_ids.size(), " expect_ids"),
            "at least len(expect_ids), or leave it out");
  }
}

void ParseModel(Parser& p, const Field* f, ModelSpec* model) {
  MapView m = p.Map(f->value, "model", "model", f->key_loc);
  model->location = m.loc();
  p.String(m, "path", true, &model->path);
  p.String(m, "served_name", false, &model->served_name);
  if (model->served_name.empty() && !model->path.empty()) {
    std::string trimmed = model->path;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    model->served_name = std::filesystem::path(trimmed).filename().string();
  }
  p.Int(m, "max_model_len", true, 1, int64_t{1} << 32, &model->max_model_len);
  if (const Field* len = m.valid() ? m.Get("max_model_len") : nullptr) {
    model->max_model_len_location = len->value_loc;
  }
  std::string dtype = "fp8";
  p.Enum(m, "kv_cache_dtype", {"fp8", "bf16"}, &dtype);
  model->kv_cache_dtype = dtype == "bf16" ? KvCacheDtype::kBf16 : KvCacheDtype::kFp8;
  std::string backend = "auto";
  p.Enum(m, "backend", {"auto", "cpu", "cuda"}, &backend,
         "auto: cuda where the node has a usable GPU, else cpu");
  model->backend = backend == "cuda"  ? EngineBackend::kCuda
                   : backend == "cpu" ? EngineBackend::kCpu
                                      : EngineBackend::kAuto;
  std::string weight_dtype = "auto";
  p.Enum(m, "weight_dtype", {"auto", "bf16", "fp32"}, &weight_dtype,
         "auto keeps an fp8 checkpoint's weights fp8 with block scales");
  model->weight_dtype = weight_dtype == "bf16"   ? WeightDtype::kBf16
                        : weight_dtype == "fp32" ? WeightDtype::kFp32
                                                 : WeightDtype::kAuto;
  p.Size(m, "kv_cache_bytes", false, &model->kv_cache_bytes);
  p.Double(m, "kv_cache_memory_fraction", 0.0, 1.0, /*lo_open=*/true,
           &model->kv_cache_memory_fraction);
  if (m.valid() && m.Get("kv_cache_bytes") != nullptr && m.Get("kv_cache_memory_fraction") != nullptr) {
    const Field* second = m.Get("kv_cache_bytes");
    const Field* other = m.Get("kv_cache_memory_fraction");
    auto pos = [](const Field* x) { return std::make_pair(x->key_loc.line, x->key_loc.column); };
    if (pos(other) > pos(second)) std::swap(second, other);
    bool bytes_second = second == m.Get("kv_cache_bytes");
    p.Error(second->key_loc, m.Path(bytes_second ? "kv_cache_bytes" : "kv_cache_memory_fraction"),
            absl::StrCat("is given together with `model.",
                         bytes_second ? "kv_cache_memory_fraction" : "kv_cache_bytes",
                         "` (line ", other->key_loc.line, ")"),
            "at most one of kv_cache_bytes and kv_cache_memory_fraction");
  }
  p.Size(m, "activation_reserve_bytes", true, &model->activation_reserve_bytes);
  p.Int32(m, "max_num_seqs", false, 1, 1 << 20, &model->max_num_seqs);
  p.Int32(m, "mtp_draft_tokens", false, 0, 16, &model->mtp_draft_tokens);
  ParseCanary(p, m.valid() ? m.Get("canary") : nullptr, &model->canary);
}

void ParseParallel(Parser& p, const Field* f, ParallelSpec* par) {
  if (f == nullptr || f->value.IsNull()) return;
  MapView m = p.Map(f->value, "parallel", "parallel", f->key_loc);
  p.Int32(m, "tensor", false, 1, 1024, &par->tensor);
  p.Int32(m, "pipeline", false, 1, 1024, &par->pipeline);
  p.Int32(m, "replicas", false, 1, 1024, &par->replicas);
  // More steps in flight than stages add no overlap, only queueing.
  p.Int32(m, "micro_batches", false, 1, std::max(1, par->pipeline), &par->micro_batches);
  const Field* lp = m.valid() ? m.Get("layer_partition") : nullptr;
  if (lp == nullptr || lp->value.IsNull()) return;
  par->layer_partition_location = lp->value_loc;
  if (!lp->value.IsSequence()) {
    p.Error(lp->value_loc, "parallel.layer_partition", absl::StrCat("got ", Describe(lp->value)),
            "a list of layer counts, one per pipeline stage, e.g. [11, 10, 10, 10, 10, 10, 10, 7]");
    return;
  }
  std::vector<int> parts;
  bool ok = true;
  for (size_t i = 0; i < lp->value.size(); ++i) {
    const YAML::Node& e = lp->value[i];
    std::optional<int64_t> v =
        e.IsScalar() ? Parser::ParseInteger(e.Scalar()) : std::optional<int64_t>();
    if (!v.has_value() || *v < 1 || *v > 100000) {
      SourceLocation loc = LocOf(e);
      if (loc.line == 0) loc = lp->value_loc;
      p.Error(loc, absl::StrCat("parallel.layer_partition[", i, "]"),
              absl::StrCat("got ", Describe(e)), "a layer count >= 1");
      ok = false;
      continue;
    }
    parts.push_back(static_cast<int>(*v));
  }
  if (!ok) return;
  if (static_cast<int>(parts.size()) != par->pipeline) {
    p.Error(lp->value_loc, "parallel.layer_partition",
            absl::StrCat("has ", parts.size(), " entries but parallel.pipeline is ", par->pipeline),
            "one layer count per pipeline stage");
    return;
  }
  par->layer_partition = std::move(parts);
}

void ParseNccl(Parser& p, const Field* f, NcclSpec* nccl) {
  if (f == nullptr || f->value.IsNull()) return;
  MapView m = p.Map(f->value, "nccl", "nccl", f->key_loc);
  p.String(m, "library", false, &nccl->library);
  p.String(m, "source", false, &nccl->source);
  std::string version;
  if (p.String(m, "expected_version", false, &version) && !version.empty()) {
    int parts = 0;
    bool ok = true;
    for (std::string_view rest = version; ok;) {
      size_t dot = rest.find('.');
      std::string_view part = rest.substr(0, dot);
      ok = !part.empty() && part.size() <= 4 &&
           std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
      ++parts;
      if (dot == std::string_view::npos) break;
      rest = rest.substr(dot + 1);
    }
    if (!ok || parts != 3) {
      p.Error(m.Get("expected_version")->value_loc, "nccl.expected_version",
              absl::StrCat("got ", Quote(version)), "MAJOR.MINOR.PATCH, e.g. \"2.30.4\"");
    } else {
      nccl->expected_version = version;
    }
  }
  const Field* env = m.valid() ? m.Get("env") : nullptr;
  if (env == nullptr || env->value.IsNull()) return;
  if (!env->value.IsMap()) {
    p.Error(env->value_loc, "nccl.env", absl::StrCat("got ", Describe(env->value)),
            "a mapping of environment variable names to values");
    return;
  }
  for (auto it = env->value.begin(); it != env->value.end(); ++it) {
    SourceLocation loc = LocOf(it->first);
    std::string name = it->first.IsScalar() ? it->first.Scalar() : "";
    bool name_ok = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                   std::all_of(name.begin(), name.end(), [](char c) {
                     return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                   });
    if (!name_ok) {
      p.Error(loc, "nccl.env", absl::StrCat("key ", Describe(it->first), " is not a variable name"),
              "names like NCCL_IB_HCA (letters, digits, _)");
      continue;
    }
    std::string field = absl::StrCat("nccl.env.", name);
    if (nccl->env.count(name) > 0) {
      p.Error(loc, field, "is given twice", "each variable once");
      continue;
    }
    if (!it->second.IsScalar()) {
      SourceLocation vloc = LocOf(it->second);
      p.Error(vloc.line ? vloc : loc, field, absl::StrCat("got ", Describe(it->second)),
              "a string, number or boolean value");
      continue;
    }
    nccl->env[name] = it->second.Scalar();
  }
}

void ParseFabric(Parser& p, const Field* f, FabricSpec* fabric) {
  if (f == nullptr || f->value.IsNull()) return;
  MapView m = p.Map(f->value, "fabric", "fabric", f->key_loc);
  int mtu = 0;
  if (m.valid() && m.Get("mtu") != nullptr && p.Int32(m, "mtu", false, 576, 9216, &mtu) && mtu > 0) {
    fabric->mtu = mtu;
  }
  std::string subnet;
  if (p.String(m, "subnet", false, &subnet) && !subnet.empty()) {
    size_t slash = subnet.find('/');
    std::optional<uint32_t> base =
        ParseIpv4(std::string_view(subnet).substr(0, slash == std::string::npos ? subnet.size() : slash));
    std::optional<int64_t> prefix =
        slash == std::string::npos ? std::nullopt : Parser::ParseInteger(subnet.substr(slash + 1));
    if (!base.has_value() || !prefix.has_value() || *prefix < 0 || *prefix > 32) {
      p.Error(m.Get("subnet")->value_loc, "fabric.subnet", absl::StrCat("got ", Quote(subnet)),
              "an IPv4 CIDR block, e.g. 192.168.100.0/24");
    } else {
      uint32_t mask = *prefix == 0 ? 0 : ~uint32_t{0} << (32 - *prefix);
      fabric->subnet = subnet;
      fabric->subnet_base = *base & mask;
      fabric->subnet_prefix = static_cast<int>(*prefix);
    }
  }
  p.Rate(m, "link_bandwidth", "200Gb/s (a 200G NIC)", &fabric->link_bandwidth_bytes_per_s);
  p.Double(m, "hop_latency_us", 0.0, 100000.0, /*lo_open=*/false, &fabric->hop_latency_us);
}

void ParsePageCache(Parser& p, const Field* f, PageCacheSpec* pc) {
  if (f == nullptr || f->value.IsNull()) return;
  MapView m = p.Map(f->value, "page_cache", "page_cache", f->key_loc);
  std::string policy = "off";
  // YAML 1.1 readers turn a bare `off` into false; yaml-cpp keeps the scalar "off".
  p.Enum(m, "policy", {"off", "periodic", "adaptive"}, &policy);
  pc->policy = policy == "periodic"   ? PageCachePolicy::kPeriodic
               : policy == "adaptive" ? PageCachePolicy::kAdaptive
                                      : PageCachePolicy::kOff;
  std::optional<double> interval;
  if (p.Double(m, "interval_s", 0.0, 86400.0, /*lo_open=*/true, &interval) && interval) {
    pc->interval_s = *interval;
  }
  p.Size(m, "min_available_bytes", true, &pc->min_available_bytes);
}

void ParseLifecycle(Parser& p, const Field* f, LifecycleSpec* lc) {
  if (f == nullptr || f->value.IsNull()) return;
  MapView m = p.Map(f->value, "lifecycle", "lifecycle", f->key_loc);
  p.Int32(m, "restart_budget", false, 0, 1000, &lc->restart_budget);
  std::optional<double> window;
  if (p.Double(m, "restart_window_s", 0.0, 7 * 86400.0, /*lo_open=*/true, &window) && window) {
    lc->restart_window_s = *window;
  }
  std::optional<double> drain;
  if (p.Double(m, "drain_timeout_s", 0.0, 86400.0, /*lo_open=*/false, &drain) && drain) {
    lc->drain_timeout_s = *drain;
  }
}

void ParseNodes(Parser& p, const Field* f, const NodeDefaults& defaults, ClusterSpec* spec) {
  spec->nodes_location = f->value_loc;
  if (!f->value.IsSequence() || f->value.size() == 0) {
    p.Error(f->value_loc, "nodes", absl::StrCat("got ", Describe(f->value)),
            "a non-empty list of nodes, each with `name` and `agent`");
    return;
  }
  for (size_t i = 0; i < f->value.size(); ++i) {
    const YAML::Node& entry = f->value[i];
    std::string path = absl::StrCat("nodes[", i, "]");
    MapView m = p.Map(entry, path, "nodes[]", f->value_loc);
    NodeSpec node;
    node.location = m.loc();
    if (p.String(m, "name", true, &node.name) && !node.name.empty()) {
      bool ok = std::all_of(node.name.begin(), node.name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
      });
      if (!ok) {
        p.Error(m.Get("name")->value_loc, m.Path("name"), absl::StrCat("got ", Quote(node.name)),
                "letters, digits, '-', '_' or '.'");
      }
    }
    if (p.String(m, "agent", true, &node.agent) && !node.agent.empty()) {
      if (auto why = ParseAddress(node.agent, /*allow_port_zero=*/false, &node.agent_host,
                                  &node.agent_port)) {
        p.Error(m.Get("agent")->value_loc, m.Path("agent"), absl::StrCat(Quote(node.agent), " ", *why),
                "host:port of the node's glm-agent, e.g. 10.0.0.11:47101");
      }
    }
    if (p.String(m, "fabric_ip", false, &node.fabric_ip) && !node.fabric_ip.empty() &&
        !ParseIpv4(node.fabric_ip).has_value()) {
      p.Error(m.Get("fabric_ip")->value_loc, m.Path("fabric_ip"),
              absl::StrCat("got ", Quote(node.fabric_ip)), "an IPv4 address, e.g. 192.168.100.11");
    }
    // A CUDA device ordinal; the agent checks it against its host's device count at load.
    p.Int32(m, "gpu", false, 0, 1023, &node.gpu);
    NodeDefaults own;
    ParseNodeCommon(p, m, &own);
    node.hca = !own.hca.empty() ? own.hca : defaults.hca;
    node.port = static_cast<int>(own.port.value_or(defaults.port.value_or(1)));
    node.gid_index = own.gid_index.value_or(defaults.gid_index.value_or(std::optional<int>()));
    node.netdev = !own.netdev.empty() ? own.netdev : defaults.netdev;
    node.memory_budget_bytes =
        own.memory_budget_bytes.has_value() ? own.memory_budget_bytes : defaults.memory_budget_bytes;
    node.memory_bandwidth_bytes_per_s = own.memory_bandwidth_bytes_per_s.has_value()
                                            ? own.memory_bandwidth_bytes_per_s
                                            : defaults.memory_bandwidth_bytes_per_s;
    node.memory_bandwidth_efficiency = own.memory_bandwidth_efficiency.has_value()
                                           ? own.memory_bandwidth_efficiency
                                           : defaults.memory_bandwidth_efficiency;
    spec->nodes.push_back(std::move(node));
  }
}

SourceLocation FieldLoc(const YAML::Node& entry, std::string_view key, SourceLocation fallback) {
  if (entry.IsMap()) {
    for (auto it = entry.begin(); it != entry.end(); ++it) {
      if (it->first.IsScalar() && it->first.Scalar() == key) {
        SourceLocation loc = LocOf(it->second);
        return loc.line ? loc : LocOf(it->first);
      }
    }
  }
  return fallback;
}

// Checks that need the whole spec.
// `check_count`: compare the node count with `parallel` (skipped when earlier errors may have
// left `parallel` at its defaults).
void CrossCheck(Parser& p, const YAML::Node& nodes_node, bool check_count, ClusterSpec* spec) {
  if (spec->nodes.empty()) return;
  const auto& par = spec->parallel;
  int64_t want = int64_t{par.tensor} * par.pipeline * par.replicas;
  if (check_count && static_cast<int64_t>(spec->nodes.size()) != want) {
    p.Error(spec->nodes_location, "nodes",
            absl::StrCat("has ", spec->nodes.size(), " entries but parallel.tensor × pipeline × ",
                         "replicas = ", par.tensor, " × ", par.pipeline, " × ", par.replicas, " = ",
                         want),
            "one node per rank: add or remove nodes, or change `parallel`");
  }
  std::map<std::string, size_t> names, agents, fabric_ips;
  for (size_t i = 0; i < spec->nodes.size(); ++i) {
    const NodeSpec& n = spec->nodes[i];
    const YAML::Node entry = nodes_node[i];
    auto dup = [&](std::map<std::string, size_t>& seen, const std::string& value,
                   std::string_view key, std::string_view what) {
      if (value.empty()) return;
      auto [it, inserted] = seen.emplace(value, i);
      if (!inserted) {
        p.Error(FieldLoc(entry, key, n.location), absl::StrCat("nodes[", i, "].", ToAbsl(key)),
                absl::StrCat(Quote(value), " is also used by nodes[", it->second, "] (line ",
                             spec->nodes[it->second].location.line, ")"),
                absl::StrCat("a distinct ", ToAbsl(what), " per node"));
      }
    };
    dup(names, n.name, "name", "name");
    dup(agents, n.agent, "agent", "agent address");
    dup(fabric_ips, n.fabric_ip, "fabric_ip", "fabric IP");
    if (!spec->fabric.subnet.empty() && !n.fabric_ip.empty()) {
      std::optional<uint32_t> ip = ParseIpv4(n.fabric_ip);
      uint32_t mask = spec->fabric.subnet_prefix == 0
                          ? 0
                          : ~uint32_t{0} << (32 - spec->fabric.subnet_prefix);
      if (ip.has_value() && (*ip & mask) != spec->fabric.subnet_base) {
        p.Error(FieldLoc(entry, "fabric_ip", n.location), absl::StrCat("nodes[", i, "].fabric_ip"),
                absl::StrCat(Quote(n.fabric_ip), " is outside fabric.subnet ", spec->fabric.subnet),
                absl::StrCat("an address in ", FormatIpv4(spec->fabric.subnet_base), "/",
                             spec->fabric.subnet_prefix));
      }
    }
    if (spec->local && !n.agent_host.empty() && !IsLoopbackHost(n.agent_host)) {
      p.Error(FieldLoc(entry, "agent", n.location), absl::StrCat("nodes[", i, "].agent"),
              absl::StrCat(Quote(n.agent), " is not a loopback address but `local: true`"),
              "127.0.0.1:<port> (or set `local: false` for agents on other machines)");
    }
  }
}

}  // namespace

std::string_view KvCacheDtypeName(KvCacheDtype dtype) {
  return dtype == KvCacheDtype::kBf16 ? "bf16" : "fp8";
}

std::string_view EngineBackendName(EngineBackend backend) {
  switch (backend) {
    case EngineBackend::kCpu:
      return "cpu";
    case EngineBackend::kCuda:
      return "cuda";
    default:
      return "auto";
  }
}

std::string_view WeightDtypeName(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kBf16:
      return "bf16";
    case WeightDtype::kFp32:
      return "fp32";
    default:
      return "auto";
  }
}

std::string_view PageCachePolicyName(PageCachePolicy policy) {
  switch (policy) {
    case PageCachePolicy::kPeriodic:
      return "periodic";
    case PageCachePolicy::kAdaptive:
      return "adaptive";
    default:
      return "off";
  }
}

std::string ClusterSpec::Where(const SourceLocation& loc) const {
  if (loc.line <= 0) return source;
  return absl::StrCat(source, ":", loc.line, ":", loc.column);
}

std::string ClusterSpec::ResolvePath(const std::string& path) const {
  std::filesystem::path p(path);
  if (p.is_absolute() || base_dir.empty()) return p.lexically_normal().string();
  return (std::filesystem::path(base_dir) / p).lexically_normal().string();
}

namespace {

// "<number> <unit>" with surrounding blanks: the decimal number (digits, at most one inner '.')
// and the unit after it. `what` names the kind of value in the error ("a size", "a rate").
absl::Status SplitNumberAndUnit(std::string_view text, std::string_view what, std::string* number,
                                std::string_view* unit) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  *number = std::string(s.substr(0, i));
  *unit = s.substr(i);
  while (!unit->empty() && unit->front() == ' ') unit->remove_prefix(1);
  if (number->empty() || std::count(number->begin(), number->end(), '.') > 1 ||
      number->front() == '.' || number->back() == '.' || number->size() > 24) {
    return absl::InvalidArgumentError(absl::StrCat("got ", Quote(text), ", not ", std::string(what)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(std::string_view text) {
  std::string number;
  std::string_view unit;
  if (absl::Status s = SplitNumberAndUnit(text, "a size", &number, &unit); !s.ok()) return s;
  static const std::vector<std::pair<std::string_view, long double>> kUnits = {
      {"", 1},          {"B", 1},           {"KB", 1e3L},        {"MB", 1e6L},
      {"GB", 1e9L},     {"TB", 1e12L},      {"KiB", 1024.0L},    {"MiB", 1048576.0L},
      {"GiB", 1073741824.0L}, {"TiB", 1099511627776.0L}};
  long double multiplier = 0;
  for (const auto& [name, mult] : kUnits) {
    if (unit == name) multiplier = mult;
  }
  if (multiplier == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unit ", Quote(unit), " in ", Quote(text), " is not one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"));
  }
  long double value = std::strtold(number.c_str(), nullptr) * multiplier;
  if (!(value < 9.2e18L)) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(text), " is too large"));
  }
  if (number.find('.') != std::string::npos && unit.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(text), " is a fraction of a byte"));
  }
  return static_cast<int64_t>(value);
}

absl::StatusOr<double> ParseRate(std::string_view text) {
  std::string number;
  std::string_view unit;
  if (absl::Status s = SplitNumberAndUnit(text, "a rate", &number, &unit); !s.ok()) return s;
  // Bytes per second (B) and bits per second (b / bit), decimal prefixes; binary ones for bytes.
  static const std::vector<std::pair<std::string_view, double>> kUnits = {
      {"B/s", 1},         {"KB/s", 1e3},      {"MB/s", 1e6},      {"GB/s", 1e9},
      {"TB/s", 1e12},     {"KiB/s", 1024.0},  {"MiB/s", 1048576.0},
      {"GiB/s", 1073741824.0},                {"TiB/s", 1099511627776.0},
      {"Kb/s", 1e3 / 8},  {"Mb/s", 1e6 / 8},  {"Gb/s", 1e9 / 8},  {"Tb/s", 1e12 / 8},
      {"Kbit/s", 1e3 / 8}, {"Mbit/s", 1e6 / 8}, {"Gbit/s", 1e9 / 8}, {"Tbit/s", 1e12 / 8}};
  double multiplier = 0;
  for (const auto& [name, mult] : kUnits) {
    if (unit == name) multiplier = mult;
  }
  if (multiplier == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unit ", Quote(unit), " in ", Quote(text),
        " is not a rate unit: bytes per second B/s, KB/s, MB/s, GB/s, TB/s, KiB/s..TiB/s or bits "
        "per second Kb/s, Mb/s, Gb/s, Tb/s"));
  }
  return std::strtod(number.c_str(), nullptr) * multiplier;
}

absl::StatusOr<ClusterSpec> ParseClusterSpec(std::string_view text, std::string_view source_name,
                                             std::optional<std::string> base_dir) {
  ClusterSpec spec;
  spec.source = std::string(source_name);
  spec.base_dir = base_dir.has_value()
                      ? *base_dir
                      : std::filesystem::path(std::string(source_name)).parent_path().string();
  if (text.size() > kMaxInputBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        ToAbsl(source_name), ": file is ", text.size(), " bytes; expected a cluster.yaml under 1 MiB"));
  }
  if (FlowDepth(text) > kMaxFlowDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        ToAbsl(source_name), ": brackets nest deeper than ", kMaxFlowDepth,
        " levels; expected a cluster.yaml (see configs/ for examples)"));
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        ToAbsl(source_name), ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ",
        e.msg, "; expected valid YAML (check indentation, quoting and brackets)"));
  }

  Parser p(spec.source);
  try {
    if (root.IsNull()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ToAbsl(source_name), ": the file is empty; expected a mapping with `name`, ",
                       "`model` and `nodes` (see configs/ for examples)"));
    }
    MapView top = p.Map(root, "", "", SourceLocation{1, 1});
    if (top.valid()) {
      p.String(top, "name", true, &spec.name);
      p.Bool(top, "local", &spec.local);
      ParseController(p, top.Get("controller"), &spec.controller);
      const Field* model = top.Get("model");
      if (model == nullptr || model->value.IsNull()) {
        p.Error(model ? model->key_loc : top.loc(), "model", model ? "is empty" : "is missing",
                "a mapping with at least `path` and `max_model_len`");
      } else {
        ParseModel(p, model, &spec.model);
      }
      ParseParallel(p, top.Get("parallel"), &spec.parallel);
      ParseNccl(p, top.Get("nccl"), &spec.nccl);
      ParseFabric(p, top.Get("fabric"), &spec.fabric);
      ParsePageCache(p, top.Get("page_cache"), &spec.page_cache);
      ParseLifecycle(p, top.Get("lifecycle"), &spec.lifecycle);
      NodeDefaults defaults;
      if (const Field* d = top.Get("node_defaults"); d != nullptr && !d->value.IsNull()) {
        MapView dm = p.Map(d->value, "node_defaults", "node_defaults", d->key_loc);
        ParseNodeCommon(p, dm, &defaults);
      }
      const Field* nodes = top.Get("nodes");
      if (nodes == nullptr || nodes->value.IsNull()) {
        p.Error(nodes ? nodes->key_loc : top.loc(), "nodes", nodes ? "is empty" : "is missing",
                "a list of nodes, each with `name` and `agent`");
      } else {
        ParseNodes(p, nodes, defaults, &spec);
        CrossCheck(p, nodes->value, /*check_count=*/!p.has_errors(), &spec);
      }
    }
  } catch (const YAML::Exception& e) {
    p.Error(SourceLocation{e.mark.line + 1, e.mark.column + 1}, "(document)", e.msg,
            "a cluster.yaml as in configs/");
  }
  if (p.has_errors()) {
    return absl::InvalidArgumentError(absl::StrJoin(p.SortedErrors(), "\n"));
  }
  return spec;
}

absl::StatusOr<ClusterSpec> LoadClusterSpec(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open; expected a readable cluster.yaml (see configs/)"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  return ParseClusterSpec(buffer.str(), path, dir);
}

}  // namespace glm::cluster
