# Included by engine/CMakeLists.txt when engine.cc exists: the engine API (glm_engine), the
# glm-run tool, and their tests.
add_library(glm_engine ${CMAKE_CURRENT_LIST_DIR}/engine.cc)
target_include_directories(glm_engine PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(glm_engine PUBLIC glm_sched glm_model_config glm_common absl::status
  absl::statusor PRIVATE absl::strings)
if(TARGET glm_model)
  target_link_libraries(glm_engine PRIVATE glm_model)
  target_compile_definitions(glm_engine PRIVATE GLM_ENGINE_HAVE_MODEL=1)
endif()
# Distributed replicas (engine/pipeline): the head's PipelinedModel and the followers' loop.
target_link_libraries(glm_engine PRIVATE glm_pipeline)
glm_set_warnings(glm_engine)

glm_add_test(NAME engine_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/engine_test.cc LIBS glm_engine)

add_executable(glm-run ${CMAKE_CURRENT_LIST_DIR}/glm_run.cc)
target_link_libraries(glm-run PRIVATE glm_engine glm_common CLI11::CLI11 absl::strings)
if(TARGET glm_tokenizer)
  target_link_libraries(glm-run PRIVATE glm_tokenizer)
  target_compile_definitions(glm-run PRIVATE GLM_RUN_HAVE_TOKENIZER=1)
endif()
glm_set_warnings(glm-run)

# Integration against the transformers golden fixtures (tests/golden/tiny-*), through the Engine
# and through the glm-run binary.
if(TARGET glm_model)
  glm_add_test(NAME engine_golden_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/engine_golden_test.cc
    LIBS glm_engine glm_model nlohmann_json::nlohmann_json LABELS golden)
  target_compile_definitions(engine_golden_test PRIVATE
    GLM_GOLDEN_DIR="${PROJECT_SOURCE_DIR}/tests/golden"
    GLM_RUN_BINARY="$<TARGET_FILE:glm-run>")
  add_dependencies(engine_golden_test glm-run)
  # The same fixtures through the cuda backend with bf16 / fp8 Linear weights.
  glm_add_test(NAME engine_golden_narrow_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/engine_golden_narrow_test.cc
    LIBS glm_engine glm_model nlohmann_json::nlohmann_json LABELS golden)
  target_compile_definitions(engine_golden_narrow_test PRIVATE
    GLM_GOLDEN_DIR="${PROJECT_SOURCE_DIR}/tests/golden")
endif()

# The golden fixtures through an fp8 KV cache (engine/backend/kv_fp8_layout.h) on cpu (CI) and
# cuda: logits close to the fp32-KV run, greedy tokens, cuda fp8 vs cpu fp8.
if(TARGET glm_model)
  glm_add_test(NAME engine_kv_fp8_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/engine_kv_fp8_test.cc
    LIBS glm_engine glm_model nlohmann_json::nlohmann_json LABELS golden)
  target_compile_definitions(engine_kv_fp8_test PRIVATE
    GLM_GOLDEN_DIR="${PROJECT_SOURCE_DIR}/tests/golden")
endif()

# A replica spread over TP x PP ranks (engine/pipeline): one thread per rank, Gloo on 127.0.0.1,
# against the single-process engine on the golden fixtures.
if(TARGET glm_model)
  glm_add_test(NAME engine_pipeline_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/engine_pipeline_test.cc
    LIBS glm_engine glm_model glm_dist nlohmann_json::nlohmann_json LABELS golden)
  target_compile_definitions(engine_pipeline_test PRIVATE
    GLM_GOLDEN_DIR="${PROJECT_SOURCE_DIR}/tests/golden")
endif()

# TP over NCCL on real GPUs (label gpu; skips without 2 GPUs or GLM_NCCL_LIBRARY): TP 2 = the
# single-GPU greedy tokens, two ranks on one GPU take the host path, a killed rank fails the head
# within seconds. Links no NCCL and no CUDA (tools/gpu/run_multigpu.sh).
if(TARGET glm_model)
  glm_add_test(NAME engine_nccl_gpu_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/engine_nccl_gpu_test.cc
    LIBS glm_engine glm_model glm_dist ${CMAKE_DL_LIBS} nlohmann_json::nlohmann_json LABELS gpu)
  target_compile_definitions(engine_nccl_gpu_test PRIVATE
    GLM_GOLDEN_DIR="${PROJECT_SOURCE_DIR}/tests/golden")
endif()
