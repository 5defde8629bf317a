// A stand-in libnccl for NcclCommunicator tests: several ranks of one group in one process (one
// thread each), on host memory, sharing state keyed by the unique id. Exported with the real
// NCCL names and C ABI, so the test reaches it only through dlopen + a FunctionTable.
//
// Semantics mirror NCCL's where the communicator depends on them:
// - ncclCommInitRank blocks until all ranks of the id have joined (10 s, then ncclSystemError).
// - ncclCommInitRankConfig checks the config as NCCL does (magic 0xcafebeef, a size that covers
//   `blocking`, blocking undefined / 0 / 1, else ncclInvalidArgument). Blocking, it is
//   ncclCommInitRank. With blocking = 0 it returns ncclInProgress at once with a communicator
//   whose ncclCommGetAsyncError reports ncclInProgress until every rank has joined (then
//   ncclSuccess; ncclSystemError 10 s after the call if some never does, NCCL's bootstrap
//   timeout). A peer's abort does not end that wait: the bootstrap still waits for the missing
//   rank.
// - On a non-blocking communicator every enqueue returns ncclInProgress (inside
//   ncclGroupStart/End: ncclGroupEnd does), and the next ncclCommGetAsyncError reports
//   ncclInProgress once. A call before the caller has polled that to ncclSuccess (or before init
//   completed) is ncclInvalidUsage: NCCL requires the poll before the next call.
// - Collectives and send/recv are asynchronous: a call enqueues work on a fake stream and returns;
//   the work completes when every rank (or the matching peer) has issued its part. The k-th
//   collective of every rank must match (kind, count), else the group breaks (ncclInvalidUsage).
// - ncclCommAbort on one rank breaks the group: the others' ncclCommGetAsyncError returns
//   ncclRemoteError, as NCCL reports a peer whose process died.
// Fake streams (fake_nccl_stream_*) stand in for cudaStream_t / cudaStreamQuery.
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr int kSuccess = 0, kSystemError = 2, kInvalidArgument = 4, kInvalidUsage = 5,
              kRemoteError = 6, kInProgress = 7;
constexpr auto kBootstrapTimeout = std::chrono::seconds(10);
constexpr int kFloat32 = 7, kSum = 0;

struct FakeStream {
  int pending = 0;
};

enum Kind { kAllReduce, kBroadcast };

struct Collective {
  Kind kind;
  size_t count;
  int root;
  int arrived = 0;
  std::vector<const float*> send;
  std::vector<float*> recv;
  std::vector<FakeStream*> streams;
};

struct P2p {
  const float* send = nullptr;
  float* recv = nullptr;
  size_t count = 0;
  FakeStream* stream = nullptr;
};

struct Group {
  int nranks = 0;
  int joined = 0;
  bool broken = false;
  std::vector<unsigned long long> next_seq;
  std::map<unsigned long long, Collective> collectives;
  std::map<std::pair<int, int>, std::deque<P2p>> sends, recvs;  // Keyed by (src, dst).
};

struct FakeComm {
  std::shared_ptr<Group> group;
  int rank = 0;
  bool nonblocking = false;
  bool init_done = true;  // false while a non-blocking init waits for the other ranks.
  std::chrono::steady_clock::time_point bootstrap_deadline;
  bool enqueue_pending = false;  // A non-blocking enqueue not yet polled to ncclSuccess.
};

std::mutex mu;
std::condition_variable cv;
std::map<std::string, std::shared_ptr<Group>> groups;
unsigned long long next_id = 1;
// The non-blocking communicator that enqueued inside this thread's open ncclGroupStart.
thread_local int group_depth = 0;
thread_local FakeComm* group_comm = nullptr;

// A call on a non-blocking communicator that NCCL would refuse: init still running, or an
// enqueue that returned ncclInProgress not yet polled to completion. Holds `mu`.
bool NotReady(const FakeComm& fc) {
  return fc.nonblocking && (!fc.init_done || fc.enqueue_pending);
}

// What a successful enqueue returns: ncclInProgress on a non-blocking communicator (outside a
// group; the group's ncclGroupEnd returns it instead). Holds `mu`.
int Enqueued(FakeComm& fc) {
  if (!fc.nonblocking) return kSuccess;
  if (group_depth > 0) {
    group_comm = &fc;
    return kSuccess;
  }
  fc.enqueue_pending = true;
  return kInProgress;
}

void Complete(Group& g, Collective& c) {
  std::vector<float> result(c.count);
  if (c.kind == kAllReduce) {
    for (size_t i = 0; i < c.count; ++i) {
      float acc = c.send[0][i];
      for (int r = 1; r < g.nranks; ++r) acc += c.send[r][i];
      result[i] = acc;
    }
  } else {
    std::memcpy(result.data(), c.send[c.root], c.count * sizeof(float));
  }
  for (int r = 0; r < g.nranks; ++r) {
    std::memcpy(c.recv[r], result.data(), c.count * sizeof(float));
    --c.streams[r]->pending;
  }
}

int Enqueue(void* comm, Kind kind, const void* s, void* r, size_t count, int type, int op, int root,
            void* stream) {
  auto* fc = static_cast<FakeComm*>(comm);
  if (fc == nullptr || stream == nullptr || type != kFloat32 || op != kSum) return kInvalidArgument;
  std::lock_guard<std::mutex> lock(mu);
  if (NotReady(*fc)) return kInvalidUsage;
  Group& g = *fc->group;
  if (g.broken) return kRemoteError;
  unsigned long long seq = g.next_seq[fc->rank]++;
  auto [it, inserted] = g.collectives.try_emplace(seq);
  Collective& c = it->second;
  if (inserted) {
    c.kind = kind;
    c.count = count;
    c.root = root;
    c.send.assign(g.nranks, nullptr);
    c.recv.assign(g.nranks, nullptr);
    c.streams.assign(g.nranks, nullptr);
  } else if (c.kind != kind || c.count != count || c.root != root) {
    g.broken = true;
    return kInvalidUsage;
  }
  c.send[fc->rank] = static_cast<const float*>(s);
  c.recv[fc->rank] = static_cast<float*>(r);
  c.streams[fc->rank] = static_cast<FakeStream*>(stream);
  ++static_cast<FakeStream*>(stream)->pending;
  if (++c.arrived == g.nranks) {
    Complete(g, c);
    g.collectives.erase(it);
  }
  return Enqueued(*fc);
}

int EnqueueP2p(void* comm, bool is_send, const void* s, void* r, size_t count, int type, int peer,
               void* stream) {
  auto* fc = static_cast<FakeComm*>(comm);
  if (fc == nullptr || stream == nullptr || type != kFloat32) return kInvalidArgument;
  std::lock_guard<std::mutex> lock(mu);
  if (NotReady(*fc)) return kInvalidUsage;
  Group& g = *fc->group;
  if (g.broken) return kRemoteError;
  if (peer < 0 || peer >= g.nranks || peer == fc->rank) return kInvalidArgument;
  std::pair<int, int> key = is_send ? std::make_pair(fc->rank, peer) : std::make_pair(peer, fc->rank);
  P2p mine{static_cast<const float*>(s), static_cast<float*>(r), count,
           static_cast<FakeStream*>(stream)};
  ++mine.stream->pending;
  auto& other = is_send ? g.recvs[key] : g.sends[key];
  if (other.empty()) {
    (is_send ? g.sends[key] : g.recvs[key]).push_back(mine);
    return Enqueued(*fc);
  }
  P2p theirs = other.front();
  other.pop_front();
  const P2p& snd = is_send ? mine : theirs;
  const P2p& rcv = is_send ? theirs : mine;
  if (snd.count != rcv.count) {
    g.broken = true;
    return kInvalidUsage;
  }
  std::memcpy(rcv.recv, snd.send, snd.count * sizeof(float));
  --snd.stream->pending;
  --rcv.stream->pending;
  return Enqueued(*fc);
}

// Joins `rank` to the group of `id` (creating it). Null when `nranks` disagrees with the group's.
// Holds `mu`.
std::shared_ptr<Group> Join(const char (&id)[128], int nranks) {
  std::string key(id, 128);
  std::shared_ptr<Group>& g = groups[key];
  if (!g) {
    g = std::make_shared<Group>();
    g->nranks = nranks;
    g->next_seq.assign(nranks, 0);
  }
  if (g->nranks != nranks) return nullptr;
  ++g->joined;
  cv.notify_all();
  return g;
}

// ncclConfig_t's leading fields, which every NCCL since 2.14 reads.
struct Config {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
};

}  // namespace

extern "C" {

typedef struct {
  char internal[128];
} ncclUniqueId;

// Counters a test reads through dlsym (with __atomic_load_n: ranks call from several threads).
int fake_nccl_calls = 0;              // Collective and p2p calls that reached this library.
int fake_nccl_group_calls = 0;        // ncclGroupStart calls.
int fake_nccl_init_calls = 0;         // ncclCommInitRank calls.
int fake_nccl_init_config_calls = 0;  // ncclCommInitRankConfig calls.
int fake_nccl_aborts = 0;             // ncclCommAbort calls.

void* fake_nccl_stream_create(void) { return new FakeStream; }
void fake_nccl_stream_destroy(void* stream) { delete static_cast<FakeStream*>(stream); }
// 1 when everything enqueued on `stream` has completed, 0 while some is pending.
int fake_nccl_stream_query(void* stream) {
  std::lock_guard<std::mutex> lock(mu);
  return static_cast<FakeStream*>(stream)->pending == 0 ? 1 : 0;
}

int ncclGetVersion(int* version) {
  *version = 23004;
  return kSuccess;
}

int ncclGetUniqueId(ncclUniqueId* id) {
  std::lock_guard<std::mutex> lock(mu);
  std::memset(id->internal, 0, sizeof(id->internal));
  std::string text = "fake-nccl-id-" + std::to_string(next_id++);
  std::memcpy(id->internal, text.data(), text.size());
  return kSuccess;
}

static int InitBlocking(void** comm, int nranks, const ncclUniqueId& id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return kInvalidArgument;
  std::unique_lock<std::mutex> lock(mu);
  std::shared_ptr<Group> group = Join(id.internal, nranks);
  if (!group) return kInvalidUsage;
  if (!cv.wait_for(lock, kBootstrapTimeout, [&] { return group->joined >= nranks; })) {
    return kSystemError;
  }
  *comm = new FakeComm{group, rank};
  return kSuccess;
}

int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
  __atomic_fetch_add(&fake_nccl_init_calls, 1, __ATOMIC_SEQ_CST);
  return InitBlocking(comm, nranks, id, rank);
}

int ncclCommInitRankConfig(void** comm, int nranks, ncclUniqueId id, int rank, Config* config) {
  __atomic_fetch_add(&fake_nccl_init_config_calls, 1, __ATOMIC_SEQ_CST);
  // As NCCL: the caller's leading fields over the defaults; magic, version and blocking checked.
  Config c{sizeof(Config), 0xcafebeef, 21800, INT_MIN};
  if (config == nullptr || config->size < sizeof(Config)) return kInvalidArgument;  // no `blocking`
  std::memcpy(&c, config, sizeof(Config));
  if (c.magic != 0xcafebeef) return kInvalidArgument;
  if (c.version < 21400) c.blocking = INT_MIN;
  if (c.blocking != INT_MIN && c.blocking != 0 && c.blocking != 1) return kInvalidArgument;
  if (c.blocking != 0) return InitBlocking(comm, nranks, id, rank);
  if (nranks < 1 || rank < 0 || rank >= nranks) return kInvalidArgument;
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<Group> group = Join(id.internal, nranks);
  if (!group) return kInvalidUsage;
  auto* fc = new FakeComm{group, rank};
  fc->nonblocking = true;
  fc->init_done = false;
  fc->bootstrap_deadline = std::chrono::steady_clock::now() + kBootstrapTimeout;
  *comm = fc;
  return kInProgress;
}

int ncclCommDestroy(void* comm) {
  delete static_cast<FakeComm*>(comm);
  return kSuccess;
}

int ncclCommAbort(void* comm) {
  __atomic_fetch_add(&fake_nccl_aborts, 1, __ATOMIC_SEQ_CST);
  {
    std::lock_guard<std::mutex> lock(mu);
    static_cast<FakeComm*>(comm)->group->broken = true;
  }
  delete static_cast<FakeComm*>(comm);
  return kSuccess;
}

int ncclCommGetAsyncError(void* comm, int* async_error) {
  std::lock_guard<std::mutex> lock(mu);
  auto* fc = static_cast<FakeComm*>(comm);
  if (!fc->init_done) {
    if (fc->group->joined >= fc->group->nranks) {
      fc->init_done = true;
      *async_error = kSuccess;
    } else {
      *async_error = std::chrono::steady_clock::now() < fc->bootstrap_deadline ? kInProgress
                                                                                : kSystemError;
    }
    return kSuccess;
  }
  if (fc->enqueue_pending) {
    fc->enqueue_pending = false;
    *async_error = kInProgress;
    return kSuccess;
  }
  *async_error = fc->group->broken ? kRemoteError : kSuccess;
  return kSuccess;
}

const char* ncclGetErrorString(int result) {
  switch (result) {
    case kSuccess: return "no error";
    case kSystemError: return "unhandled system error (fake)";
    case kInvalidArgument: return "invalid argument (fake)";
    case kInvalidUsage: return "invalid usage (fake)";
    case kRemoteError: return "remote process exited or there was a network error (fake)";
    case kInProgress: return "NCCL operation in progress (fake)";
    default: return "unknown result (fake)";
  }
}

int ncclAllReduce(const void* s, void* r, size_t n, int t, int op, void* c, void* st) {
  __atomic_fetch_add(&fake_nccl_calls, 1, __ATOMIC_SEQ_CST);
  return Enqueue(c, kAllReduce, s, r, n, t, op, 0, st);
}

int ncclBroadcast(const void* s, void* r, size_t n, int t, int root, void* c, void* st) {
  __atomic_fetch_add(&fake_nccl_calls, 1, __ATOMIC_SEQ_CST);
  return Enqueue(c, kBroadcast, s, r, n, t, kSum, root, st);
}

int ncclSend(const void* s, size_t n, int t, int peer, void* c, void* st) {
  __atomic_fetch_add(&fake_nccl_calls, 1, __ATOMIC_SEQ_CST);
  return EnqueueP2p(c, true, s, nullptr, n, t, peer, st);
}

int ncclRecv(void* r, size_t n, int t, int peer, void* c, void* st) {
  __atomic_fetch_add(&fake_nccl_calls, 1, __ATOMIC_SEQ_CST);
  return EnqueueP2p(c, false, nullptr, r, n, t, peer, st);
}

// Not used by NcclCommunicator; present because the loader resolves every table symbol.
int ncclAllGather(const void*, void*, size_t, int, void*, void*) { return kInvalidUsage; }
int ncclReduceScatter(const void*, void*, size_t, int, int, void*, void*) { return kInvalidUsage; }

int ncclGroupStart(void) {
  __atomic_fetch_add(&fake_nccl_group_calls, 1, __ATOMIC_SEQ_CST);
  ++group_depth;
  return kSuccess;
}
int ncclGroupEnd(void) {
  if (group_depth == 0) return kInvalidUsage;
  if (--group_depth > 0 || group_comm == nullptr) return kSuccess;
  std::lock_guard<std::mutex> lock(mu);
  group_comm->enqueue_pending = true;
  group_comm = nullptr;
  return kInProgress;
}

}  // extern "C"
