// Fuzzing a gRPC service in process: one fuzz input is one call of one RPC with a hostile
// request, made through a real gRPC server (so the bytes go through the server's own parsing and
// the handler gets a real ServerContext) over its in-process channel (no socket).
//
// Input encoding (DecodeServiceFuzzInput):
//   binary  byte 0 picks the method: byte0 % method_count, in the service descriptor's order;
//           the rest is the request message in the protobuf wire format.
//   text    "#MethodName\n" then the request in protobuf text format. The committed seeds use
//           this form, so a person can read and edit them; the fuzzer mutates both forms.
// An input whose request does not parse is skipped (gRPC would refuse it before any handler).
//
// ServiceFuzzer owns the server; build one per process (a function-local static) and call it
// from LLVMFuzzerTestOneInput. Not thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"

namespace glm::rpc {

struct ServiceFuzzInput {
  const google::protobuf::MethodDescriptor* method = nullptr;
  std::unique_ptr<google::protobuf::Message> request;  // of method->input_type()
};

// Decodes `data` as described above; nullopt when the request does not parse or the text form
// names no method of `service`.
std::optional<ServiceFuzzInput> DecodeServiceFuzzInput(
    const google::protobuf::ServiceDescriptor& service, const uint8_t* data, size_t size);

struct ServiceCallResult {
  grpc::Status status;
  int responses = 0;  // messages the client read before the call ended
};

class ServiceFuzzer {
 public:
  // Serves `service` (not owned; outlives this) on an in-process server.
  ServiceFuzzer(grpc::Service* service, const google::protobuf::ServiceDescriptor* descriptor);
  ~ServiceFuzzer();

  const google::protobuf::ServiceDescriptor& descriptor() const { return *descriptor_; }

  // Calls input.method with input.request (unary and server-streaming alike: one request, then
  // half-close) and reads up to `max_responses` replies; then the client cancels. `deadline`
  // bounds the whole call (streams that run until cancelled end there).
  ServiceCallResult Call(const ServiceFuzzInput& input, std::chrono::milliseconds deadline,
                         int max_responses);

  // Shuts the server down (before the service it serves goes away).
  void Shutdown();

 private:
  const google::protobuf::ServiceDescriptor* descriptor_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

// A loopback TCP port that refuses connections for the life of the process: bound, never
// listening, so nothing else takes it. Fuzz targets point every address a request names (peers,
// rendezvous, MTU probes) here, so that a hostile request never reaches the network.
int RefusingLoopbackPort();

}  // namespace glm::rpc
