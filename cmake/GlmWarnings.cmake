# Warnings for the project's own C++ targets: glm_set_warnings(<target>).
function(glm_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wnon-virtual-dtor
      -Wno-missing-field-initializers>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wshadow=local>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${GLM_WERROR}>>:-Werror>)
endfunction()
