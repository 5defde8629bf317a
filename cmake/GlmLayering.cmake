# Who may include whom (../shared/DESIGN.md §2), checked over every source file's #include lines.
# Run as a test: cmake -DGLM_SOURCE_DIR=<repo> -P GlmLayering.cmake. Exits non-zero listing each
# file and include that breaks a rule.
#
# A rule is a folder and the project folders its files may include; the longest matching folder
# applies. Includes outside the project folders (absl, gtest, yaml-cpp, ...) are free, except
# that gRPC stays out of the folders below that are not control plane.
cmake_minimum_required(VERSION 3.25)
if(NOT GLM_SOURCE_DIR)
  message(FATAL_ERROR "GlmLayering.cmake: pass -DGLM_SOURCE_DIR=<repository root>")
endif()

set(project_prefixes common/ proto/ glm/v1/ cluster/ engine/ kernels/ agent/ controller/ tests/
  tools/)

set(rule_folders
  common/ cluster/ proto/ kernels/ engine/ engine/tokenizer/ agent/ controller/)
set(allow_common/            common/)
set(allow_cluster/           cluster/ common/)
set(allow_proto/             proto/ glm/v1/ common/)
set(allow_kernels/           kernels/ common/)
set(allow_engine/            engine/ kernels/ common/)
set(allow_engine/tokenizer/  engine/tokenizer/ common/)
set(allow_agent/             agent/ cluster/ engine/ proto/ glm/v1/ common/)
set(allow_controller/        controller/ cluster/ proto/ glm/v1/ common/ engine/tokenizer/
  engine/config/)
# Folders that never include gRPC (grpc/, grpcpp/, *.grpc.pb.h) or the control-plane messages.
set(no_grpc_folders common/ cluster/ kernels/ engine/)

set(violations "")
set(num_files 0)
foreach(folder IN LISTS rule_folders)
  file(GLOB_RECURSE files RELATIVE ${GLM_SOURCE_DIR}
    ${GLM_SOURCE_DIR}/${folder}*.h ${GLM_SOURCE_DIR}/${folder}*.cc
    ${GLM_SOURCE_DIR}/${folder}*.cuh ${GLM_SOURCE_DIR}/${folder}*.cu)
  foreach(file IN LISTS files)
    # The longest rule folder that holds this file owns it.
    set(owner "")
    foreach(candidate IN LISTS rule_folders)
      string(LENGTH "${candidate}" candidate_len)
      string(LENGTH "${owner}" owner_len)
      string(FIND "${file}" "${candidate}" at)
      if(at EQUAL 0 AND candidate_len GREATER owner_len)
        set(owner ${candidate})
      endif()
    endforeach()
    if(NOT owner STREQUAL folder)
      continue()
    endif()
    math(EXPR num_files "${num_files} + 1")
    file(STRINGS ${GLM_SOURCE_DIR}/${file} includes REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]*)[\">].*$" "\\1"
        target "${line}")
      set(problem "")
      foreach(prefix IN LISTS project_prefixes)
        string(FIND "${target}" "${prefix}" at)
        if(at EQUAL 0)
          set(allowed FALSE)
          foreach(ok IN LISTS allow_${owner})
            string(FIND "${target}" "${ok}" ok_at)
            if(ok_at EQUAL 0)
              set(allowed TRUE)
            endif()
          endforeach()
          if(NOT allowed)
            string(REPLACE ";" " " allowed_text "${allow_${owner}}")
            set(problem "${owner} may include only ${allowed_text}")
          endif()
          break()
        endif()
      endforeach()
      if(owner IN_LIST no_grpc_folders AND (target MATCHES "^grpc(pp|\\+\\+)?/" OR
         target MATCHES "\\.grpc\\.pb\\.h$"))
        set(problem "${owner} never includes gRPC")
      endif()
      if(problem)
        string(APPEND violations "  ${file}: #include \"${target}\": ${problem}\n")
      endif()
    endforeach()
  endforeach()
endforeach()

if(violations)
  message(FATAL_ERROR "Includes that break the layering of ../shared/DESIGN.md §2:\n"
    "${violations}")
endif()
message(STATUS "layering: the includes of ${num_files} files follow DESIGN.md §2")
