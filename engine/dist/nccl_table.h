// NCCL called through a dlopen handle instead of the link line or LD_PRELOAD: the agent loads the
// library the cluster YAML pins, checks its version, and hands this table to the engine.
//
// Dependency-free on purpose (no nccl.h, no CUDA headers) so the engine can include it. The types
// below are ABI-compatible stand-ins for NCCL's: ncclResult_t / ncclDataType_t / ncclRedOp_t are C
// enums (int-sized), ncclComm_t is an opaque pointer, ncclUniqueId is 128 bytes passed by value,
// cudaStream_t is an opaque pointer. Every pointer in a loaded table is non-null (the loader fails
// when a symbol is missing) and stays valid while the owning NcclLibrary lives.
#pragma once

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

struct FunctionTable {
  Result (*GetVersion)(int* version);
  Result (*GetUniqueId)(UniqueId* unique_id);
  Result (*CommInitRank)(Comm* comm, int nranks, UniqueId comm_id, int rank);
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
