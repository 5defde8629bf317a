# glm_add_test(NAME name SOURCES a.cc ... LIBS lib ... [LABELS l ...])
# One GoogleTest binary, discovered by ctest. Tests are hermetic: port 0, temp dirs.
function(glm_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  glm_set_warnings(${T_NAME})
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${T_LABELS}"
    ENVIRONMENT "GLM_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()

# glm_add_fuzzer(NAME name SOURCES a.cc ... LIBS lib ...)
# With GLM_FUZZ a libFuzzer binary; without it, a replay driver that runs the corpus given on the
# command line, so the fuzz entry point is compiled and exercised by ctest on every build.
function(glm_add_fuzzer)
  cmake_parse_arguments(F "" "NAME;CORPUS" "SOURCES;LIBS" ${ARGN})
  add_executable(${F_NAME} ${F_SOURCES})
  target_link_libraries(${F_NAME} PRIVATE ${F_LIBS})
  if(GLM_FUZZ)
    target_link_options(${F_NAME} PRIVATE -fsanitize=fuzzer)
  else()
    target_sources(${F_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests/fuzz/replay_main.cc)
  endif()
  if(F_CORPUS AND NOT GLM_FUZZ)
    add_test(NAME ${F_NAME}_replay COMMAND ${F_NAME} ${F_CORPUS})
  endif()
endfunction()
