# MLA attention (prefill and absorbed decode) and the fp8 KV cache ops, included by
# CMakeLists.txt here when the CUDA parts build. The engine's CUDA backend adapts its views to
# these launchers (engine/backend/cuda/cuda_ops_attention.cc, cuda_ops_kv_fp8.cc).
add_library(glm_kernels_attention mla_attention.cu kv_fp8.cu)
target_link_libraries(glm_kernels_attention PUBLIC glm_kernels absl::function_ref)
target_compile_options(glm_kernels_attention PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills>)
set_target_properties(glm_kernels_attention PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)

# The narrow-weight Linear's fp32 -> bf16 activation conversion (convert_bf16.h), beside the
# GEMMs it feeds.
target_sources(glm_kernels_gemm PRIVATE convert_bf16.cu)
