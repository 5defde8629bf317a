// NCCL called through a dlopen handle instead of the link line or LD_PRELOAD: the agent loads the
// library the cluster YAML pins, checks its version, and hands this table to the engine.
//
// Dependency-free on purpose (no nccl.h, no CUDA headers) so the engine can include it. The types
// below are ABI-compatible stand-ins for NCCL's: ncclResult_t / ncclDataType_t / ncclRedOp_t are C
// enums (int-sized), ncclComm_t is an opaque pointer, ncclUniqueId is 128 bytes passed by value,
// cudaStream_t is an opaque pointer, Config stands in for ncclConfig_t (below). Every pointer in a
// loaded table is non-null (the loader fails when a symbol is missing) except CommInitRankConfig,
// which NCCL < 2.14 lacks; all stay valid while the owning NcclLibrary lives.
#pragma once

#include <climits>
#include <cstddef>

namespace glm::nccl {

using Result = int;        // ncclResult_t; 0 = ncclSuccess.
using DataType = int;      // ncclDataType_t (ncclFloat32 = 7, ncclBfloat16 = 9, ...).
using RedOp = int;         // ncclRedOp_t (ncclSum = 0).
using Comm = void*;        // ncclComm_t.
using Stream = void*;      // cudaStream_t.
struct UniqueId {          // ncclUniqueId (NCCL_UNIQUE_ID_BYTES = 128).
  char internal[128];
};

// ncclConfig_t as of NCCL 2.18, every field "undefined" (NCCL_CONFIG_UNDEF_INT = INT_MIN,
// NCCL_CONFIG_UNDEF_PTR = NULL) as NCCL_CONFIG_INITIALIZER leaves it; callers set `blocking` only.
// NCCL grows this struct by appending fields, and reads a caller's config by its leading
// `size` / `magic` / `version`: it copies min(size, its own sizeof) bytes over its own initializer
// (fields past `size` keep NCCL's defaults), rejects a magic other than 0xcafebeef
// (ncclInvalidArgument), and resets to defaults the fields newer than `version` (blocking: 2.14;
// cgaClusterSize, minCTAs, maxCTAs, netName: 2.17). splitShare came with ncclCommSplit in 2.18,
// so this is the 2.18 layout and `version` says NCCL_VERSION(2, 18, 0). Any NCCL from 2.14 on
// accepts it: a newer one sees a shorter struct and keeps its defaults for the rest (commName,
// ...), an older one reads only its own leading fields. `version` must not claim more than 2.18:
// the 4 padding bytes after split_share are where 2.25 put trafficClass, which NCCL takes from
// the caller only when `version` >= 2.25.
// (Checked against nccl.h 2.28.9: the offsets below match ncclConfig_t's.)
struct Config {
  size_t size = sizeof(Config);
  unsigned int magic = 0xcafebeef;
  unsigned int version = 21800;  // NCCL_VERSION(2, 18, 0)
  int blocking = INT_MIN;        // 0: calls may return ncclInProgress (non-blocking comm).
  int cga_cluster_size = INT_MIN;
  int min_ctas = INT_MIN;
  int max_ctas = INT_MIN;
  const char* net_name = nullptr;
  int split_share = INT_MIN;
};
// The ABI the loaded library reads (LP64, as ncclConfig_t's fields are laid out in nccl.h).
static_assert(offsetof(Config, magic) == 8 && offsetof(Config, version) == 12 &&
              offsetof(Config, blocking) == 16 && offsetof(Config, net_name) == 32 &&
              offsetof(Config, split_share) == 40 && sizeof(Config) == 48,
              "nccl::Config must match ncclConfig_t's 2.18 layout");

struct FunctionTable {
  Result (*GetVersion)(int* version);
  Result (*GetUniqueId)(UniqueId* unique_id);
  Result (*CommInitRank)(Comm* comm, int nranks, UniqueId comm_id, int rank);
  // ncclCommInitRankConfig (NCCL >= 2.14); nullptr when the library predates it.
  Result (*CommInitRankConfig)(Comm* comm, int nranks, UniqueId comm_id, int rank,
                               Config* config);
  Result (*CommDestroy)(Comm comm);
  Result (*CommAbort)(Comm comm);
  Result (*CommGetAsyncError)(Comm comm, Result* async_error);
  const char* (*GetErrorString)(Result result);
  Result (*AllReduce)(const void* sendbuff, void* recvbuff, size_t count, DataType datatype,
                      RedOp op, Comm comm, Stream stream);
  Result (*AllGather)(const void* sendbuff, void* recvbuff, size_t sendcount, DataType datatype,
                      Comm comm, Stream stream);
  Result (*ReduceScatter)(const void* sendbuff, void* recvbuff, size_t recvcount,
                          DataType datatype, RedOp op, Comm comm, Stream stream);
  Result (*Broadcast)(const void* sendbuff, void* recvbuff, size_t count, DataType datatype,
                      int root, Comm comm, Stream stream);
  Result (*Send)(const void* sendbuff, size_t count, DataType datatype, int peer, Comm comm,
                 Stream stream);
  Result (*Recv)(void* recvbuff, size_t count, DataType datatype, int peer, Comm comm,
                 Stream stream);
  Result (*GroupStart)();
  Result (*GroupEnd)();
};

}  // namespace glm::nccl
