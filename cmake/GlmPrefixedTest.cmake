# glm_add_prefixed_test(NAME name PREFIX p SOURCES a.cc ... LIBS lib ... [LABELS l])
# glm_add_test with every discovered test named "<p>.<Suite>.<Test>", so a lowercase component
# word selects a folder's tests (`ctest -R dist`, `ctest -R netns`) whatever the suite names.
function(glm_add_prefixed_test)
  cmake_parse_arguments(T "" "NAME;PREFIX" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  glm_set_warnings(${T_NAME})
  set(properties ENVIRONMENT "GLM_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(T_LABELS)
    # gtest_discover_tests (CMake 3.25) splits a multi-valued property: the second label would
    # become a property name. One label per test, checked.
    list(LENGTH T_LABELS num_labels)
    if(num_labels GREATER 1)
      message(FATAL_ERROR "glm_add_prefixed_test(${T_NAME}): one label only, got ${T_LABELS}")
    endif()
    list(APPEND properties LABELS ${T_LABELS})
  endif()
  gtest_discover_tests(${T_NAME} TEST_PREFIX "${T_PREFIX}." DISCOVERY_TIMEOUT 60
    PROPERTIES ${properties})
endfunction()
