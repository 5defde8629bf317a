#include "engine/backend/cuda/cublaslt_matmul.h"

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace glm::engine::cuda {
namespace {

absl::Status LtStatus(cublasStatus_t s, std::string_view what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(ToAbsl(what), " failed: ", cublasLtGetStatusName(s),
                                          " (", cublasLtGetStatusString(s), ")"));
}

#define GLM_LT_RETURN_IF_ERROR(expr) GLM_RETURN_IF_ERROR(LtStatus((expr), #expr))

// Largest power of two (<= 256 bytes) dividing the pointer, the row stride and the batch stride
// in bytes: what cuBLASLt may assume about every row / batch item it touches.
uint32_t Alignment(const void* p, int64_t ld, int64_t batch_stride) {
  uint64_t v = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(ld) * sizeof(float) |
               static_cast<uint64_t>(batch_stride) * sizeof(float) | 256u;
  return static_cast<uint32_t>(v & (~v + 1));
}

std::string ShapeText(const GemmShape& s) {
  return absl::StrCat("m=", s.m, " n=", s.n, " k=", s.k, " x_ld=", s.x_ld, " w_ld=", s.w_ld,
                      " y_ld=", s.y_ld, " batch=", s.batch, " strides=", s.x_batch_stride, "/",
                      s.w_batch_stride, "/", s.y_batch_stride);
}

}  // namespace

bool LtMatmul::Key::operator==(const Key& o) const {
  return s.m == o.s.m && s.n == o.s.n && s.k == o.s.k && s.x_ld == o.s.x_ld &&
         s.w_ld == o.s.w_ld && s.y_ld == o.s.y_ld && s.batch == o.s.batch &&
         s.x_batch_stride == o.s.x_batch_stride && s.w_batch_stride == o.s.w_batch_stride &&
         s.y_batch_stride == o.s.y_batch_stride && align_x == o.align_x &&
         align_w == o.align_w && align_y == o.align_y;
}

size_t LtMatmul::KeyHash::operator()(const Key& k) const {
  size_t h = 0;
  auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (int64_t v : {k.s.m, k.s.n, k.s.k, k.s.x_ld, k.s.w_ld, k.s.y_ld, k.s.batch,
                    k.s.x_batch_stride, k.s.w_batch_stride, k.s.y_batch_stride}) {
    mix(static_cast<uint64_t>(v));
  }
  mix((uint64_t{k.align_x} << 40) | (uint64_t{k.align_w} << 20) | k.align_y);
  return h;
}

absl::StatusOr<std::unique_ptr<LtMatmul>> LtMatmul::Create(size_t workspace_bytes,
                                                          size_t max_plans) {
  if (max_plans == 0) {
    return absl::InvalidArgumentError("LtMatmul: max_plans must be at least 1");
  }
  auto m = std::unique_ptr<LtMatmul>(new LtMatmul());
  m->max_plans_ = max_plans;
  GLM_LT_RETURN_IF_ERROR(cublasLtCreate(&m->handle_));
  if (workspace_bytes > 0) {
    const cudaError_t err = cudaMalloc(&m->workspace_, workspace_bytes);
    if (err != cudaSuccess) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuBLASLt workspace: cudaMalloc(", workspace_bytes, ") failed: ",
          cudaGetErrorString(err), "; free GPU memory or use another device"));
    }
    m->workspace_bytes_ = workspace_bytes;
  }
  return m;
}

LtMatmul::~LtMatmul() {
  for (auto& [key, entry] : plans_) Destroy(entry.plan);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

void LtMatmul::Destroy(Plan& p) {
  if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c != nullptr) cublasLtMatrixLayoutDestroy(p.c);
  if (p.op != nullptr) cublasLtMatmulDescDestroy(p.op);
  p = Plan{};
}

absl::StatusOr<const LtMatmul::Plan*> LtMatmul::GetPlan(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.pos);
    return &it->second.plan;
  }
  const GemmShape& s = key.s;
  Plan p;
  // Destroys the half-built plan on every error path.
  struct Guard {
    Plan* p;
    ~Guard() {
      if (p != nullptr) Destroy(*p);
    }
  } guard{&p};
  GLM_LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  GLM_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &trans_a, sizeof(trans_a)));
  GLM_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &trans_b, sizeof(trans_b)));
  // Column-major: A = W stored [k, n], B = X stored [k, m], C = D = Y stored [n, m].
  GLM_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_32F, s.k, s.n, s.w_ld));
  GLM_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_32F, s.k, s.m, s.x_ld));
  GLM_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, s.n, s.m, s.y_ld));
  if (s.batch > 1) {
    const int32_t batch = static_cast<int32_t>(s.batch);
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {
        {p.a, s.w_batch_stride}, {p.b, s.x_batch_stride}, {p.c, s.y_batch_stride}};
    for (const auto& [layout, stride] : layouts) {
      GLM_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
      GLM_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }
  cublasLtMatmulPreference_t pref = nullptr;
  GLM_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_w},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_x},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_y},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_y}};
  for (const auto& [attr, value] : aligns) {
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
    }
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result,
                                        &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    GLM_RETURN_IF_ERROR(LtStatus(st, "cublasLtMatmulAlgoGetHeuristic"));
    return absl::UnimplementedError(absl::StrCat(
        "cuBLASLt has no fp32 algorithm for GEMM ", ShapeText(s), " alignments x/w/y=",
        key.align_x, "/", key.align_w, "/", key.align_y,
        " bytes; this view layout is not supported by the CUDA backend"));
  }
  p.algo = result.algo;
  guard.p = nullptr;
  if (plans_.size() >= max_plans_) {
    auto victim = plans_.find(lru_.back());
    Destroy(victim->second.plan);
    plans_.erase(victim);
    lru_.pop_back();
  }
  lru_.push_front(key);
  ++plans_made_;
  return &plans_.emplace(key, Entry{p, lru_.begin()}).first->second.plan;
}

absl::Status LtMatmul::Run(const GemmShape& s, const float* x, const float* w, float* y,
                           bool accumulate, cudaStream_t stream) {
  if (s.m <= 0 || s.n <= 0 || s.k <= 0 || s.batch <= 0 || s.batch > 0x7fffffff ||
      s.x_ld < s.k || s.w_ld < s.k || s.y_ld < s.n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Linear (cuBLASLt): bad GEMM ", ShapeText(s),
        " (need m, n, k, batch > 0, x_ld >= k, w_ld >= k, y_ld >= n)"));
  }
  Key key;
  key.s = s;
  if (s.batch == 1) key.s.x_batch_stride = key.s.w_batch_stride = key.s.y_batch_stride = 0;
  key.align_x = Alignment(x, s.x_ld, key.s.x_batch_stride);
  key.align_w = Alignment(w, s.w_ld, key.s.w_batch_stride);
  key.align_y = Alignment(y, s.y_ld, key.s.y_batch_stride);
  GLM_ASSIGN_OR_RETURN(const Plan* p, GetPlan(key));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  return Annotate(LtStatus(cublasLtMatmul(handle_, p->op, &alpha, w, p->a, x, p->b, &beta, y,
                                          p->c, y, p->c, &p->algo, workspace_, workspace_bytes_,
                                          stream),
                           "cublasLtMatmul"),
                  ShapeText(s));
}

}  // namespace glm::engine::cuda
