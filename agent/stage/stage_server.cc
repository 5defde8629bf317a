#include "agent/stage/stage_server.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace glm::stage {
namespace {

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) != nullptr ? std::string(buf) : std::string();
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

bool IsServablePath(const std::string& path) {
  if (path.empty() || path[0] == '/' || absl::StrContains(path, "\\") ||
      absl::StrContains(path, std::string(1, '\0')) || absl::EndsWith(path, ".partial")) {
    return false;
  }
  for (const auto& part : std::filesystem::path(path)) {
    if (part.empty() || part == ".." || part == ".") return false;
  }
  return true;
}

grpc::Status FileServer::FetchFile(grpc::ServerContext* ctx, const glm::v1::FetchFileRequest* req,
                                   grpc::ServerWriter<glm::v1::FileChunk>* writer) {
  std::string target;
  if (req->nccl_library()) {
    target = options_.nccl_library ? options_.nccl_library() : std::string();
    if (target.empty()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "this agent has no NCCL library configured (nccl.library)");
    }
    // The operator's path (often a symlink libnccl.so.2 -> libnccl.so.2.x.y): follow it.
    target = RealPath(target);
    if (target.empty()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no NCCL library here");
  } else {
    if (!IsServablePath(req->path())) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("'", req->path(), "' may not be served: paths are relative "
                                       "to the stage root, without '..', not *.partial"));
    }
    std::string root = options_.root ? options_.root() : std::string();
    std::string real_root = root.empty() ? std::string() : RealPath(root);
    if (real_root.empty()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "this agent serves no stage root (start it with --stage-root or "
                          "--model-dir, or stage weights onto it first)");
    }
    target = RealPath(absl::StrCat(real_root, "/", req->path()));
    if (target.empty()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "not held here");
    if (!absl::StartsWith(target, real_root + "/") || absl::EndsWith(target, ".partial")) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("'", req->path(), "' leads out of the stage root"));
    }
  }
  Fd file{open(target.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)};
  struct stat st;
  if (file.fd < 0 || fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "not held here");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (req->offset() < 0 || static_cast<uint64_t>(req->offset()) > size || req->length() < 0) {
    return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                        absl::StrCat("offset ", req->offset(), " is past the end (", size, " bytes)"));
  }
  const uint64_t begin = static_cast<uint64_t>(req->offset());
  uint64_t end = size;
  if (req->length() > 0) end = std::min<uint64_t>(size, begin + static_cast<uint64_t>(req->length()));
  posix_fadvise(file.fd, static_cast<off_t>(begin), static_cast<off_t>(end - begin),
                POSIX_FADV_SEQUENTIAL);
  uint64_t at = begin;
  glm::v1::FileChunk chunk;
  chunk.set_file_size(static_cast<int64_t>(size));
  do {
    if (ctx->IsCancelled()) break;
    size_t want = static_cast<size_t>(std::min<uint64_t>(end - at, options_.chunk_bytes));
    std::string* data = chunk.mutable_data();
    data->resize(want);
    size_t got = 0;
    while (got < want) {
      ssize_t n = pread(file.fd, data->data() + got, want - got, static_cast<off_t>(at + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return grpc::Status(grpc::StatusCode::DATA_LOSS,
                            absl::StrCat("read at byte ", at + got, ": ",
                                         n == 0 ? "file shrank" : std::strerror(errno)));
      }
      got += static_cast<size_t>(n);
    }
    chunk.set_offset(static_cast<int64_t>(at));
    if (!writer->Write(chunk)) break;  // the client went away
    // The bytes read for serving are not this node's working set.
    posix_fadvise(file.fd, static_cast<off_t>(at), static_cast<off_t>(want), POSIX_FADV_DONTNEED);
    at += want;
    bytes_served_ += want;
  } while (at < end);
  return grpc::Status::OK;
}

class StageServer::Service final : public glm::v1::Agent::Service {
 public:
  explicit Service(FileServer* files) : files_(files) {}
  grpc::Status FetchFile(grpc::ServerContext* ctx, const glm::v1::FetchFileRequest* req,
                         grpc::ServerWriter<glm::v1::FileChunk>* writer) override {
    return files_->FetchFile(ctx, req, writer);
  }

 private:
  FileServer* files_;
};

StageServer::StageServer(Options options)
    : options_(std::move(options)),
      files_(FileServer::Options{[this] { return options_.root; },
                                 [this] { return options_.nccl_library; }}),
      service_(std::make_unique<Service>(&files_)) {}

absl::StatusOr<std::unique_ptr<StageServer>> StageServer::Start(Options options) {
  std::unique_ptr<StageServer> s(new StageServer(std::move(options)));
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second process on the same port would bind too and
  // share the connections at random. Refuse instead, so "address in use" is reported.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  auto creds = s->options_.credentials ? s->options_.credentials : grpc::InsecureServerCredentials();
  builder.AddListeningPort(absl::StrCat(s->options_.bind_address, ":", s->options_.port), creds,
                           &port);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", s->options_.bind_address, ":",
                                               s->options_.port));
  }
  s->port_ = static_cast<uint16_t>(port);
  return s;
}

StageServer::~StageServer() { Stop(); }

void StageServer::Stop() {
  if (!server_) return;
  server_->Shutdown(std::chrono::system_clock::now());  // cancels transfers in flight
  server_->Wait();
  server_.reset();
}

}  // namespace glm::stage
