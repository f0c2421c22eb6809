# CUDA toolkit and NCCL detection, independent of DSTRAIN_CUDA (which is about LibTorch being a CUDA
# build). When nvcc is found, the CUDA language is enabled and every .cu file and the NCCL code are
# compiled even against a CPU-only LibTorch, so CI (which has the toolkit but no GPU) keeps them
# building. Without a toolkit they are skipped with a message and the rest of the project builds.
#
# Results:
#   DSTRAIN_HAVE_CUDA  ON when the CUDA language is enabled and CUDA::cudart exists
#   DSTRAIN_HAVE_NCCL  ON when, in addition, nccl.h and libnccl were found (target dstrain::nccl)
# Inputs (cache or environment): CUDAToolkit_ROOT / CMAKE_CUDA_COMPILER to pick a toolkit (default: nvcc
# on PATH, then /usr/local/cuda); NCCL_ROOT for an NCCL outside the toolkit (e.g. the nvidia-nccl
# Python package); DSTRAIN_FIND_CUDA=OFF to skip all of this; CMAKE_CUDA_ARCHITECTURES for the GPUs
# to build dstrain's kernels for (default below).

option(DSTRAIN_FIND_CUDA "Look for the CUDA toolkit and NCCL and build the CUDA parts when found" ON)
# The GPUs people train on: A100 (8.0); A10, A40, RTX 30 (8.6); L4, L40, RTX 40 (8.9); H100, H200
# (9.0). Machine code only (-real): each entry is one more device compile of every .cu file.
set(DSTRAIN_DEFAULT_CUDA_ARCHITECTURES "80-real;86-real;89-real;90-real")
set(DSTRAIN_HAVE_CUDA OFF)
set(DSTRAIN_HAVE_NCCL OFF)

# dstrain_find_nccl(): called after find_package(Torch). The NCCL that LibTorch itself loads (the
# wheel's nvidia-nccl package beside torch/) comes first, so a process has one NCCL.
function(dstrain_find_nccl)
  if(NOT DSTRAIN_HAVE_CUDA)
    return()
  endif()
  set(hints ${NCCL_ROOT} $ENV{NCCL_ROOT})
  if(TORCH_INSTALL_PREFIX)
    list(APPEND hints ${TORCH_INSTALL_PREFIX}/../nvidia/nccl)
  endif()
  list(APPEND hints ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include
            NO_DEFAULT_PATH)
  # The Python wheel ships only libnccl.so.2 (no unversioned link), hence the second name.
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
               NAMES_PER_DIR HINTS ${hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64
               NO_DEFAULT_PATH)
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    message(STATUS "dstrain: NCCL not found (nccl.h: ${NCCL_INCLUDE_DIR}, libnccl: ${NCCL_LIBRARY}); "
                   "set NCCL_ROOT to build the NCCL communicator")
    return()
  endif()
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" nccl_version_line REGEX "^#define NCCL_VERSION_CODE ")
  string(REGEX MATCH "[0-9]+" nccl_version "${nccl_version_line}")
  # ncclCommInitRankConfig / non-blocking communicators need 2.14; ncclAvg and bfloat16, 2.10.
  if(nccl_version LESS 21400)
    message(STATUS "dstrain: NCCL at ${NCCL_INCLUDE_DIR} is version code ${nccl_version}; "
                   "need 2.14 or newer, skipping the NCCL communicator")
    return()
  endif()
  add_library(dstrain::nccl UNKNOWN IMPORTED GLOBAL)
  set_target_properties(dstrain::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}")
  target_include_directories(dstrain::nccl SYSTEM INTERFACE "${NCCL_INCLUDE_DIR}")
  target_link_libraries(dstrain::nccl INTERFACE CUDA::cudart)
  message(STATUS "dstrain: NCCL ${nccl_version} (${NCCL_LIBRARY})")
  set(DSTRAIN_HAVE_NCCL ON PARENT_SCOPE)
  set(NCCL_LIBRARY ${NCCL_LIBRARY} PARENT_SCOPE)
endfunction()

if(DSTRAIN_FIND_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(DSTRAIN_NVCC nvcc HINTS ENV CUDAToolkit_ROOT ENV CUDA_HOME
                 PATHS /usr/local/cuda/bin NO_CACHE)
    # Through CUDACXX rather than CMAKE_CUDA_COMPILER, so that check_language still tries it: a
    # broken or partial toolkit then means "no CUDA", not a configure error.
    if(DSTRAIN_NVCC AND EXISTS "${DSTRAIN_NVCC}")
      set(ENV{CUDACXX} "${DSTRAIN_NVCC}")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # The architectures: -DCMAKE_CUDA_ARCHITECTURES (CMake's spelling), else the default below. The
    # choice is kept in the cache as DSTRAIN_CUDA_ARCHITECTURES, because a CUDA LibTorch wants
    # CMAKE_CUDA_ARCHITECTURES undefined (dstrain_cuda_architectures() below removes it around
    # find_package(Torch)), so a reconfigure would not see the user's value otherwise. With a CUDA
    # LibTorch, torch's CMake then adds the -gencode flags of TORCH_CUDA_ARCH_LIST, which the
    # top-level CMakeLists.txt sets from this list (dstrain_torch_cuda_arch_list()).
    if(DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(DSTRAIN_CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" CACHE STRING
          "CUDA architectures of dstrain's kernels (set with -DCMAKE_CUDA_ARCHITECTURES)" FORCE)
    elseif(NOT DSTRAIN_CUDA_ARCHITECTURES)
      set(DSTRAIN_CUDA_ARCHITECTURES "${DSTRAIN_DEFAULT_CUDA_ARCHITECTURES}" CACHE STRING
          "CUDA architectures of dstrain's kernels (set with -DCMAKE_CUDA_ARCHITECTURES)" FORCE)
    endif()
    set(CMAKE_CUDA_ARCHITECTURES ${DSTRAIN_CUDA_ARCHITECTURES})
    # One CUDA runtime per process, the shared one, as CUDA::cudart, LibTorch and NCCL's users use.
    if(NOT DEFINED CMAKE_CUDA_RUNTIME_LIBRARY)
      set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    if(CCACHE_PROGRAM)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
    endif()
    find_package(CUDAToolkit)
  endif()
  if(CMAKE_CUDA_COMPILER AND TARGET CUDA::cudart)
    set(DSTRAIN_HAVE_CUDA ON)
    message(STATUS "dstrain: CUDA ${CUDAToolkit_VERSION} at ${CUDAToolkit_BIN_DIR}, "
                   "architectures ${CMAKE_CUDA_ARCHITECTURES}: building the CUDA kernels")
  else()
    message(STATUS "dstrain: no CUDA toolkit found (nvcc not on PATH nor in /usr/local/cuda/bin): "
                   "skipping the CUDA kernels and the NCCL communicator")
  endif()
else()
  message(STATUS "dstrain: DSTRAIN_FIND_CUDA=OFF: skipping the CUDA kernels and the NCCL communicator")
endif()


# "80-real;90" (CMake's spelling: NN-real is machine code only, NN adds PTX) as TORCH_CUDA_ARCH_LIST
# spells it ("8.0;9.0+PTX"), in `out`. Anything else ("native", "all", NN-virtual) is an error:
# torch's list cannot say it.
function(dstrain_torch_arch_list out archs)
  set(list "")
  foreach(arch IN LISTS archs)
    if(NOT arch MATCHES "^([0-9]+)([0-9])(a?)(-real)?$")
      message(FATAL_ERROR
              "CMAKE_CUDA_ARCHITECTURES: '${arch}' is not supported (a CUDA LibTorch builds with "
              "TORCH_CUDA_ARCH_LIST, which cannot say it); expected compute capabilities such as "
              "80-real (machine code) or 90 (machine code and PTX), separated by ';'")
    endif()
    set(entry "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
    if(NOT CMAKE_MATCH_4)
      string(APPEND entry "+PTX")
    endif()
    list(APPEND list "${entry}")
  endforeach()
  set(${out} "${list}" PARENT_SCOPE)
endfunction()

# Before find_package(Torch): torch's CUDA CMake takes TORCH_CUDA_ARCH_LIST (the CMake variable
# before the environment), not CMAKE_CUDA_ARCHITECTURES; give it dstrain's list. An environment
# TORCH_CUDA_ARCH_LIST is not read, and configure says so, so that one setting decides.
macro(dstrain_torch_cuda_arch_list)
  if(DSTRAIN_CUDA_ARCHITECTURES)
    dstrain_torch_arch_list(TORCH_CUDA_ARCH_LIST "${DSTRAIN_CUDA_ARCHITECTURES}")
  else()
    dstrain_torch_arch_list(TORCH_CUDA_ARCH_LIST "${DSTRAIN_DEFAULT_CUDA_ARCHITECTURES}")
  endif()
  if(DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT "$ENV{TORCH_CUDA_ARCH_LIST}" STREQUAL
                                                "${TORCH_CUDA_ARCH_LIST}")
    message(WARNING "dstrain: TORCH_CUDA_ARCH_LIST=$ENV{TORCH_CUDA_ARCH_LIST} in the environment "
                    "is not read; building for ${TORCH_CUDA_ARCH_LIST}. Choose the architectures "
                    "with -DCMAKE_CUDA_ARCHITECTURES (e.g. \"80-real;90-real\").")
  endif()
endmacro()

# Flags for our .cu files: host-side warnings as in C++, and nvcc's own warnings as errors.
set(DSTRAIN_CUDA_WARNINGS -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter)
if(DSTRAIN_WERROR)
  list(APPEND DSTRAIN_CUDA_WARNINGS -Werror=all-warnings -Xcompiler=-Werror)
endif()

# Called around find_package(Torch): BEFORE hides CMAKE_CUDA_ARCHITECTURES from torch's CMake (which
# warns about it and takes TORCH_CUDA_ARCH_LIST); AFTER leaves it OFF when LibTorch added its own
# -gencode flags, and restores ours for a CPU LibTorch with a CUDA toolkit.
macro(dstrain_cuda_architectures when)
  if("${when}" STREQUAL "BEFORE")
    unset(CMAKE_CUDA_ARCHITECTURES)
    unset(CMAKE_CUDA_ARCHITECTURES CACHE)
  elseif(TARGET torch_cuda)
    set(CMAKE_CUDA_ARCHITECTURES OFF)
  elseif(DSTRAIN_HAVE_CUDA)
    set(CMAKE_CUDA_ARCHITECTURES ${DSTRAIN_CUDA_ARCHITECTURES})
  endif()
endmacro()
