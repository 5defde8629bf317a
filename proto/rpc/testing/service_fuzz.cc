#include "proto/rpc/testing/service_fuzz.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>

#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/generic/generic_stub.h"

namespace glm::rpc {
namespace {

std::unique_ptr<google::protobuf::Message> NewRequest(
    const google::protobuf::MethodDescriptor* method) {
  const google::protobuf::Message* prototype =
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(method->input_type());
  return prototype == nullptr ? nullptr : std::unique_ptr<google::protobuf::Message>(prototype->New());
}

// Text the fuzzer mutated rarely parses; its errors are expected, not worth a log line each.
class SilentErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
};

// Waits for the one operation in flight on `cq`; returns its ok bit.
bool Await(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  if (!cq->Next(&tag, &ok)) return false;
  return ok;
}

}  // namespace

std::optional<ServiceFuzzInput> DecodeServiceFuzzInput(
    const google::protobuf::ServiceDescriptor& service, const uint8_t* data, size_t size) {
  if (size == 0 || service.method_count() == 0) return std::nullopt;
  ServiceFuzzInput input;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (bytes[0] == '#') {
    const size_t eol = bytes.find('\n');
    const std::string name(bytes.substr(1, eol == std::string_view::npos ? bytes.size() - 1
                                                                         : eol - 1));
    input.method = service.FindMethodByName(name);
    if (input.method == nullptr) return std::nullopt;
    input.request = NewRequest(input.method);
    if (input.request == nullptr) return std::nullopt;
    const std::string text(eol == std::string_view::npos ? std::string_view()
                                                         : bytes.substr(eol + 1));
    google::protobuf::TextFormat::Parser parser;
    SilentErrors errors;
    parser.RecordErrorsTo(&errors);
    parser.AllowPartialMessage(true);
    if (!parser.ParseFromString(text, input.request.get())) return std::nullopt;
    return input;
  }
  input.method = service.method(static_cast<unsigned char>(bytes[0]) % service.method_count());
  input.request = NewRequest(input.method);
  if (input.request == nullptr ||
      !input.request->ParseFromArray(bytes.data() + 1, static_cast<int>(bytes.size() - 1))) {
    return std::nullopt;
  }
  return input;
}

ServiceFuzzer::ServiceFuzzer(grpc::Service* service,
                             const google::protobuf::ServiceDescriptor* descriptor)
    : descriptor_(descriptor) {
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  // gRPC's own cap is 4 MiB; the daemons raise theirs to 16 MiB (rpc::LimitRequestSizes).
  builder.SetMaxReceiveMessageSize(16 << 20);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) std::abort();  // no port to bind: this cannot fail but by a bug here
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(16 << 20);
  channel_ = server_->InProcessChannel(args);
}

ServiceFuzzer::~ServiceFuzzer() { Shutdown(); }

void ServiceFuzzer::Shutdown() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server_.reset();
}

ServiceCallResult ServiceFuzzer::Call(const ServiceFuzzInput& input,
                                      std::chrono::milliseconds deadline, int max_responses) {
  ServiceCallResult result;
  std::string wire;
  input.request->SerializeToString(&wire);
  grpc::Slice slice(wire);
  grpc::ByteBuffer request(&slice, 1);

  grpc::GenericStub stub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  grpc::CompletionQueue cq;
  const std::string path = "/" + descriptor_->full_name() + "/" + input.method->name();
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(&ctx, path, &cq);
  void* const tag = reinterpret_cast<void*>(1);
  call->StartCall(tag);
  if (Await(&cq)) {
    call->Write(request, tag);
    if (Await(&cq)) {
      call->WritesDone(tag);
      Await(&cq);
    }
    grpc::ByteBuffer response;
    while (result.responses < max_responses) {
      call->Read(&response, tag);
      if (!Await(&cq)) break;
      ++result.responses;
    }
    if (result.responses >= max_responses) ctx.TryCancel();
  }
  call->Finish(&result.status, tag);
  Await(&cq);
  cq.Shutdown();
  void* ignored_tag = nullptr;
  bool ignored_ok = false;
  while (cq.Next(&ignored_tag, &ignored_ok)) {
  }
  return result;
}

int RefusingLoopbackPort() {
  static const int port = [] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      std::abort();  // no loopback: the fuzz target cannot keep requests off the network
    }
    return static_cast<int>(ntohs(addr.sin_port));  // fd stays open: the port stays ours
  }();
  return port;
}

}  // namespace glm::rpc
