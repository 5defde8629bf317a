# glm_add_prefixed_test(NAME name PREFIX p SOURCES ... LIBS ... [LABELS label]): glm_add_test
# with PREFIX required, so that every test of the folder is selected by `ctest -R <p>`.
function(glm_add_prefixed_test)
  cmake_parse_arguments(T "" "NAME;PREFIX" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_PREFIX)
    message(FATAL_ERROR "glm_add_prefixed_test(${T_NAME}): PREFIX is required")
  endif()
  glm_add_test(NAME ${T_NAME} PREFIX ${T_PREFIX} SOURCES ${T_SOURCES} LIBS ${T_LIBS}
    LABELS ${T_LABELS})
endfunction()
