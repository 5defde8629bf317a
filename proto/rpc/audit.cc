#include "proto/rpc/audit.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "proto/rpc/status_map.h"

namespace glm::rpc {
namespace {

// `value` as a log field value: as is when it is a plain token, else double-quoted with '"' and
// '\' escaped and control characters dropped (an identity or error message cannot forge fields
// or lines).
std::string FieldValue(std::string_view value) {
  bool plain = !value.empty();
  for (char c : value) {
    if (c == ' ' || c == '"' || c == '\\' || c == '=' || static_cast<unsigned char>(c) < 0x20) {
      plain = false;
    }
  }
  if (plain) return std::string(value);
  std::string out = "\"";
  for (char c : value) {
    if (static_cast<unsigned char>(c) < 0x20) continue;
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

std::string FirstProperty(const grpc::AuthContext& auth, const char* name) {
  for (const grpc::string_ref& value : auth.FindPropertyValues(name)) {
    if (value.size() > 0) return std::string(value.data(), value.size());
  }
  return "";
}

class AuditInterceptor : public grpc::experimental::Interceptor {
 public:
  AuditInterceptor(grpc::ServerContextBase* context, std::string action, const std::string* detail)
      : context_(context), action_(std::move(action)), detail_(detail) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS) &&
        context_ != nullptr) {
      AuditLog(*context_, action_, ToAbsl(methods->GetSendStatus()), *detail_);
    }
    methods->Proceed();
  }

 private:
  grpc::ServerContextBase* const context_;
  const std::string action_;
  const std::string* const detail_;  // owned by the factory, which outlives the server
};

class AuditInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  AuditInterceptorFactory(std::vector<std::string> actions, std::string detail)
      : actions_(std::move(actions)), detail_(std::move(detail)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const std::string method = info->method() != nullptr ? info->method() : "";
    const std::string action = method.substr(method.rfind('/') + 1);
    if (std::find(actions_.begin(), actions_.end(), action) == actions_.end()) return nullptr;
    return new AuditInterceptor(info->server_context(), action, &detail_);
  }

 private:
  const std::vector<std::string> actions_;
  const std::string detail_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeAuditInterceptorFactory(
    std::vector<std::string> actions, std::string detail) {
  return std::make_unique<AuditInterceptorFactory>(std::move(actions), std::move(detail));
}

std::string IdentityFromAuthContext(const grpc::AuthContext* auth) {
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "insecure";
  std::string cn = FirstProperty(*auth, "x509_common_name");
  if (!cn.empty()) return cn;
  for (const grpc::string_ref& value : auth->GetPeerIdentity()) {
    if (value.size() > 0) return std::string(value.data(), value.size());
  }
  return "authenticated-without-name";
}

std::string PeerIdentity(const grpc::ServerContextBase& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  return IdentityFromAuthContext(auth.get());
}

std::string FormatAudit(std::string_view action, std::string_view who, std::string_view peer,
                        const absl::Status& outcome, std::string_view detail) {
  std::string line = absl::StrCat("audit action=", FieldValue(action), " who=", FieldValue(who),
                                  " peer=", FieldValue(peer));
  if (outcome.ok()) {
    absl::StrAppend(&line, " outcome=ok");
  } else {
    absl::StrAppend(&line, " outcome=", absl::StatusCodeToString(outcome.code()),
                    " error=", FieldValue(std::string(outcome.message())));
  }
  if (!detail.empty()) absl::StrAppend(&line, " ", std::string(detail));
  return line;
}

void AuditLog(const grpc::ServerContextBase& context, std::string_view action,
              const absl::Status& outcome, std::string_view detail) {
  GLM_LOG_INFO("{}", FormatAudit(action, PeerIdentity(context), context.peer(), outcome, detail));
}

}  // namespace glm::rpc
