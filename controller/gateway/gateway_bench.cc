// glm-gateway-bench: what the OpenAI-compatible gateway costs on top of its HTTP server, all in
// one process on loopback (not a test; no assertion on the figures).
//
//   glm-gateway-bench [--requests N] [--concurrency C] [--streams S] [--tokens T] [--open K]
//                     [--model DIR] [--io-threads I] [--repeats R]
//                     [--serve-baseline PORT [--serve-seconds S] | --target HOST:PORT]
//
//   1. per request   N non-streamed POST /v1/completions (token-id prompt, max_tokens 8) over C
//                    keep-alive connections; the backend answers 8 tokens at once from the calling
//                    thread. Baseline: a second http::Server answering the same JSON bytes
//                    pre-built (no parsing, tokenizing, routing). requests/s, p50/p99, server CPU.
//   2. per token     S streamed chat completions (the checkpoint's chat template rendered) over C
//                    connections; the backend emits T tokens, one event each, round-robin over the
//                    open generations like a decode step. Baseline: a server sending the same SSE
//                    frames pre-built, one per step. tokens/s and server CPU per token.
//   3. open streams  K SSE chat streams held open by the backend; server RSS per stream, CPU while
//                    they idle 2 s, then the time from releasing them (1 token, then finish) until
//                    the client has seen every stream end.
//
// Phases 1 and 2 warm both servers up, then run R times (default 5), gateway and baseline
// interleaved: rates and CPU are the median run, p50/p99 over every request of every run.
// The servers run in this process; the client is a forked child (forked before any thread
// starts), a single-threaded epoll loop driven over a socketpair. So getrusage(RUSAGE_SELF) and
// VmRSS here are the server side only. Every phase has a request count and a wall-clock cap.
// The last line of stdout is every figure as one JSON object.
//
// Against another proxy (tools/bench/gateway_vs_nginx.sh puts nginx in front of the baseline):
//   --serve-baseline PORT  only the baseline server, on 127.0.0.1:PORT, until SIGTERM/SIGINT or
//                          --serve-seconds S (default 120). Its bytes are captured from one
//                          request of each kind through the in-process gateway first, as above;
//                          stream frames go out one per Stepper step, the same (unthrottled)
//                          round-robin pacing as the in-process baseline.
//   --target HOST:PORT     phases 1 and 2's client load (same requests, warm-up, R runs) against
//                          that server, from this process; no server is started, so no server
//                          CPU is reported. --tokens must match the server's (its frames).
// Streams also report, at the client, the time to the first event and the gap between events.
#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "controller/gateway/gateway.h"
#include "controller/gateway/testing/http_client.h"
#include "nlohmann/json.hpp"

namespace glm::gateway {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
// Requests are a few hundred bytes: a blocking send on loopback never waits.
using testing::SendAll;

constexpr double kLoadCapS = 20.0;    // phases 1 and 2: each load (gateway, baseline)
constexpr double kOpenCapS = 30.0;    // phase 3: opening K streams
constexpr double kDrainCapS = 30.0;   // phase 3: after the release
constexpr double kIdleS = 2.0;        // phase 3: streams held idle while CPU is measured
constexpr int kOpenWindow = 64;       // phase 3: connections opening at once (accept queue)
constexpr int kCompletionTokens = 8;  // phase 1: max_tokens

struct Args {
  int requests = 2000;
  int concurrency = 16;
  int streams = 200;
  int tokens = 64;
  int open = 5000;
  int io_threads = 2;
  int repeats = 5;
  std::string model;
  int serve_baseline = 0;  // port; 0: not this mode
  int serve_seconds = 120;
  std::string target_host;  // empty: not this mode
  int target_port = 0;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double CpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

int64_t RssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return -1;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown";
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t at = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[at];
}

// ---------------------------------------------------------------------------------------------
// Client side (the forked child).

// One keep-alive connection and an incremental HTTP/1.1 response parser (Content-Length and
// chunked bodies; the de-chunked body is kept per response).
struct Conn {
  enum State { kHead, kBody, kChunkSize, kChunkData, kTrailer };
  int fd = -1;
  State state = kHead;
  std::string in;
  size_t need = 0;
  int status = 0;
  std::string body;
  double started = 0;
  bool open = false;  // phase 3: first body bytes seen
  bool done = false;  // phase 3: response complete
  size_t scanned = 0;       // streams: body bytes already searched for event ends
  size_t seen_events = 0;   // streams: events of the current response seen so far
  double last_event = 0;    // streams: when the latest of them arrived

  // Streams: times the events that arrived since the last call (`now`: this read) into
  // `first_ms` (request sent → first event) and `gap_ms` (previous event → this one; 0 when both
  // came in one read). Call after each Parse(), before the next request is sent.
  void NoteEvents(double now, std::vector<double>* first_ms, std::vector<double>* gap_ms) {
    for (size_t at = body.find("\n\n", scanned); at != std::string::npos;
         at = body.find("\n\n", scanned)) {
      scanned = at + 2;
      if (seen_events++ == 0) first_ms->push_back((now - started) * 1e3);
      else gap_ms->push_back((now - last_event) * 1e3);
      last_event = now;
    }
  }
  // After a complete response: its body is dropped, the next one's events counted afresh.
  void ResetEvents() {
    body.clear();
    scanned = 0;
    seen_events = 0;
  }

  // 1: a response is complete (status, body), 0: needs more bytes, -1: malformed.
  int Parse() {
    for (;;) {
      switch (state) {
        case kHead: {
          const size_t end = in.find("\r\n\r\n");
          if (end == std::string::npos) return in.size() > (64 << 10) ? -1 : 0;
          if (in.rfind("HTTP/1.", 0) != 0) return -1;
          status = std::atoi(in.c_str() + 9);
          std::string head = in.substr(0, end);
          for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          const bool chunked = head.find("transfer-encoding: chunked") != std::string::npos;
          const size_t cl = head.find("content-length:");
          need = cl == std::string::npos ? 0 : std::strtoul(head.c_str() + cl + 15, nullptr, 10);
          in.erase(0, end + 4);
          body.clear();
          state = chunked ? kChunkSize : kBody;
          break;
        }
        case kBody:
          if (in.size() < need) return 0;
          body.assign(in, 0, need);
          in.erase(0, need);
          state = kHead;
          return 1;
        case kChunkSize: {
          const size_t eol = in.find("\r\n");
          if (eol == std::string::npos) return 0;
          const size_t size = std::strtoul(in.c_str(), nullptr, 16);
          in.erase(0, eol + 2);
          need = size;
          state = size == 0 ? kTrailer : kChunkData;
          break;
        }
        case kChunkData:
          if (in.size() < need + 2) return 0;
          body.append(in, 0, need);
          in.erase(0, need + 2);
          state = kChunkSize;
          break;
        case kTrailer: {
          const size_t eol = in.find("\r\n");
          if (eol == std::string::npos) return 0;
          in.erase(0, eol + 2);
          if (eol == 0) {
            state = kHead;
            return 1;
          }
          break;
        }
      }
    }
  }
};

// A blocking connect to host:port (an IPv4 literal; loopback completes in the kernel) with
// TCP_NODELAY.
int Connect(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Reads what is there; false when the peer closed or failed.
bool Drain(Conn& c) {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

std::string PostText(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// One JSON line (bytes that are not UTF-8 replaced, never an exception).
std::string Line(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

size_t CountEvents(const std::string& body) {
  size_t n = 0;
  for (size_t at = body.find("\n\n"); at != std::string::npos; at = body.find("\n\n", at + 2)) ++n;
  return n;
}

// Closed loop: `total` requests over `concurrency` keep-alive connections, each sending its next
// request when the previous answer is complete. A streamed answer counts only when it ends with
// [DONE].
Json RunLoad(const std::string& host, int port, const std::string& request, int total,
             int concurrency, bool stream, double cap_s) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  std::vector<Conn> conns(static_cast<size_t>(std::max(1, std::min(concurrency, total))));
  int sent = 0, completed = 0, errors = 0, live = 0;
  size_t events = 0;
  std::vector<double> latencies;
  latencies.reserve(static_cast<size_t>(total));
  std::vector<double> first_event_ms, gap_ms;  // streams only
  std::string last_body;
  const double start = Now();
  for (size_t i = 0; i < conns.size(); ++i) {
    Conn& c = conns[i];
    c.fd = Connect(host, port);
    if (c.fd < 0) {
      if (last_body.empty()) last_body = std::string("connect: ") + std::strerror(errno);
      ++errors;
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = i;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
    ++live;
    c.started = Now();
    ++sent;
    if (!SendAll(c.fd, request)) ++errors;
  }
  std::vector<epoll_event> ready(conns.size());
  while (completed + errors < total && live > 0 && Now() - start < cap_s) {
    const int n = ::epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), 100);
    for (int k = 0; k < n; ++k) {
      Conn& c = conns[ready[static_cast<size_t>(k)].data.u64];
      if (c.fd < 0) continue;
      bool alive = Drain(c);
      const double read_at = Now();
      while (alive) {
        const int parsed = c.Parse();
        if (stream && parsed >= 0) c.NoteEvents(read_at, &first_event_ms, &gap_ms);
        if (parsed == 0) break;
        if (parsed < 0) {
          alive = false;
          break;
        }
        const bool ok = c.status == 200 &&
                        (!stream || (c.body.size() >= 14 &&
                                     c.body.compare(c.body.size() - 14, 14,
                                                    "data: [DONE]\n\n") == 0));
        if (ok) {
          ++completed;
          latencies.push_back(Now() - c.started);
          if (stream) events += CountEvents(c.body);
          if (last_body.empty() || completed == total) last_body = c.body;
        } else {
          ++errors;
          if (last_body.empty()) last_body = c.body;
        }
        c.ResetEvents();
        if (sent < total) {
          c.started = Now();
          ++sent;
          if (!SendAll(c.fd, request)) alive = false;
        }
      }
      if (!alive) {
        ::close(c.fd);
        c.fd = -1;
        --live;
        if (sent > completed + errors) ++errors;  // its request in flight is lost
      }
    }
  }
  const double wall = Now() - start;
  for (Conn& c : conns) {
    if (c.fd >= 0) ::close(c.fd);
  }
  ::close(ep);
  Json out;
  out["completed"] = completed;
  out["errors"] = errors;
  out["capped"] = completed + errors < total;
  out["wall_s"] = wall;
  out["p50_ms"] = Percentile(latencies, 0.50) * 1e3;
  out["p99_ms"] = Percentile(latencies, 0.99) * 1e3;
  out["events"] = events;
  out["last_body"] = last_body;
  if (stream) {
    out["first_event_ms"] = first_event_ms;
    out["gap_ms"] = gap_ms;
  }
  for (double& l : latencies) l *= 1e3;
  out["latencies_ms"] = latencies;
  return out;
}

// Phase 3: opens `total` streams, at most kOpenWindow not yet answered at a time (so the accept
// queue never overflows into SYN retries), reports {"opened"} over `ipc`, then waits until every
// open stream has ended and reports {"finished", "t_end"} (steady clock, shared across processes).
void RunOpen(int port, const std::string& request, int total, int ipc) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  std::vector<Conn> conns(static_cast<size_t>(total));
  int created = 0, opening = 0, opened = 0, finished = 0, errors = 0;
  int lost = 0;  // open, then failed before its end
  std::string first_error;
  auto fail = [&](Conn& c, const std::string& why) {
    if (first_error.empty()) first_error = why;
    ++errors;
    if (c.open) ++lost;
    else --opening;
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
  };
  std::vector<epoll_event> ready(256);
  auto pump = [&](double deadline, const std::function<bool()>& until) {
    while (!until() && Now() < deadline) {
      while (opening < kOpenWindow && created < total) {
        Conn& c = conns[static_cast<size_t>(created)];
        ++created;
        ++opening;
        c.fd = Connect("127.0.0.1", port);
        if (c.fd < 0) {
          fail(c, std::string("connect: ") + std::strerror(errno));
          continue;
        }
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = static_cast<uint64_t>(created - 1);
        ::epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
        if (!SendAll(c.fd, request)) fail(c, "send failed");
      }
      const int n = ::epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), 50);
      for (int k = 0; k < n; ++k) {
        Conn& c = conns[ready[static_cast<size_t>(k)].data.u64];
        if (c.fd < 0) continue;
        const bool alive = Drain(c);
        const int parsed = c.Parse();
        if (parsed < 0 || (c.status != 0 && c.status != 200)) {
          fail(c, "answer " + std::to_string(c.status) + ": " + c.body.substr(0, 200));
          continue;
        }
        if (!c.open && (!c.body.empty() || parsed == 1)) {
          c.open = true;
          --opening;
          ++opened;
        }
        if (parsed == 1 && !c.done) {
          c.done = true;
          ++finished;
        }
        if (!alive && !c.done) fail(c, "connection closed by the server");
      }
    }
  };
  const double start = Now();
  pump(start + kOpenCapS, [&] { return created == total && opening == 0; });
  Json report;
  report["opened"] = opened;
  report["errors"] = errors;
  report["first_error"] = first_error;
  report["open_s"] = Now() - start;
  report["finished_early"] = finished;
  std::string line = Line(report);
  SendAll(ipc, line);
  pump(Now() + kOpenCapS + kDrainCapS, [&] { return finished + lost >= opened; });
  Json done;
  done["finished"] = finished;
  done["t_end"] = Now();
  done["errors"] = errors;
  line = Line(done);
  SendAll(ipc, line);
  for (Conn& c : conns) {
    if (c.fd >= 0) ::close(c.fd);
  }
  ::close(ep);
}

// Reads one '\n'-terminated line; false at EOF.
bool ReadLine(int fd, std::string* buffer, std::string* line) {
  for (;;) {
    const size_t eol = buffer->find('\n');
    if (eol != std::string::npos) {
      *line = buffer->substr(0, eol);
      buffer->erase(0, eol + 1);
      return true;
    }
    char buf[65536];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffer->append(buf, static_cast<size_t>(n));
  }
}

// The child: executes commands from the parent until EOF.
[[noreturn]] void ClientMain(int ipc) {
  std::string buffer, line;
  while (ReadLine(ipc, &buffer, &line)) {
    const Json cmd = Json::parse(line);
    const std::string what = cmd["cmd"];
    if (what == "load") {
      Json out = RunLoad("127.0.0.1", cmd["port"].get<int>(), cmd["request"].get<std::string>(),
                         cmd["total"].get<int>(), cmd["concurrency"].get<int>(),
                         cmd["stream"].get<bool>(), cmd["cap_s"].get<double>());
      SendAll(ipc, Line(out));
    } else if (what == "open") {
      RunOpen(cmd["port"].get<int>(), cmd["request"].get<std::string>(), cmd["total"].get<int>(),
              ipc);
    }
  }
  ::_exit(0);
}

// The parent's end of the socketpair.
class ClientProcess {
 public:
  ClientProcess(int fd, pid_t pid) : fd_(fd), pid_(pid) {}
  ~ClientProcess() {
    ::close(fd_);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  void Send(const Json& cmd) { SendAll(fd_, Line(cmd)); }
  Json Receive() {
    std::string line;
    if (!ReadLine(fd_, &buffer_, &line)) {
      std::fprintf(stderr, "glm-gateway-bench: the client process died\n");
      std::exit(1);
    }
    return Json::parse(line);
  }

 private:
  int fd_;
  pid_t pid_;
  std::string buffer_;
};

// ---------------------------------------------------------------------------------------------
// Server side.

// Round-robin stepper: each step calls every active job once, as an engine's decode step emits
// one token for each running sequence. Held jobs wait for ReleaseHeld. One thread; a job's step
// returns true when it has finished.
class Stepper {
 public:
  using Step = std::function<bool()>;
  Stepper() : thread_([this] { Loop(); }) {}
  ~Stepper() { Stop(); }

  void Add(Step step, bool held) {
    std::lock_guard<std::mutex> lock(mu_);
    (held ? held_ : added_).push_back(std::move(step));
    cv_.notify_one();
  }
  void ReleaseHeld() {
    std::lock_guard<std::mutex> lock(mu_);
    for (Step& s : held_) added_.push_back(std::move(s));
    held_.clear();
    cv_.notify_one();
  }
  // Joins the thread; jobs not finished are dropped.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      stop_ = true;
      cv_.notify_one();
    }
    thread_.join();
    held_.clear();
    added_.clear();
  }

 private:
  void Loop() {
    std::vector<Step> active, next;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !added_.empty() || !active.empty(); });
        if (stop_) return;
        for (Step& s : added_) active.push_back(std::move(s));
        added_.clear();
      }
      next.clear();
      for (Step& s : active) {
        if (!s()) next.push_back(std::move(s));
      }
      active.swap(next);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Step> added_, held_;
  bool stop_ = false;
  std::thread thread_;
};

// The replica side of the bench. In instant mode (phase 1) a generation is answered from the
// calling thread, all tokens in one event. Otherwise it gets one token per Stepper step, held
// first when hold is on (phase 3).
class BenchBackend : public ReplicaBackend {
 public:
  BenchBackend(Stepper* stepper, std::vector<int32_t> prefix, std::vector<int32_t> filler)
      : stepper_(stepper), prefix_(std::move(prefix)), filler_(std::move(filler)) {
    ReplicaInfo r;
    r.index = 0;
    r.ready = true;
    r.state = "ready";
    replicas_.push_back(r);
  }
  void set_instant(bool instant) { instant_.store(instant); }
  void set_hold(bool hold) { hold_.store(hold); }

  std::vector<ReplicaInfo> Replicas() override { return replicas_; }

  std::shared_ptr<GenerateCall> Generate(int, const GenerateParams& params,
                                         GenerateCallbacks callbacks) override {
    auto call = std::make_shared<Call>();
    const int max_tokens = params.max_tokens;
    if (instant_.load()) {
      std::vector<int32_t> ids;
      for (int i = 0; i < max_tokens; ++i) ids.push_back(TokenAt(i));
      callbacks.on_tokens(ids, {});
      callbacks.on_done(absl::OkStatus(), "length",
                        static_cast<int>(params.prompt_token_ids.size()), max_tokens);
      return call;
    }
    auto sent = std::make_shared<int>(0);
    const int prompt = static_cast<int>(params.prompt_token_ids.size());
    stepper_->Add(
        [this, call, sent, max_tokens, prompt, cb = std::move(callbacks)]() {
          if (call->cancelled.load()) {
            cb.on_done(absl::OkStatus(), "abort", prompt, *sent);
            return true;
          }
          if (*sent < max_tokens) {
            cb.on_tokens({TokenAt(*sent)}, {});
            ++*sent;
            return false;
          }
          cb.on_done(absl::OkStatus(), "length", prompt, *sent);
          return true;
        },
        hold_.load());
    return call;
  }

 private:
  struct Call : GenerateCall {
    void Cancel() override { cancelled.store(true); }
    std::atomic<bool> cancelled{false};
  };
  // The reasoning ends after the prefix, then the answer's text repeats.
  int32_t TokenAt(int i) const {
    if (static_cast<size_t>(i) < prefix_.size()) return prefix_[static_cast<size_t>(i)];
    return filler_[(static_cast<size_t>(i) - prefix_.size()) % filler_.size()];
  }

  Stepper* const stepper_;
  const std::vector<int32_t> prefix_, filler_;
  std::vector<ReplicaInfo> replicas_;
  std::atomic<bool> instant_{false};
  std::atomic<bool> hold_{false};
};

// The baseline server: the same response bytes with no gateway work. Completions: a fixed JSON
// body. Chat streams: pre-built SSE frames, one per Stepper step.
class BaselineHandler {
 public:
  explicit BaselineHandler(Stepper* stepper) : stepper_(stepper) {}
  void SetBody(std::string body) { body_ = std::move(body); }
  void SetFrames(std::vector<std::string> frames) { frames_ = std::move(frames); }

  void Handle(const std::shared_ptr<http::Exchange>& exchange) {
    if (exchange->request.target == "/v1/completions") {
      http::Response resp;
      resp.headers = {{"Content-Type", "application/json"}};
      resp.body = body_;
      exchange->Respond(std::move(resp));
      return;
    }
    std::shared_ptr<http::Stream> stream = exchange->StartStream(200, {});
    auto next = std::make_shared<size_t>(0);
    stepper_->Add(
        [this, stream, next] {
          if (*next < frames_.size()) stream->Send(frames_[(*next)++]);
          if (*next < frames_.size() && !stream->closed()) return false;
          stream->Finish();
          return true;
        },
        false);
  }

 private:
  Stepper* const stepper_;
  std::string body_;
  std::vector<std::string> frames_;
};

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

// The measured runs of one server in one phase.
struct Runs {
  std::vector<double> rates;           // requests/s or tokens/s, per run
  std::vector<double> cpu_us;          // server CPU per request or token, per run (if measured)
  std::vector<double> latencies_ms;    // every request of every run
  std::vector<double> first_event_ms;  // streams: request sent → first event, every stream
  std::vector<double> gap_ms;          // streams: between consecutive events, every event
  int completed = 0;
  double events = 0;
  int errors = 0;
  bool capped = false;

  // Adds one RunLoad answer: `units` per completed request (1, or T tokens); `cpu_s` the server
  // CPU it cost, negative when not measured (an external server).
  void Add(const Json& r, double units, double cpu_s) {
    const double done_units = r["completed"].get<double>() * units;
    rates.push_back(done_units / r["wall_s"].get<double>());
    if (cpu_s >= 0) cpu_us.push_back(done_units > 0 ? cpu_s / done_units * 1e6 : 0.0);
    for (double l : r["latencies_ms"]) latencies_ms.push_back(l);
    if (r.contains("first_event_ms")) {
      for (double l : r["first_event_ms"]) first_event_ms.push_back(l);
      for (double l : r["gap_ms"]) gap_ms.push_back(l);
    }
    completed += r["completed"].get<int>();
    events += r["events"].get<double>();
    errors += r["errors"].get<int>();
    capped = capped || r["capped"].get<bool>();
  }
  double P(double p) const { return Percentile(latencies_ms, p); }
  double FirstEventP(double p) const { return Percentile(first_event_ms, p); }
  double GapP(double p) const { return Percentile(gap_ms, p); }
  // `cpu` null: CPU was not measured and is left out.
  Json ToJson(const char* rate, const char* cpu) const {
    Json j{{rate, Median(rates)}, {"p50_ms", P(0.50)}, {"p99_ms", P(0.99)},
           {"errors", errors},    {"capped", capped}};
    if (cpu != nullptr) j[cpu] = Median(cpu_us);
    if (!first_event_ms.empty()) {
      j["first_event_p50_ms"] = FirstEventP(0.50);
      j["first_event_p99_ms"] = FirstEventP(0.99);
      j["gap_p50_ms"] = GapP(0.50);
      j["gap_p99_ms"] = GapP(0.99);
    }
    return j;
  }
};

// A load that failed in part is reported, with the body of a failed answer.
void WarnIfFailed(const std::string& where, const Json& r) {
  if (r["errors"].get<int>() == 0 && !r["capped"].get<bool>()) return;
  std::printf("WARNING: %s: %d errors%s; last body: %.300s\n", where.c_str(),
              r["errors"].get<int>(), r["capped"].get<bool>() ? ", hit the wall-clock cap" : "",
              r["last_body"].get<std::string>().c_str());
}

std::vector<std::string> SplitEvents(const std::string& body) {
  std::vector<std::string> frames;
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find("\n\n", at);
    if (end == std::string::npos) break;
    frames.push_back(body.substr(at, end + 2 - at));
    at = end + 2;
  }
  return frames;
}

std::string DefaultModelDir() {
  if (const char* dir = std::getenv("GLM_SOURCE_DIR")) {
    return (fs::path(dir) / "tests/golden/tiny-chat").string();
  }
  std::error_code ec;
  fs::path at = fs::read_symlink("/proc/self/exe", ec).parent_path();
  for (; !ec && !at.empty(); at = at.parent_path()) {
    if (fs::exists(at / "tests/golden/tiny-chat/tokenizer.json")) {
      return (at / "tests/golden/tiny-chat").string();
    }
    if (at == at.root_path()) break;
  }
  return "tests/golden/tiny-chat";
}

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      return false;
    }
    const char* value = argv[++i];
    if (flag == "--model") {
      a->model = value;
      continue;
    }
    if (flag == "--target") {
      const std::string target = value;
      const size_t colon = target.rfind(':');
      in_addr unused{};
      a->target_host = colon == std::string::npos ? "" : target.substr(0, colon);
      if (a->target_host == "localhost") a->target_host = "127.0.0.1";
      a->target_port = colon == std::string::npos ? 0 : std::atoi(target.c_str() + colon + 1);
      if (::inet_pton(AF_INET, a->target_host.c_str(), &unused) != 1 || a->target_port <= 0 ||
          a->target_port > 65535) {
        std::fprintf(stderr, "--target %s: expected IPV4:PORT, e.g. --target 127.0.0.1:8080\n",
                     value);
        return false;
      }
      continue;
    }
    const int n = std::atoi(value);
    if (n <= 0) {
      std::fprintf(stderr, "%s %s: expected a positive integer\n", flag.c_str(), value);
      return false;
    }
    if (flag == "--requests") a->requests = n;
    else if (flag == "--concurrency") a->concurrency = n;
    else if (flag == "--streams") a->streams = n;
    else if (flag == "--tokens") a->tokens = n;
    else if (flag == "--open") a->open = n;
    else if (flag == "--io-threads") a->io_threads = n;
    else if (flag == "--repeats") a->repeats = n;
    else if (flag == "--serve-baseline" && n <= 65535) a->serve_baseline = n;
    else if (flag == "--serve-baseline") {
      std::fprintf(stderr, "--serve-baseline %s: expected a port, 1 to 65535\n", value);
      return false;
    }
    else if (flag == "--serve-seconds") a->serve_seconds = n;
    else {
      std::fprintf(stderr,
                   "unknown flag %s\nusage: glm-gateway-bench [--requests N] [--concurrency C] "
                   "[--streams S] [--tokens T] [--open K] [--model DIR] [--io-threads I] "
                   "[--repeats R] [--serve-baseline PORT [--serve-seconds S] | --target "
                   "HOST:PORT]\n",
                   flag.c_str());
      return false;
    }
  }
  if (a->model.empty()) a->model = DefaultModelDir();
  if (a->serve_baseline > 0 && !a->target_host.empty()) {
    std::fprintf(stderr, "--serve-baseline and --target exclude each other: run two processes\n");
    return false;
  }
  return true;
}

// Raises RLIMIT_NOFILE's soft limit for K streams (each process holds one end of each); returns
// the number of open streams that fit.
int RaiseFileLimit(int wanted_open, int concurrency) {
  const rlim_t slack = static_cast<rlim_t>(2 * concurrency + 256);
  const rlim_t needed = static_cast<rlim_t>(wanted_open) + slack;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur >= needed) return wanted_open;
  lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? needed : std::min(needed, lim.rlim_max);
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) ::getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur >= needed) return wanted_open;
  const int fits = lim.rlim_cur > slack ? static_cast<int>(lim.rlim_cur - slack) : 0;
  std::printf(
      "NOTE: RLIMIT_NOFILE hard limit is %llu, below the %llu descriptors %d open streams need; "
      "phase 3 opens %d (raise it: `ulimit -Hn %llu` as root, or LimitNOFILE= in systemd).\n",
      static_cast<unsigned long long>(lim.rlim_max), static_cast<unsigned long long>(needed),
      wanted_open, fits, static_cast<unsigned long long>(needed));
  return fits;
}

// What the clients send and the backend's token ids; the same in every mode.
struct Workload {
  std::vector<int32_t> prefix, filler;  // BenchBackend's tokens
  size_t num_prompt_ids = 0;
  std::string completion_request;  // POST /v1/completions, token-id prompt, max_tokens 8
  Json chat_body;                  // streamed chat, max_tokens --tokens
  std::string chat_request;        // POST /v1/chat/completions with chat_body
};

Workload MakeWorkload(const tokenizer::Tokenizer& tok, int tokens) {
  Workload w;
  w.prefix = tok.Encode("Fine, a short answer.</think>", false);
  w.filler = tok.Encode(" The quick brown fox jumps over the lazy dog, and then it rests.", false);
  const std::vector<int32_t> prompt_ids =
      tok.Encode("Write a sentence about a fox and a dog.", false);
  w.num_prompt_ids = prompt_ids.size();
  const Json completion_body{{"model", "tiny-chat"}, {"prompt", prompt_ids},
                             {"max_tokens", kCompletionTokens}};
  w.completion_request = PostText("/v1/completions", completion_body.dump());
  const Json messages =
      Json::array({Json{{"role", "system"}, {"content", "Be brief."}},
                   Json{{"role", "user"}, {"content", "Write a sentence about a fox."}}});
  w.chat_body = Json{
      {"model", "tiny-chat"}, {"messages", messages}, {"max_tokens", tokens}, {"stream", true}};
  w.chat_request = PostText("/v1/chat/completions", w.chat_body.dump());
  return w;
}

GatewayOptions BenchGatewayOptions(const Args& args) {
  GatewayOptions options;
  options.served_name = "tiny-chat";
  options.max_model_len = std::max(4096, args.tokens + 1024);  // room for --tokens
  options.version = "bench";
  options.max_in_flight = args.open + 2 * args.concurrency + 64;
  return options;
}

http::ServerOptions BenchServerOptions(const Args& args) {
  http::ServerOptions server_options;
  server_options.io_threads = args.io_threads;
  server_options.max_connections = args.open + 2 * args.concurrency + 64;
  return server_options;
}

absl::StatusOr<ModelFiles> LoadModel(const Args& args) {
  absl::StatusOr<ModelFiles> model = ModelFiles::Load(args.model);
  if (!model.ok()) {
    std::fprintf(stderr, "glm-gateway-bench: %s (pass --model DIR or set GLM_SOURCE_DIR)\n",
                 model.status().ToString().c_str());
  }
  return model;
}

// One request to 127.0.0.1:port, blocking, within cap_s: the (de-chunked) body of a 200 answer.
absl::StatusOr<std::string> FetchOnce(int port, const std::string& request, double cap_s) {
  Conn c;
  c.fd = Connect("127.0.0.1", port);
  if (c.fd < 0) {
    return absl::UnavailableError("connect to 127.0.0.1:" + std::to_string(port) + ": " +
                                  std::strerror(errno));
  }
  const double deadline = Now() + cap_s;
  bool alive = SendAll(c.fd, request);
  int parsed = 0;
  for (;;) {
    parsed = c.Parse();
    if (parsed != 0 || !alive || Now() >= deadline) break;
    pollfd p{c.fd, POLLIN, 0};
    ::poll(&p, 1, 100);
    alive = Drain(c);
  }
  ::close(c.fd);
  if (parsed != 1) {
    return absl::DeadlineExceededError("no complete answer from 127.0.0.1:" +
                                       std::to_string(port) + " within " +
                                       std::to_string(cap_s) + " s");
  }
  if (c.status != 200) {
    return absl::InternalError("answer " + std::to_string(c.status) + ": " + c.body.substr(0, 300));
  }
  return c.body;
}

// --serve-baseline: the baseline server alone on 127.0.0.1:PORT. Its bytes are the in-process
// gateway's answers to one request of each kind (a gateway server on port 0, stopped before the
// baseline starts). Returns when SIGTERM/SIGINT arrives or after --serve-seconds.
int ServeBaseline(const Args& args) {
  // Taken by sigtimedwait below; blocked before any thread starts, so every thread inherits it.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  ::pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<ModelFiles> model = LoadModel(args);
  if (!model.ok()) return 1;
  const Workload work = MakeWorkload(*model->tokenizer, args.tokens);
  Stepper stepper;
  BenchBackend backend(&stepper, work.prefix, work.filler);
  const GatewayOptions options = BenchGatewayOptions(args);
  GatewayMetrics metrics("tiny-chat", options.max_model_len);
  Gateway gateway(options, *model, &backend, nullptr, &metrics, Clock::Real());
  http::ServerOptions server_options = BenchServerOptions(args);

  absl::StatusOr<std::string> body, stream;
  {
    auto gateway_server = http::Server::Start(
        server_options, [&gateway](std::shared_ptr<http::Exchange> ex) { gateway.Handle(ex); });
    if (!gateway_server.ok()) {
      std::fprintf(stderr, "glm-gateway-bench: cannot start the gateway: %s\n",
                   gateway_server.status().ToString().c_str());
      return 1;
    }
    backend.set_instant(true);
    body = FetchOnce((*gateway_server)->port(), work.completion_request, 10.0);
    backend.set_instant(false);
    if (body.ok()) stream = FetchOnce((*gateway_server)->port(), work.chat_request, 10.0);
    (*gateway_server)->Shutdown(std::chrono::milliseconds(0));
  }
  if (!body.ok() || !stream.ok()) {
    std::fprintf(stderr, "glm-gateway-bench: capturing the gateway's answers failed: %s\n",
                 (body.ok() ? stream.status() : body.status()).ToString().c_str());
    return 1;
  }
  std::vector<std::string> frames = SplitEvents(*stream);
  const size_t num_frames = frames.size();
  BaselineHandler baseline(&stepper);
  baseline.SetBody(*body);
  baseline.SetFrames(std::move(frames));

  server_options.listen = "127.0.0.1:" + std::to_string(args.serve_baseline);
  auto server = http::Server::Start(
      server_options, [&baseline](std::shared_ptr<http::Exchange> ex) { baseline.Handle(ex); });
  if (!server.ok()) {
    std::fprintf(stderr, "glm-gateway-bench: cannot serve the baseline: %s\n",
                 server.status().ToString().c_str());
    return 1;
  }
  std::printf("glm-gateway-bench: baseline on 127.0.0.1:%d (%d I/O threads) for at most %d s, "
              "until SIGTERM/SIGINT: POST /v1/completions -> the gateway's %zu-byte answer; any "
              "other request -> the gateway's stream of --tokens %d, %zu SSE frames (%zu bytes), "
              "one per backend step, unthrottled\n",
              (*server)->port(), args.io_threads, args.serve_seconds, body->size(), args.tokens,
              num_frames, stream->size());
  std::fflush(stdout);

  const double started = Now();
  const double deadline = started + args.serve_seconds;
  std::string why = "--serve-seconds passed";
  for (double left = deadline - Now(); left > 0; left = deadline - Now()) {
    timespec wait{};
    wait.tv_sec = static_cast<time_t>(left);
    wait.tv_nsec = static_cast<long>((left - static_cast<double>(wait.tv_sec)) * 1e9);
    const int sig = ::sigtimedwait(&stop_signals, nullptr, &wait);
    if (sig > 0) {
      why = sig == SIGTERM ? "SIGTERM" : "SIGINT";
      break;
    }
    if (errno != EINTR) break;  // EAGAIN: the deadline
  }
  std::printf("glm-gateway-bench: baseline stopped (%s) after %.1f s\n", why.c_str(),
              Now() - started);
  std::fflush(stdout);
  (*server)->Shutdown(std::chrono::milliseconds(0));
  stepper.Stop();
  return 0;
}

// --target: phases 1 and 2's load against an external server, the client in this process.
// Returns 1 when a request failed or a run hit its cap (the figures are printed all the same).
int RunTarget(const Args& args) {
  absl::StatusOr<ModelFiles> model = LoadModel(args);
  if (!model.ok()) return 1;
  const Workload work = MakeWorkload(*model->tokenizer, args.tokens);
  const std::string where = args.target_host + ":" + std::to_string(args.target_port);

  std::printf("glm-gateway-bench: machine: %ld CPUs (nproc), %s\n", ::sysconf(_SC_NPROCESSORS_ONLN),
              CpuModel().c_str());
  std::printf("parameters: --target %s --requests %d --concurrency %d --streams %d --tokens %d "
              "--repeats %d --model %s\n",
              where.c_str(), args.requests, args.concurrency, args.streams, args.tokens,
              args.repeats, args.model.c_str());
  std::printf("server: external (its CPU is not measured); client: this process, one epoll "
              "thread\n\n");
  std::fflush(stdout);
  Json figures;
  figures["machine"] = {{"nproc", ::sysconf(_SC_NPROCESSORS_ONLN)}, {"cpu", CpuModel()}};
  figures["params"] = {{"target", where},         {"requests", args.requests},
                       {"concurrency", args.concurrency}, {"streams", args.streams},
                       {"tokens", args.tokens},   {"repeats", args.repeats}};

  bool failed = false;
  std::string last_body;
  // A warm-up, then `repeats` measured runs; `units` per completed request (1, or T tokens).
  auto measure = [&](const std::string& request, int total, bool stream, double units) {
    Runs runs;
    const int warm = std::max(1, std::min(200, total / 10));
    const Json w = RunLoad(args.target_host, args.target_port, request, warm, args.concurrency,
                           stream, kLoadCapS);
    WarnIfFailed(where + " (warm-up)", w);
    for (int i = 0; i < args.repeats; ++i) {
      const Json r = RunLoad(args.target_host, args.target_port, request, total,
                             args.concurrency, stream, kLoadCapS);
      runs.Add(r, units, -1.0);
      WarnIfFailed(where, r);
      last_body = r["last_body"].get<std::string>();
    }
    failed = failed || runs.errors > 0 || runs.capped || runs.completed == 0;
    return runs;
  };

  // 1. Per request.
  const Runs r1 = measure(work.completion_request, args.requests, false, 1.0);
  std::printf("1. per request: %d x POST /v1/completions (%zu prompt ids, max_tokens %d, %zu-byte "
              "answer), %d keep-alive connections; median of %d run(s)\n",
              args.requests, work.num_prompt_ids, kCompletionTokens, last_body.size(),
              args.concurrency, args.repeats);
  std::printf("   %-22s %10s %9s %9s %7s\n", "", "req/s", "p50 ms", "p99 ms", "errors");
  std::printf("   %-22s %10.0f %9.3f %9.3f %7d\n\n", where.c_str(), Median(r1.rates), r1.P(0.50),
              r1.P(0.99), r1.errors);
  std::fflush(stdout);
  figures["per_request"] = {{"target", r1.ToJson("rps", nullptr)},
                            {"answer_bytes", last_body.size()}};

  // 2. Per streamed token.
  const Runs r2 = measure(work.chat_request, args.streams, true, static_cast<double>(args.tokens));
  const double events_per_stream = r2.completed > 0 ? r2.events / r2.completed : 0.0;
  std::printf("2. per streamed token: %d x streamed chat, %d tokens each (%.1f SSE events, %zu "
              "bytes per stream at the client); median of %d run(s)\n",
              args.streams, args.tokens, events_per_stream, last_body.size(), args.repeats);
  std::printf("   %-22s %10s %12s %12s %15s %15s %7s\n", "", "tokens/s", "stream p50",
              "stream p99", "1st event p50", "event gap p50", "errors");
  std::printf("   %-22s %10.0f %9.2f ms %9.2f ms %12.3f ms %12.3f ms %7d\n", where.c_str(),
              Median(r2.rates), r2.P(0.50), r2.P(0.99), r2.FirstEventP(0.50), r2.GapP(0.50),
              r2.errors);
  std::printf("   p99: first event %.3f ms, event gap %.3f ms\n", r2.FirstEventP(0.99),
              r2.GapP(0.99));
  std::fflush(stdout);
  figures["per_token"] = {{"target", r2.ToJson("tokens_per_s", nullptr)},
                          {"events_per_stream", events_per_stream},
                          {"bytes_per_stream", last_body.size()}};
  figures["ok"] = !failed;
  std::printf("%s", Line(figures).c_str());
  std::fflush(stdout);
  return failed ? 1 : 0;
}

int Main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) return 2;
  if (args.serve_baseline > 0) return ServeBaseline(args);
  if (!args.target_host.empty()) return RunTarget(args);
  const int wanted_open = args.open;
  args.open = RaiseFileLimit(args.open, args.concurrency);

  // The client process, forked while this one has a single thread.
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    std::perror("socketpair");
    return 1;
  }
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {
    ::close(pair[0]);
    ClientMain(pair[1]);
  }
  ::close(pair[1]);
  ClientProcess client(pair[0], pid);

  absl::StatusOr<ModelFiles> model = LoadModel(args);
  if (!model.ok()) return 1;
  const Workload work = MakeWorkload(*model->tokenizer, args.tokens);

  Stepper stepper;
  BenchBackend backend(&stepper, work.prefix, work.filler);
  const GatewayOptions options = BenchGatewayOptions(args);
  GatewayMetrics metrics("tiny-chat", options.max_model_len);
  Gateway gateway(options, *model, &backend, nullptr, &metrics, Clock::Real());
  BaselineHandler baseline(&stepper);

  const http::ServerOptions server_options = BenchServerOptions(args);
  auto gateway_server = http::Server::Start(
      server_options, [&gateway](std::shared_ptr<http::Exchange> ex) { gateway.Handle(ex); });
  auto baseline_server = http::Server::Start(
      server_options, [&baseline](std::shared_ptr<http::Exchange> ex) { baseline.Handle(ex); });
  if (!gateway_server.ok() || !baseline_server.ok()) {
    std::fprintf(stderr, "glm-gateway-bench: cannot start the servers: %s %s\n",
                 gateway_server.status().ToString().c_str(),
                 baseline_server.status().ToString().c_str());
    return 1;
  }
  const int gateway_port = (*gateway_server)->port();
  const int baseline_port = (*baseline_server)->port();

  std::printf("glm-gateway-bench: machine: %ld CPUs (nproc), %s\n", ::sysconf(_SC_NPROCESSORS_ONLN),
              CpuModel().c_str());
  std::printf("parameters: --requests %d --concurrency %d --streams %d --tokens %d --open %d "
              "--io-threads %d --repeats %d --model %s\n",
              args.requests, args.concurrency, args.streams, args.tokens, args.open,
              args.io_threads, args.repeats, args.model.c_str());
  std::printf("servers: this process (%d I/O threads each + 1 backend step thread); client: a "
              "forked process, one epoll thread\n\n",
              args.io_threads);
  std::fflush(stdout);

  Json figures;
  figures["machine"] = {{"nproc", ::sysconf(_SC_NPROCESSORS_ONLN)}, {"cpu", CpuModel()}};
  figures["params"] = {{"requests", args.requests}, {"concurrency", args.concurrency},
                       {"streams", args.streams},   {"tokens", args.tokens},
                       {"open", args.open},         {"open_wanted", wanted_open},
                       {"io_threads", args.io_threads}, {"repeats", args.repeats}};

  // One load run by the client and the server CPU it cost; `units` per completed request
  // (1 request, or T tokens).
  auto run = [&](int port, const std::string& request, int total, bool stream, double units,
                 Runs* into) {
    const double cpu0 = CpuSeconds();
    client.Send(Json{{"cmd", "load"}, {"port", port}, {"request", request}, {"total", total},
                     {"concurrency", args.concurrency}, {"stream", stream},
                     {"cap_s", kLoadCapS}});
    const Json r = client.Receive();
    const double cpu_s = CpuSeconds() - cpu0;
    if (into == nullptr) return r;  // warm-up
    into->Add(r, units, cpu_s);
    WarnIfFailed("port " + std::to_string(port), r);
    return r;
  };
  // Warm-up of both servers, then `repeats` measured runs, gateway and baseline interleaved.
  auto compare = [&](const std::string& request, int total, bool stream, double units,
                     const std::function<void(const Json&)>& prepare_baseline, Runs* gw,
                     Runs* base) {
    const int warm = std::max(1, std::min(200, total / 10));
    prepare_baseline(run(gateway_port, request, warm, stream, units, nullptr));
    run(baseline_port, request, warm, stream, units, nullptr);
    for (int i = 0; i < args.repeats; ++i) {
      run(gateway_port, request, total, stream, units, gw);
      run(baseline_port, request, total, stream, units, base);
    }
  };

  // 1. Per request.
  const std::string& completion_request = work.completion_request;
  backend.set_instant(true);
  Runs gw1, base1;
  size_t answer_bytes = 0;
  compare(completion_request, args.requests, false, 1.0,
          [&](const Json& r) {
            answer_bytes = r["last_body"].get<std::string>().size();
            baseline.SetBody(r["last_body"].get<std::string>());
          },
          &gw1, &base1);
  std::printf("1. per request: %d x POST /v1/completions (%zu prompt ids, max_tokens %d, %zu-byte "
              "answer), %d keep-alive connections; median of %d run(s)\n",
              args.requests, work.num_prompt_ids, kCompletionTokens, answer_bytes, args.concurrency,
              args.repeats);
  std::printf("   %-22s %10s %9s %9s %14s\n", "", "req/s", "p50 ms", "p99 ms", "server CPU/req");
  for (const auto& [name, r] : {std::pair<const char*, Runs*>{"gateway", &gw1},
                                {"baseline (fixed body)", &base1}}) {
    std::printf("   %-22s %10.0f %9.3f %9.3f %11.1f us\n", name, Median(r->rates), r->P(0.50),
                r->P(0.99), Median(r->cpu_us));
  }
  const double rps_ratio = Median(gw1.rates) / Median(base1.rates);
  const double added_p50_us = (gw1.P(0.50) - base1.P(0.50)) * 1e3;
  const double added_p99_us = (gw1.P(0.99) - base1.P(0.99)) * 1e3;
  const double added_cpu_us = Median(gw1.cpu_us) - Median(base1.cpu_us);
  std::printf("   gateway/baseline req/s %.2f; added latency p50 %+.0f us, p99 %+.0f us; added "
              "server CPU %.1f us/request\n\n",
              rps_ratio, added_p50_us, added_p99_us, added_cpu_us);
  std::fflush(stdout);
  figures["per_request"] = {{"gateway", gw1.ToJson("rps", "cpu_us_per_request")},
                            {"baseline", base1.ToJson("rps", "cpu_us_per_request")},
                            {"answer_bytes", answer_bytes},
                            {"rps_ratio", rps_ratio},
                            {"added_p50_us", added_p50_us},
                            {"added_p99_us", added_p99_us},
                            {"added_cpu_us_per_request", added_cpu_us}};

  // 2. Per streamed token.
  const std::string& chat_request = work.chat_request;
  backend.set_instant(false);
  Runs gw2, base2;
  size_t stream_bytes = 0;
  compare(chat_request, args.streams, true, static_cast<double>(args.tokens),
          [&](const Json& r) {
            std::vector<std::string> frames = SplitEvents(r["last_body"].get<std::string>());
            for (const std::string& f : frames) stream_bytes += f.size();
            baseline.SetFrames(std::move(frames));
          },
          &gw2, &base2);
  const double events_per_stream = gw2.completed > 0 ? gw2.events / gw2.completed : 0.0;
  std::printf("2. per streamed token: %d x streamed chat (tiny-chat template), %d tokens each, one "
              "event per token (%.1f SSE events, %zu bytes per stream); median of %d run(s)\n",
              args.streams, args.tokens, events_per_stream, stream_bytes, args.repeats);
  std::printf("   %-22s %10s %12s %14s %16s\n", "", "tokens/s", "stream p50", "stream p99",
              "server CPU/token");
  for (const auto& [name, r] : {std::pair<const char*, Runs*>{"gateway", &gw2},
                                {"baseline (same frames)", &base2}}) {
    std::printf("   %-22s %10.0f %9.2f ms %11.2f ms %13.2f us\n", name, Median(r->rates),
                r->P(0.50), r->P(0.99), Median(r->cpu_us));
  }
  std::printf("   at the client, first event p50/p99: gateway %.2f/%.2f ms, baseline %.2f/%.2f ms; "
              "gap between events p50/p99: gateway %.3f/%.3f ms, baseline %.3f/%.3f ms\n",
              gw2.FirstEventP(0.50), gw2.FirstEventP(0.99), base2.FirstEventP(0.50),
              base2.FirstEventP(0.99), gw2.GapP(0.50), gw2.GapP(0.99), base2.GapP(0.50),
              base2.GapP(0.99));
  const double tps_ratio = Median(gw2.rates) / Median(base2.rates);
  const double added_token_cpu_us = Median(gw2.cpu_us) - Median(base2.cpu_us);
  std::printf("   gateway/baseline tokens/s %.2f; added server CPU %.2f us/token\n\n", tps_ratio,
              added_token_cpu_us);
  std::fflush(stdout);
  figures["per_token"] = {{"gateway", gw2.ToJson("tokens_per_s", "cpu_us_per_token")},
                          {"baseline", base2.ToJson("tokens_per_s", "cpu_us_per_token")},
                          {"events_per_stream", events_per_stream},
                          {"bytes_per_stream", stream_bytes},
                          {"tps_ratio", tps_ratio},
                          {"added_cpu_us_per_token", added_token_cpu_us}};

  // 3. Open streams.
  Json hold_body = work.chat_body;
  hold_body["max_tokens"] = 1;
  backend.set_hold(true);
  ::malloc_trim(0);  // freed heap of phases 1-2 goes back, so the delta is the streams' own
  const int64_t rss0 = RssBytes();
  const int64_t streams0 = (*gateway_server)->open_streams();
  client.Send(Json{{"cmd", "open"},
                   {"port", gateway_port},
                   {"request", PostText("/v1/chat/completions", hold_body.dump())},
                   {"total", args.open}});
  const Json opened = client.Receive();
  const int num_open = opened["opened"].get<int>();
  const int64_t rss1 = RssBytes();
  const int64_t server_open = (*gateway_server)->open_streams() - streams0;
  const double idle_cpu0 = CpuSeconds();
  std::this_thread::sleep_for(std::chrono::duration<double>(kIdleS));
  const double idle_cpu_s = CpuSeconds() - idle_cpu0;
  const double released_at = Now();
  backend.set_hold(false);
  stepper.ReleaseHeld();
  const Json drained = client.Receive();
  const double drain_s = drained["t_end"].get<double>() - released_at;
  // The server may lag its client: a write reaches the socket before its completion handler
  // retires the stream. Its count back to where it was is the server's own drain.
  while ((*gateway_server)->open_streams() > streams0 && Now() - released_at < kDrainCapS) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double server_drain_s = Now() - released_at;
  const int64_t server_left = (*gateway_server)->open_streams() - streams0;
  const double bytes_per_stream =
      num_open > 0 ? static_cast<double>(rss1 - rss0) / num_open : 0.0;
  std::printf("3. open streams: %d SSE chat streams held open by the backend (wanted %d)\n",
              args.open, wanted_open);
  std::printf("   opened %d in %.2f s (server counts %lld open); errors %d%s%s\n", num_open,
              opened["open_s"].get<double>(), static_cast<long long>(server_open),
              opened["errors"].get<int>(),
              opened["first_error"].get<std::string>().empty() ? "" : ": ",
              opened["first_error"].get<std::string>().c_str());
  std::printf("   server RSS %.1f MiB -> %.1f MiB: %.0f bytes per open stream\n",
              static_cast<double>(rss0) / (1 << 20), static_cast<double>(rss1) / (1 << 20),
              bytes_per_stream);
  std::printf("   server CPU while they idle %.0f s: %.1f ms (%.2f%% of one core)\n", kIdleS,
              idle_cpu_s * 1e3, idle_cpu_s / kIdleS * 100);
  std::printf("   release (1 token, then finish): %d ended at the client after %.1f ms; the "
              "server retired them after %.1f ms (%lld left)\n",
              drained["finished"].get<int>(), drain_s * 1e3, server_drain_s * 1e3,
              static_cast<long long>(server_left));
  figures["open_streams"] = {{"opened", num_open},
                             {"open_s", opened["open_s"]},
                             {"errors", opened["errors"]},
                             {"rss_before_bytes", rss0},
                             {"rss_open_bytes", rss1},
                             {"bytes_per_stream", bytes_per_stream},
                             {"idle_cpu_ms", idle_cpu_s * 1e3},
                             {"drain_ms", drain_s * 1e3},
                             {"server_drain_ms", server_drain_s * 1e3},
                             {"finished", drained["finished"]}};

  (*gateway_server)->Shutdown(std::chrono::milliseconds(0));
  (*baseline_server)->Shutdown(std::chrono::milliseconds(0));
  stepper.Stop();
  std::printf("%s", Line(figures).c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace glm::gateway

int main(int argc, char** argv) { return glm::gateway::Main(argc, argv); }
