// A CUPTI injection library that records when every kernel ran, graph replays included, with the
// overlap that programmatic dependent launch gives (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL does not
// serialize kernels). The GPU machine has no Nsight Systems; this is the timeline it cannot make.
//
// Build it there against the CUPTI the machine has (tools/gpu/kernel_timeline.sh does this):
//   g++ -O2 -shared -fPIC -I<cupti include> -I<cuda include> kernel_trace.cc -L<cupti lib> -lcupti
// Use it on any CUDA program, unchanged:
//   CUDA_INJECTION64_PATH=libkernel_trace.so GLM_KERNEL_TRACE=trace.csv <program> ...
// trace.csv: one line per kernel, "correlation,start_ns,end_ns,stream,graph,name" (all kernels of
// one cudaGraphLaunch share its correlation id; name demangled, commas replaced by ';').
// tools/gpu/kernel_timeline.py turns it into per-replay timelines.

#include <cupti.h>
#include <cxxabi.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#ifndef GLM_KERNEL_RECORD
#error \
    "define GLM_KERNEL_RECORD as the newest CUpti_ActivityKernelN of this CUPTI (see kernel_timeline.sh)"
#endif

namespace {

constexpr size_t kBufferBytes = 8u << 20;

std::mutex g_mutex;
FILE* g_out = nullptr;
size_t g_kernels = 0;
size_t g_dropped = 0;

void Check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, s ? s : "?");
}

std::string Demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = (status == 0 && d != nullptr) ? d : name;
  std::free(d);
  for (char& c : s) {
    if (c == ',' || c == '\n') c = ';';
  }
  return s;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
      continue;
    }
    const auto* k = reinterpret_cast<const GLM_KERNEL_RECORD*>(record);
    ++g_kernels;
    if (g_out == nullptr) continue;
    std::fprintf(g_out, "%u,%llu,%llu,%u,%u,%s\n", k->correlationId,
                 static_cast<unsigned long long>(k->start), static_cast<unsigned long long>(k->end),
                 k->streamId, k->graphId, Demangled(k->name).c_str());
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) {
    g_dropped += dropped;
  }
  std::free(buffer);
}

void AtExit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out != nullptr) std::fclose(g_out);
  g_out = nullptr;
  std::fprintf(stderr, "kernel_trace: %zu kernels recorded, %zu records dropped\n", g_kernels,
               g_dropped);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  static bool done = false;
  if (done) return 1;
  done = true;
  const char* path = std::getenv("GLM_KERNEL_TRACE");
  if (path == nullptr || *path == '\0') path = "kernel_trace.csv";
  g_out = std::fopen(path, "w");
  if (g_out == nullptr) {
    std::fprintf(stderr, "kernel_trace: cannot write %s: %s\n", path, std::strerror(errno));
  }
  Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted), "register callbacks");
  Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable concurrent kernels");
  std::atexit(AtExit);
  return 1;
}
