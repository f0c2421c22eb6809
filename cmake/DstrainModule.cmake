# dstrain_layers(<layer> ...): each argument is one layer, a space-separated list of module names.
function(dstrain_layers)
  set(level 0)
  foreach(layer IN LISTS ARGN)
    string(REPLACE " " ";" mods "${layer}")
    foreach(m IN LISTS mods)
      set_property(GLOBAL PROPERTY DSTRAIN_LAYER_${m} ${level})
    endforeach()
    math(EXPR level "${level} + 1")
  endforeach()
endfunction()

# dstrain_module(<name> SOURCES ... [DEPS <module> ...] [LIBS <target> ...] [TORCH] [PCH])
# Builds static library dstrain_<name>. DEPS are other dstrain modules and must sit on a lower layer:
# an upward edge (and therefore any cycle) is a configure error naming both modules.
function(dstrain_module name)
  cmake_parse_arguments(M "TORCH;PCH" "" "SOURCES;DEPS;LIBS" ${ARGN})
  get_property(my_level GLOBAL PROPERTY DSTRAIN_LAYER_${name})
  if("${my_level}" STREQUAL "")
    message(FATAL_ERROR "module '${name}' has no layer: add it to dstrain_layers() in CMakeLists.txt")
  endif()
  foreach(dep IN LISTS M_DEPS)
    get_property(dep_level GLOBAL PROPERTY DSTRAIN_LAYER_${dep})
    if("${dep_level}" STREQUAL "" OR NOT dep_level LESS my_level)
      message(FATAL_ERROR "module '${name}' (layer ${my_level}) may not depend on '${dep}' "
                          "(layer ${dep_level}): dependencies must point down the layering")
    endif()
  endforeach()
  add_library(dstrain_${name} STATIC ${M_SOURCES})
  target_include_directories(dstrain_${name} PUBLIC ${PROJECT_SOURCE_DIR}/lib ${PROJECT_SOURCE_DIR})
  target_compile_options(dstrain_${name} PRIVATE ${DSTRAIN_WARNINGS})
  foreach(dep IN LISTS M_DEPS)
    target_link_libraries(dstrain_${name} PUBLIC dstrain_${dep})
  endforeach()
  if(M_LIBS)
    target_link_libraries(dstrain_${name} PUBLIC ${M_LIBS})
  endif()
  if(M_TORCH)
    target_link_libraries(dstrain_${name} PUBLIC dstrain_torch)
    if(DSTRAIN_PCH AND M_PCH)
      target_precompile_headers(dstrain_${name} REUSE_FROM dstrain_torch_pch)
    endif()
  endif()
endfunction()

# dstrain_test(<name> SOURCES ... DEPS <module> ... [LABELS ...] [LIBS ...] [TORCH] [PER_TEST])
# Unit test binaries run as one ctest entry each (a process per gtest case would load LibTorch
# hundreds of times); PER_TEST registers every gtest case on its own, for slow end-to-end suites
# that gain from `ctest -j`. Exit code 77 means skipped.
function(dstrain_test name)
  cmake_parse_arguments(T "TORCH;PER_TEST" "" "SOURCES;DEPS;LABELS;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_compile_options(${name} PRIVATE ${DSTRAIN_WARNINGS})
  foreach(dep IN LISTS T_DEPS)
    target_link_libraries(${name} PRIVATE dstrain_${dep})
  endforeach()
  target_link_libraries(${name} PRIVATE GTest::gtest GTest::gmock GTest::gtest_main ${T_LIBS})
  if(T_TORCH AND DSTRAIN_PCH)
    target_precompile_headers(${name} REUSE_FROM dstrain_torch_pch)
  endif()
  target_compile_definitions(${name} PRIVATE
    DSTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    DSTRAIN_BINARY="$<TARGET_FILE:dstrain>")
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  if(T_PER_TEST)
    # End-to-end cases start several ranks each: running two at once on a small machine
    # oversubscribes the cores, and spinning OpenMP threads then slow everything by 10x or more.
    # NO_PRETTY_VALUES: a parameterized case is named by its own suffix alone; CMake would
    # otherwise append gtest's byte dump of the parameter (different in every build).
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 NO_PRETTY_VALUES
                         PROPERTIES LABELS "${T_LABELS}" SKIP_RETURN_CODE 77 RUN_SERIAL TRUE
                                    SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  else()
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}" SKIP_RETURN_CODE 77)
  endif()
endfunction()
