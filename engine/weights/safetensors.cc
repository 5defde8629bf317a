#include "engine/weights/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

using nlohmann::json;

constexpr std::string_view kCorruptFix =
    "the file is corrupt or truncated: re-download/restage it";

// Cuts `text` to about 80 bytes without splitting a UTF-8 sequence.
std::string Shorten(std::string text) {
  if (text.size() <= 80) return text;
  size_t cut = 77;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "...";
}

// A JSON value as short text for messages. Not recursive: headers come from outside and may be
// nested millions deep.
std::string Excerpt(const json& value) {
  auto scalar = [](const json& item) -> std::string {
    if (item.is_object()) return item.empty() ? "{}" : "{...}";
    if (item.is_array()) return item.empty() ? "[]" : "[...]";
    return Shorten(item.dump(-1, ' ', false, json::error_handler_t::replace));
  };
  if (!value.is_array()) return scalar(value);
  std::string text = "[";
  size_t shown = 0;
  for (const json& item : value) {
    if (shown == 8) {
      text += ", ...";
      break;
    }
    if (shown++ > 0) text += ", ";
    text += scalar(item);
  }
  return Shorten(text + "]");
}

absl::Status Corrupt(std::string_view file, std::string_view problem) {
  return absl::DataLossError(absl::StrCat(ToAbsl(file), ": ", ToAbsl(problem), "; ",
                                          ToAbsl(kCorruptFix)));
}

absl::Status CorruptTensor(std::string_view file, std::string_view tensor,
                           std::string_view problem) {
  return absl::DataLossError(absl::StrCat(ToAbsl(file), ": tensor '",
                                          Shorten(std::string(tensor)), "': ",
                                          ToAbsl(problem), "; ", ToAbsl(kCorruptFix)));
}

absl::StatusOr<SafetensorsEntry> ParseEntry(std::string_view file, const std::string& name,
                                            const json& value, uint64_t data_size) {
  if (name.empty()) return CorruptTensor(file, name, "tensor name is empty");
  if (!value.is_object()) {
    return CorruptTensor(file, name,
                         absl::StrCat("entry must be an object with dtype, shape and "
                                      "data_offsets, got ", Excerpt(value)));
  }
  SafetensorsEntry entry;
  entry.name = name;

  auto dtype_it = value.find("dtype");
  if (dtype_it == value.end()) return CorruptTensor(file, name, "entry has no \"dtype\"");
  if (!dtype_it->is_string()) {
    return CorruptTensor(file, name, absl::StrCat("\"dtype\" must be a string, got ",
                                                  Excerpt(*dtype_it)));
  }
  const auto& dtype_name = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = ParseDType(dtype_name);
  if (!dtype) {
    return absl::UnimplementedError(absl::StrCat(
        ToAbsl(file), ": tensor '", Shorten(name), "': dtype \"", dtype_name.substr(0, 40),
        "\" is not supported (supported: ", ToAbsl(SupportedDTypeList()),
        "); convert the checkpoint to one of these (e.g. BF16 or FP8 E4M3 with block scales)"));
  }
  entry.dtype = *dtype;

  auto shape_it = value.find("shape");
  if (shape_it == value.end()) return CorruptTensor(file, name, "entry has no \"shape\"");
  if (!shape_it->is_array()) {
    return CorruptTensor(file, name, absl::StrCat("\"shape\" must be an array of non-negative "
                                                  "integers, got ", Excerpt(*shape_it)));
  }
  uint64_t num_elements = 1;
  for (const json& dim : *shape_it) {
    if (!dim.is_number_unsigned() ||
        dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return CorruptTensor(file, name, absl::StrCat("\"shape\" must be an array of non-negative "
                                                    "64-bit integers, got ", Excerpt(*shape_it)));
    }
    const uint64_t extent = dim.get<uint64_t>();
    if (__builtin_mul_overflow(num_elements, extent, &num_elements) ||
        num_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return CorruptTensor(file, name, absl::StrCat("shape ", Excerpt(*shape_it),
                                                    " has more elements than fit in 64 bits"));
    }
    entry.shape.push_back(static_cast<int64_t>(extent));
  }
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(num_elements, static_cast<uint64_t>(DTypeSize(entry.dtype)),
                             &expected_bytes)) {
    return CorruptTensor(file, name, absl::StrCat("shape ", Excerpt(*shape_it), " of ",
                                                  ToAbsl(DTypeName(entry.dtype)),
                                                  " needs more bytes than fit in 64 bits"));
  }

  auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end()) return CorruptTensor(file, name, "entry has no \"data_offsets\"");
  if (!offsets_it->is_array() || offsets_it->size() != 2 || !(*offsets_it)[0].is_number_unsigned() ||
      !(*offsets_it)[1].is_number_unsigned()) {
    return CorruptTensor(file, name, absl::StrCat("\"data_offsets\" must be [begin, end] with "
                                                  "non-negative integers, got ",
                                                  Excerpt(*offsets_it)));
  }
  entry.begin = (*offsets_it)[0].get<uint64_t>();
  entry.end = (*offsets_it)[1].get<uint64_t>();
  if (entry.begin > entry.end) {
    return CorruptTensor(file, name, absl::StrCat("data_offsets [", entry.begin, ", ", entry.end,
                                                  "] has begin > end"));
  }
  if (entry.end > data_size) {
    return CorruptTensor(file, name, absl::StrCat("data_offsets [", entry.begin, ", ", entry.end,
                                                  "] run past the end of the data section (",
                                                  data_size, " bytes)"));
  }
  if (entry.end - entry.begin != expected_bytes) {
    return CorruptTensor(file, name,
                         absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "] hold ",
                                      entry.end - entry.begin, " bytes but ",
                                      ToAbsl(DTypeName(entry.dtype)), " shape ",
                                      Excerpt(*shape_it), " needs ", expected_bytes,
                                      " bytes (size mismatch)"));
  }
  return entry;
}

absl::StatusOr<std::map<std::string, std::string>> ParseMetadata(std::string_view file,
                                                                 const json& value) {
  if (!value.is_object()) {
    return Corrupt(file, absl::StrCat("\"__metadata__\" must be an object of strings, got ",
                                      Excerpt(value)));
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return Corrupt(file, absl::StrCat("\"__metadata__\" value for \"", key,
                                        "\" must be a string, got ", Excerpt(item)));
    }
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> file,
                                                         std::string_view file_label) {
  if (file.size() < 8) {
    return Corrupt(file_label, absl::StrCat("file is ", file.size(),
                                            " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) {
    header_size = (header_size << 8) | static_cast<uint64_t>(file[static_cast<size_t>(i)]);
  }
  if (header_size > kMaxSafetensorsHeaderBytes) {
    return Corrupt(file_label, absl::StrCat("header length ", header_size,
                                            " bytes exceeds the ", kMaxSafetensorsHeaderBytes,
                                            "-byte limit (not a safetensors file?)"));
  }
  if (header_size > file.size() - 8) {
    return Corrupt(file_label, absl::StrCat("header length ", header_size,
                                            " bytes runs past the end of the file (",
                                            file.size(), " bytes)"));
  }
  SafetensorsHeader header;
  header.header_size = header_size;
  header.data_offset = 8 + header_size;
  header.data_size = file.size() - header.data_offset;

  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  // Records duplicate top-level names (nlohmann keeps only the last one silently).
  std::set<std::string, std::less<>> seen;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(text, text + header_size, on_event);
  } catch (const json::exception& e) {
    return Corrupt(file_label, absl::StrCat("header is not valid JSON (", e.what(), ")"));
  }
  if (!root.is_object()) {
    return Corrupt(file_label, absl::StrCat("header must be a JSON object, got ",
                                            Excerpt(root)));
  }
  if (!duplicate.empty()) {
    return CorruptTensor(file_label, duplicate, "name appears twice in the header");
  }

  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      GLM_ASSIGN_OR_RETURN(header.metadata, ParseMetadata(file_label, value));
      continue;
    }
    GLM_ASSIGN_OR_RETURN(SafetensorsEntry entry,
                         ParseEntry(file_label, name, value, header.data_size));
    header.tensors.push_back(std::move(entry));
  }

  // Overlap check: sort by byte range; an empty range overlaps nothing.
  std::vector<const SafetensorsEntry*> by_offset;
  by_offset.reserve(header.tensors.size());
  for (const auto& entry : header.tensors) {
    if (entry.begin != entry.end) by_offset.push_back(&entry);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsEntry& prev = *by_offset[i - 1];
    const SafetensorsEntry& cur = *by_offset[i];
    if (cur.begin < prev.end) {
      return Corrupt(file_label,
                     absl::StrCat("tensors '", Shorten(prev.name), "' [", prev.begin, ", ",
                                  prev.end, ") and '", Shorten(cur.name), "' [", cur.begin, ", ", cur.end,
                                  ") overlap in the data section"));
    }
  }
  // nlohmann's object is a std::map, so entries already come sorted by name.
  return header;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string reason = std::strerror(err);
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file; stage the checkpoint "
                                                    "completely (or fix --model)"));
    }
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open (", reason,
                                                    "); check permissions"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": fstat failed (", reason, ")"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  if (size < 8) {
    ::close(fd);
    return Corrupt(path, absl::StrCat("file is ", size,
                                      " bytes, too short for the 8-byte header length"));
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (mapping == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": mmap of ", size, " bytes failed (",
                                                     std::strerror(map_errno),
                                                     "); check vm.max_map_count and ulimit -v"));
  }
  file->mapping_ = mapping;
  file->file_ = std::span<const std::byte>(static_cast<const std::byte*>(mapping), size);
  GLM_ASSIGN_OR_RETURN(file->header_, ParseSafetensorsHeader(file->file_, path));
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBuffer(
    std::span<const std::byte> bytes, std::string label) {
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = std::move(label);
  file->file_ = bytes;
  GLM_ASSIGN_OR_RETURN(file->header_, ParseSafetensorsHeader(file->file_, file->path_));
  return file;
}

void SafetensorsFile::ReleaseMappedRange(uint64_t offset, uint64_t length) const {
  if (mapping_ == nullptr || length == 0 || offset >= file_.size()) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t end = std::min<uint64_t>(offset + length, file_.size());
  const uint64_t begin = offset / page * page;
  const uint64_t span = (end - begin + page - 1) / page * page;
  // Advisory: a failure only means the pages stay mapped (and cached) a while longer.
  ::madvise(static_cast<char*>(mapping_) + begin, span, MADV_DONTNEED);
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, file_.size());
}

const SafetensorsEntry* SafetensorsFile::Find(std::string_view name) const {
  auto it = std::lower_bound(
      header_.tensors.begin(), header_.tensors.end(), name,
      [](const SafetensorsEntry& entry, std::string_view key) { return entry.name < key; });
  if (it == header_.tensors.end() || it->name != name) return nullptr;
  return &*it;
}

TensorView SafetensorsFile::View(const SafetensorsEntry& entry) const {
  TensorView view;
  view.name = entry.name;
  view.dtype = entry.dtype;
  view.shape = entry.shape;
  view.data = file_.data() + header_.data_offset + entry.begin;
  view.nbytes = static_cast<size_t>(entry.end - entry.begin);
  return view;
}

absl::StatusOr<TensorView> SafetensorsFile::Get(std::string_view name) const {
  const SafetensorsEntry* entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", ToAbsl(name), "'"));
  }
  return View(*entry);
}

}  // namespace glm::engine
