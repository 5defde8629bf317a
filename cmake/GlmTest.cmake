# glm_add_test(NAME name SOURCES a.cc ... LIBS lib ... [PREFIX p] [LABELS label])
# One GoogleTest binary, discovered by ctest. Tests are hermetic: port 0, temp dirs.
# PREFIX names every discovered test "<p>.<Suite>.<Test>", so a lowercase component word selects
# a folder's tests (`ctest -R dist`) whatever the suite names. One label at most:
# gtest_discover_tests (CMake 3.25) splits a multi-valued property, so a second label would
# silently become a property name.
function(glm_add_test)
  cmake_parse_arguments(T "" "NAME;PREFIX" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  glm_set_warnings(${T_NAME})
  set(properties ENVIRONMENT "GLM_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(T_LABELS)
    list(LENGTH T_LABELS num_labels)
    if(num_labels GREATER 1)
      message(FATAL_ERROR "glm_add_test(${T_NAME}): one label only, got ${T_LABELS}")
    endif()
    list(APPEND properties LABELS ${T_LABELS})
  endif()
  set(prefix_args)
  if(T_PREFIX)
    set(prefix_args TEST_PREFIX "${T_PREFIX}.")
  endif()
  gtest_discover_tests(${T_NAME} ${prefix_args} DISCOVERY_TIMEOUT 60 PROPERTIES ${properties})
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
