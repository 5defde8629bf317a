// glm-stage-serve: serves a directory's files to peers over gRPC (glm.v1.Agent.FetchFile only)
// until SIGTERM or SIGINT; the stager's tests run it as a peer they can kill. Prints "port N" on
// stdout once listening (port 0 picks a free one).
// Usage: glm-stage-serve --root DIR [--bind ADDR] [--port N] [--nccl-library FILE]
//                        [--tls-ca F --tls-cert F --tls-key F]
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "agent/stage/stage_server.h"
#include "proto/rpc/credentials.h"

int main(int argc, char** argv) {
  glm::stage::StageServer::Options o;
  glm::rpc::TlsFiles tls;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--root") o.root = argv[i + 1];
    else if (flag == "--bind") o.bind_address = argv[i + 1];
    else if (flag == "--port") o.port = static_cast<uint16_t>(std::atoi(argv[i + 1]));
    else if (flag == "--nccl-library") o.nccl_library = argv[i + 1];
    else if (flag == "--tls-ca") tls.ca = argv[i + 1];
    else if (flag == "--tls-cert") tls.cert = argv[i + 1];
    else if (flag == "--tls-key") tls.key = argv[i + 1];
    else {
      std::fprintf(stderr, "glm-stage-serve: unknown flag %s\nusage: glm-stage-serve --root DIR "
                           "[--bind ADDR] [--port N] [--nccl-library FILE] [--tls-ca F --tls-cert F "
                           "--tls-key F]\n", argv[i]);
      return 2;
    }
  }
  if (o.root.empty()) {
    std::fprintf(stderr, "glm-stage-serve: --root is required\n");
    return 2;
  }
  auto creds = glm::rpc::MakeServerCredentials(tls);
  if (!creds.ok()) {
    std::fprintf(stderr, "glm-stage-serve: %s\n", std::string(creds.status().message()).c_str());
    return 2;
  }
  o.credentials = *creds;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before threads start, so they inherit it
  auto server = glm::stage::StageServer::Start(o);
  if (!server.ok()) {
    std::fprintf(stderr, "glm-stage-serve: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  std::printf("port %u\n", (*server)->port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  return 0;
}
