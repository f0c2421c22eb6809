# Apache Arrow and Parquet C++ (libarrow, libparquet) from the project environment's pyarrow wheel.
#
# Debian 12 packages no Arrow C++, but the pyarrow wheel carries both libraries with their headers,
# the way the torch wheel carries LibTorch. The Python that configures the build tells where they
# are: Python3_EXECUTABLE (scripts/setup passes .venv/bin/python), else ./.venv/bin/python, asked
# for pyarrow.get_include() and pyarrow.get_library_dirs(). ARROW_INCLUDE_DIR, ARROW_LIBRARY and
# PARQUET_LIBRARY may be given instead (an Arrow C++ built from source).
#
# The wheel ships only versioned file names (libarrow.so.2500, no libarrow.so): find_library gets
# the exact names, built from ARROW_SO_VERSION in arrow/util/config.h, so the environment is never
# modified (pyarrow.create_library_symlinks() would write into it).
#
# Compatibility, checked for pyarrow 25.0.1 (GCC 14, manylinux_2_28):
#  - its headers need C++20 (std::span in arrow/buffer.h). dstrain is C++17, so dstrain_arrow
#    carries cxx_std_20 and is linked PRIVATE by one small library whose own header names no Arrow
#    type (lib/data/parquet_reader.h);
#  - it uses the new std::string ABI (_GLIBCXX_USE_CXX11_ABI=1, as GCC's default and the torch
#    wheel) and needs GLIBCXX_3.4.30, which Debian 12's libstdc++ (GCC 12) provides;
#  - like LibTorch it was built with another toolchain, so programs that link it name libstdc++
#    first in the search order (see dstrain_torch in CMakeLists.txt for why). Unlike libtorch.so,
#    libarrow and libparquet 25 export no libstdc++ symbol, but the rule costs nothing.
#
# Defines the INTERFACE target dstrain_arrow.

function(dstrain_find_arrow)
  if(NOT ARROW_INCLUDE_DIR)
    set(python ${Python3_EXECUTABLE})
    if(NOT python AND EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
      set(python ${PROJECT_SOURCE_DIR}/.venv/bin/python)
    endif()
    if(NOT python)
      message(FATAL_ERROR "Arrow/Parquet C++: no Python to ask for pyarrow; run scripts/setup "
                          "(it makes .venv) or pass -DPython3_EXECUTABLE=<python with pyarrow>")
    endif()
    execute_process(
      COMMAND ${python} -c "import pyarrow; print(pyarrow.get_include()); print(pyarrow.get_library_dirs()[0])"
      OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "Arrow/Parquet C++: ${python} cannot import pyarrow (run scripts/setup; "
                          "pyarrow is in pyproject.toml's build group):\n${err}")
    endif()
    string(REPLACE "\n" ";" out "${out}")
    list(GET out 0 include_dir)
    list(GET out 1 lib_dir)
    set(ARROW_INCLUDE_DIR ${include_dir} CACHE PATH "Arrow C++ headers (pyarrow.get_include())")
    set(ARROW_LIB_DIR ${lib_dir} CACHE PATH "directory of libarrow and libparquet")
  endif()
  set(config_h ${ARROW_INCLUDE_DIR}/arrow/util/config.h)
  if(NOT EXISTS ${config_h} OR NOT EXISTS ${ARROW_INCLUDE_DIR}/parquet/arrow/reader.h)
    message(FATAL_ERROR "Arrow/Parquet C++: ${ARROW_INCLUDE_DIR} lacks arrow/util/config.h or "
                        "parquet/arrow/reader.h")
  endif()
  file(STRINGS ${config_h} so_line REGEX "#define ARROW_SO_VERSION \"[0-9]+\"")
  file(STRINGS ${config_h} version_line REGEX "#define ARROW_VERSION_STRING \"[0-9.]+\"")
  string(REGEX MATCH "[0-9]+" so_version "${so_line}")
  string(REGEX MATCH "[0-9.]+" version "${version_line}")
  find_library(ARROW_LIBRARY NAMES libarrow.so.${so_version} arrow PATHS ${ARROW_LIB_DIR}
               NO_DEFAULT_PATH REQUIRED)
  find_library(PARQUET_LIBRARY NAMES libparquet.so.${so_version} parquet PATHS ${ARROW_LIB_DIR}
               NO_DEFAULT_PATH REQUIRED)

  add_library(dstrain_arrow INTERFACE)
  target_include_directories(dstrain_arrow SYSTEM INTERFACE ${ARROW_INCLUDE_DIR})
  target_link_libraries(dstrain_arrow INTERFACE ${PARQUET_LIBRARY} ${ARROW_LIBRARY})
  target_compile_features(dstrain_arrow INTERFACE cxx_std_20)
  target_link_options(dstrain_arrow INTERFACE "LINKER:--push-state,--no-as-needed" "-lstdc++"
                      "LINKER:--pop-state")
  message(STATUS "dstrain: Arrow/Parquet C++ ${version} at ${ARROW_LIBRARY}")
endfunction()
