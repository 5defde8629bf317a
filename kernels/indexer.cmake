# The DSA lightning indexer (dsa_indexer.h): scores + top-k select; included by CMakeLists.txt here
# in CUDA builds. The CUDA backend's IndexerTopK (engine/backend/cuda/cuda_indexer.cc) runs it.
add_library(glm_kernels_dsa_indexer dsa_indexer.cu)
target_link_libraries(glm_kernels_dsa_indexer PUBLIC glm_kernels glm_common)
target_compile_options(glm_kernels_dsa_indexer PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills>)
set_target_properties(glm_kernels_dsa_indexer PROPERTIES CUDA_STANDARD 20
  CUDA_STANDARD_REQUIRED ON)

# Launcher input checks (no GPU needed) and the select paths against a host reference of the tie
# rules (GPU; skip without one). The whole op against the CPU backend: cuda_indexer_test.
glm_add_test(NAME dsa_indexer_test SOURCES dsa_indexer_test.cc
  LIBS glm_kernels_dsa_indexer LABELS gpu)
