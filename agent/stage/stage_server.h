// Serving staged files to peers over gRPC (glm.v1.Agent.FetchFile): a node serves the complete
// files under its stage root and its NCCL library, so transfers fan out peer to peer instead of
// all pulling from the source. Only final (verified, renamed) files are visible; *.partial files,
// paths with "..", absolute paths and symlinks leading out of the root are refused. The bytes
// travel in the agent's own gRPC server, with its credentials: under mTLS only a client holding a
// certificate of the cluster CA can read them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "glm/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace glm::stage {

// A path a peer may ask for: relative, no "..", no empty or "." parts, not a .partial file.
bool IsServablePath(const std::string& path);

inline constexpr uint32_t kFileChunkBytes = 1 << 20;

// The FetchFile handler. Thread-safe; the callbacks are called on gRPC threads.
class FileServer {
 public:
  struct Options {
    // The directory served; "" = none yet (NOT_FOUND naming the fix).
    std::function<std::string()> root;
    // The NCCL library served for nccl_library requests; "" = none configured.
    std::function<std::string()> nccl_library;
    uint32_t chunk_bytes = kFileChunkBytes;
  };
  explicit FileServer(Options options) : options_(std::move(options)) {}

  grpc::Status FetchFile(grpc::ServerContext* ctx, const glm::v1::FetchFileRequest* req,
                         grpc::ServerWriter<glm::v1::FileChunk>* writer);
  uint64_t bytes_served() const { return bytes_served_.load(); }

 private:
  Options options_;
  std::atomic<uint64_t> bytes_served_{0};
};

// A gRPC server answering only FetchFile (glm.v1.Agent's other RPCs are UNIMPLEMENTED): the
// stager's tests and glm-stage-serve. The agent serves FetchFile from its own service instead.
// Stop() (or the destructor) cancels every transfer in flight, as a crash would.
class StageServer {
 public:
  struct Options {
    std::string root;                       // directory served
    std::string nccl_library;               // optional
    std::string bind_address = "127.0.0.1";
    uint16_t port = 0;                      // 0 = any free port
    std::shared_ptr<grpc::ServerCredentials> credentials;  // null = insecure
  };

  static absl::StatusOr<std::unique_ptr<StageServer>> Start(Options options);
  ~StageServer();

  uint16_t port() const { return port_; }
  void Stop();
  uint64_t bytes_served() const { return files_.bytes_served(); }

 private:
  class Service;
  explicit StageServer(Options options);

  Options options_;
  FileServer files_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  uint16_t port_ = 0;
};

}  // namespace glm::stage
