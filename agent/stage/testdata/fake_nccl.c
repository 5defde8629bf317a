/* A stand-in libnccl for the loader tests: every FunctionTable symbol, ncclGetVersion returning
 * FAKE_NCCL_VERSION; with FAKE_NCCL_OMIT_ALLREDUCE, no ncclAllReduce; with
 * FAKE_NCCL_OMIT_INIT_CONFIG, no ncclCommInitRankConfig (as NCCL < 2.14). The collectives only
 * record that they were called (fake_nccl_calls), so a test can prove the call went through the
 * table. */
#include <stddef.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;
int fake_nccl_calls = 0;

int ncclGetVersion(int* version) { *version = FAKE_NCCL_VERSION; return 0; }
int ncclGetUniqueId(ncclUniqueId* id) { memset(id->internal, 7, sizeof(id->internal)); return 0; }
int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
  (void)nranks; (void)rank;
  *comm = (void*)(size_t)(unsigned char)id.internal[0];
  return 0;
}
#ifndef FAKE_NCCL_OMIT_INIT_CONFIG
/* Reads the config's leading size / magic / version / blocking, as NCCL does. */
typedef struct { size_t size; unsigned int magic; unsigned int version; int blocking; } fakeConfig;
int ncclCommInitRankConfig(void** comm, int nranks, ncclUniqueId id, int rank, fakeConfig* config) {
  if (config == NULL || config->size < sizeof(fakeConfig) || config->magic != 0xcafebeef) return 4;
  return ncclCommInitRank(comm, nranks, id, rank);
}
#endif
int ncclCommDestroy(void* comm) { (void)comm; return 0; }
int ncclCommAbort(void* comm) { (void)comm; return 0; }
int ncclCommGetAsyncError(void* comm, int* err) { (void)comm; *err = 0; return 0; }
const char* ncclGetErrorString(int result) { return result == 0 ? "no error" : "fake error"; }
#ifndef FAKE_NCCL_OMIT_ALLREDUCE
int ncclAllReduce(const void* s, void* r, size_t n, int t, int op, void* c, void* st) {
  (void)t; (void)op; (void)c; (void)st;
  memcpy(r, s, n * sizeof(float));
  ++fake_nccl_calls;
  return 0;
}
#endif
int ncclAllGather(const void* s, void* r, size_t n, int t, void* c, void* st) {
  (void)s; (void)r; (void)n; (void)t; (void)c; (void)st; return 0;
}
int ncclReduceScatter(const void* s, void* r, size_t n, int t, int op, void* c, void* st) {
  (void)s; (void)r; (void)n; (void)t; (void)op; (void)c; (void)st; return 0;
}
int ncclBroadcast(const void* s, void* r, size_t n, int t, int root, void* c, void* st) {
  (void)s; (void)r; (void)n; (void)t; (void)root; (void)c; (void)st; return 0;
}
int ncclSend(const void* s, size_t n, int t, int peer, void* c, void* st) {
  (void)s; (void)n; (void)t; (void)peer; (void)c; (void)st; return 0;
}
int ncclRecv(void* r, size_t n, int t, int peer, void* c, void* st) {
  (void)r; (void)n; (void)t; (void)peer; (void)c; (void)st; return 0;
}
int ncclGroupStart(void) { return 0; }
int ncclGroupEnd(void) { return 0; }
