#include "agent/stage/weight_stager.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/manifest/file_hash.h"
#include "common/logging.h"
#include "glm/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace glm::stage {
namespace {

namespace fs = std::filesystem;

class ProgressTracker {
 public:
  ProgressTracker(const StageOptions& o, uint64_t total)
      : o_(o), clock_(o.clock ? o.clock : Clock::Real()), start_(clock_->Now()) {
    p_.bytes_total = total;
  }
  void AddDone(uint64_t n) { p_.bytes_done += n; }
  // After a chunk: reported at most once per progress_interval.
  void AddFetched(const std::string& file, uint64_t n) {
    p_.file = file;
    p_.bytes_done += n;
    p_.bytes_fetched += n;
    if (o_.progress_interval.count() > 0 && emitted_ &&
        clock_->Now() - last_emit_ < o_.progress_interval) {
      return;
    }
    Emit();
  }
  // Always reported (a completed file, the final state).
  void Emit() {
    last_emit_ = clock_->Now();
    emitted_ = true;
    double seconds = std::chrono::duration<double>(last_emit_ - start_).count();
    if (seconds > 0 && p_.bytes_fetched > 0) {
      p_.rate_bytes_per_s = static_cast<double>(p_.bytes_fetched) / seconds;
      p_.eta_s = static_cast<double>(p_.bytes_total - std::min(p_.bytes_total, p_.bytes_done)) /
                 p_.rate_bytes_per_s;
    }
    if (o_.on_progress) o_.on_progress(p_);
  }
  // A discarded copy: its bytes are no longer done.
  void Undo(uint64_t n) { p_.bytes_done -= std::min(p_.bytes_done, n); }

 private:
  const StageOptions& o_;
  Clock* clock_;
  Clock::TimePoint start_;
  Clock::TimePoint last_emit_;
  bool emitted_ = false;
  StageProgress p_;
};

// One channel per peer for a staging run (a TLS handshake per peer, not per file).
class PeerChannels {
 public:
  explicit PeerChannels(const StageOptions& o) : o_(o) {}
  std::shared_ptr<grpc::Channel> Get(const PeerAddress& peer) {
    std::string target = absl::StrCat(peer.host, ":", peer.port);
    auto it = channels_.find(target);
    if (it != channels_.end()) return it->second;
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(16 << 20);
    // A silent peer (partition, power loss) is detected by keepalive pings; a killed one by RST.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, std::max(o_.io_timeout_ms, 1000));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, std::max(o_.io_timeout_ms, 1000));
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a peer restart gets a fresh connection
    if (!peer.tls_name.empty()) args.SetSslTargetNameOverride(peer.tls_name);
    auto creds = o_.credentials ? o_.credentials : grpc::InsecureChannelCredentials();
    auto channel = grpc::CreateCustomChannel(target, creds, args);
    channels_[target] = channel;
    return channel;
  }

 private:
  const StageOptions& o_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
};

uint64_t FileSizeOr0(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Fetches [offset, size) of `file` from `peer` (FetchFile), writing to the open `out` fd at
// `*offset`. Advances *offset per chunk written, so a broken transfer keeps what arrived.
absl::Status FetchFrom(const StageOptions& o, PeerChannels* channels, const PeerAddress& peer,
                       const cluster::ManifestFile& file, int out, uint64_t* offset,
                       ProgressTracker* progress) {
  std::shared_ptr<grpc::Channel> channel = channels->Get(peer);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::milliseconds(o.io_timeout_ms))) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", peer.host, ":", peer.port,
                                               " within ", o.io_timeout_ms, " ms"));
  }
  auto stub = glm::v1::Agent::NewStub(channel);
  grpc::ClientContext ctx;
  glm::v1::FetchFileRequest req;
  req.set_path(file.path);
  req.set_nccl_library(o.peers_nccl_library);
  req.set_offset(static_cast<int64_t>(*offset));
  std::unique_ptr<grpc::ClientReader<glm::v1::FileChunk>> reader = stub->FetchFile(&ctx, req);
  glm::v1::FileChunk chunk;
  uint64_t chunk_start = *offset;
  absl::Status failure;
  while (reader->Read(&chunk)) {
    if (static_cast<uint64_t>(chunk.file_size()) != file.size) {
      failure = absl::DataLossError(absl::StrCat("holds a ", chunk.file_size(),
                                                 "-byte copy, manifest says ", file.size));
      break;
    }
    const std::string& data = chunk.data();
    if (static_cast<uint64_t>(chunk.offset()) != *offset || *offset + data.size() > file.size) {
      failure = absl::DataLossError(absl::StrCat("sent bytes at ", chunk.offset(), " (+",
                                                 data.size(), ") while ", *offset, " was expected"));
      break;
    }
    ssize_t n = pwrite(out, data.data(), data.size(), static_cast<off_t>(*offset));
    if (n != static_cast<ssize_t>(data.size())) {
      ctx.TryCancel();
      reader->Finish();
      return absl::InternalError(absl::StrCat("write: ", std::strerror(errno)));
    }
    *offset += data.size();
    if (*offset - chunk_start >= o.chunk_bytes || *offset == file.size) {
      // Write the range back and drop it from the page cache: staging must not fill memory.
      sync_file_range(out, static_cast<off_t>(chunk_start), static_cast<off_t>(*offset - chunk_start),
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      posix_fadvise(out, static_cast<off_t>(chunk_start), static_cast<off_t>(*offset - chunk_start),
                    POSIX_FADV_DONTNEED);
      progress->AddFetched(file.path, *offset - chunk_start);
      chunk_start = *offset;
    }
  }
  if (!failure.ok()) ctx.TryCancel();
  grpc::Status status = reader->Finish();
  if (*offset > chunk_start) {  // a tail shorter than chunk_bytes that arrived before a break
    posix_fadvise(out, static_cast<off_t>(chunk_start), static_cast<off_t>(*offset - chunk_start),
                  POSIX_FADV_DONTNEED);
    progress->AddFetched(file.path, *offset - chunk_start);
  }
  if (!failure.ok()) return failure;
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
      break;
    case grpc::StatusCode::NOT_FOUND:
      return absl::NotFoundError("does not have the file");
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::UNIMPLEMENTED:
      return absl::FailedPreconditionError(
          absl::StrCat("refused the request: ", status.error_message()));
    default:
      return absl::UnavailableError(absl::StrCat("transfer broke off at byte ", *offset, ": ",
                                                 status.error_message()));
  }
  if (*offset != file.size) {
    return absl::UnavailableError(absl::StrCat("transfer ended at byte ", *offset, " of ",
                                               file.size));
  }
  return absl::OkStatus();
}

absl::Status StageOne(const StageOptions& o, const cluster::ManifestFile& file, size_t file_index,
                      StageReport* report, ProgressTracker* progress, PeerChannels* channels) {
  const std::string final_path = absl::StrCat(o.dest_dir, "/", file.path);
  const std::string partial_path = final_path + ".partial";
  std::error_code ec;
  fs::create_directories(fs::path(final_path).parent_path(), ec);

  // 1. A copy in place: keep it when it verifies; a shorter one may be a prefix to resume.
  if (fs::exists(final_path, ec)) {
    uint64_t size = FileSizeOr0(final_path);
    if (size == file.size) {
      absl::StatusOr<cluster::FileHash> h = cluster::HashFile(final_path);
      if (h.ok() && h->xxh3_128 == file.xxh3_128) {
        report->already_present.push_back(file.path);
        progress->AddDone(file.size);
        return absl::OkStatus();
      }
      GLM_LOG_WARN("stage: {} fails verification (xxh3_128 {} != {}); refetching", final_path,
                   h.ok() ? h->xxh3_128 : "unreadable", file.xxh3_128);
      report->discarded.push_back(file.path);
      fs::remove(final_path, ec);
    } else if (size < file.size && !fs::exists(partial_path, ec)) {
      fs::rename(final_path, partial_path, ec);  // truncated: resume after its bytes
    } else {
      report->discarded.push_back(file.path);
      fs::remove(final_path, ec);
    }
  }

  int out = open(partial_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (out < 0) {
    return absl::InternalError(absl::StrCat("open ", partial_path, ": ", std::strerror(errno)));
  }
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) close(fd);
    }
  } closer{out};
  uint64_t offset = FileSizeOr0(partial_path);
  if (offset > file.size) {
    offset = 0;
    if (ftruncate(out, 0) != 0) return absl::InternalError(absl::StrCat("truncate ", partial_path));
  }
  bool resumed_prefix = offset > 0;
  if (offset > 0) {
    report->bytes_resumed += offset;
    progress->AddDone(offset);
  }

  std::vector<std::string> errors;
  if (o.peers.empty()) errors.push_back("no peers configured");
  const size_t n = o.peers.size();
  for (size_t attempt = 0; n > 0 && attempt < n * static_cast<size_t>(o.rounds); ++attempt) {
    // Start at a different peer per file so a fan-out spreads over the holders.
    const PeerAddress& peer = o.peers[(file_index + attempt) % n];
    if (offset < file.size) {
      uint64_t before = offset;
      absl::Status s = FetchFrom(o, channels, peer, file, out, &offset, progress);
      report->bytes_fetched += offset - before;
      if (!s.ok()) {
        if (!absl::IsNotFound(s)) ++report->peer_failures;
        errors.push_back(absl::StrCat(peer.name, ": ", s.message()));
        continue;
      }
    }
    if (fdatasync(out) != 0) return absl::InternalError(absl::StrCat("fdatasync ", partial_path));
    absl::StatusOr<cluster::FileHash> h = cluster::HashFile(partial_path);
    if (h.ok() && h->size == file.size && h->xxh3_128 == file.xxh3_128) {
      posix_fadvise(out, 0, 0, POSIX_FADV_DONTNEED);
      fs::rename(partial_path, final_path, ec);
      if (ec) return absl::InternalError(absl::StrCat("rename ", partial_path, ": ", ec.message()));
      int dir = open(fs::path(final_path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dir >= 0) {
        fsync(dir);
        close(dir);
      }
      report->fetched.push_back(file.path);
      progress->Emit();
      return absl::OkStatus();
    }
    // Bad bytes (a corrupt copy at the peer, or a bad resumed prefix): start over elsewhere.
    ++report->peer_failures;
    errors.push_back(absl::StrCat(peer.name, ": data failed verification (xxh3_128 ",
                                  h.ok() ? h->xxh3_128 : "unreadable", " != ", file.xxh3_128,
                                  resumed_prefix ? "; the local partial prefix may be the bad part" : "",
                                  ")"));
    resumed_prefix = false;
    progress->Undo(offset);
    offset = 0;
    if (ftruncate(out, 0) != 0) return absl::InternalError(absl::StrCat("truncate ", partial_path));
  }
  return absl::UnavailableError(absl::StrCat(
      "could not stage ", file.path, " (", file.size, " bytes) into ", o.dest_dir, ": ",
      absl::StrJoin(errors, "; "), "; fix: check that the peers run and hold a verified copy "
      "(re-run staging resumes from ", partial_path, ")"));
}

}  // namespace

absl::StatusOr<StageReport> StageFiles(const StageOptions& o) {
  std::vector<const cluster::ManifestFile*> plan;
  for (const std::string& path : o.files) {
    const cluster::ManifestFile* f = o.manifest.Find(path);
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("plan file '", path, "' is not in the manifest"));
    }
    plan.push_back(f);
  }
  std::error_code ec;
  fs::create_directories(o.dest_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", o.dest_dir, ": ", ec.message()));

  StageReport report;
  ProgressTracker progress(o, o.manifest.TotalBytes(o.files));
  PeerChannels channels(o);
  for (size_t i = 0; i < plan.size(); ++i) {
    if (absl::Status s = StageOne(o, *plan[i], i, &report, &progress, &channels); !s.ok()) return s;
  }
  if (o.prune) {
    std::set<std::string> keep(o.files.begin(), o.files.end());
    for (const cluster::ManifestFile& f : o.manifest.files) {
      if (keep.count(f.path) != 0) continue;
      std::string path = absl::StrCat(o.dest_dir, "/", f.path);
      if (fs::remove(path, ec)) report.removed.push_back(f.path);
      fs::remove(path + ".partial", ec);
    }
  }
  return report;
}

std::function<absl::Status(const std::string& out_path)> FetchFromPeers(
    std::vector<PeerAddress> peers, cluster::ManifestFile remote,
    std::shared_ptr<grpc::ChannelCredentials> credentials,
    std::function<void(const StageProgress&)> on_progress, Clock* clock,
    Clock::Duration progress_interval) {
  return [=](const std::string& out_path) {
    StageOptions o;
    o.dest_dir = out_path + ".d";
    cluster::ManifestFile file = remote;
    o.peers_nccl_library = file.path.empty();
    if (o.peers_nccl_library) file.path = fs::path(out_path).filename().string();
    o.manifest.files = {file};
    o.files = {file.path};
    o.peers = peers;
    o.prune = false;
    o.credentials = credentials;
    o.on_progress = on_progress;
    o.clock = clock;
    o.progress_interval = progress_interval;
    absl::StatusOr<StageReport> r = StageFiles(o);
    if (!r.ok()) return r.status();
    std::error_code ec;
    fs::rename(absl::StrCat(o.dest_dir, "/", file.path), out_path, ec);
    fs::remove_all(o.dest_dir);
    if (ec) return absl::InternalError(absl::StrCat("rename to ", out_path, ": ", ec.message()));
    return absl::OkStatus();
  };
}

}  // namespace glm::stage
