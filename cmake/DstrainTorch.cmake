# LibTorch for dstrain: find_package(Torch), except where its CMake files cannot work.
#
# The torch wheel from the Python package index is a CUDA build, and its CMake files (Caffe2's
# public/cuda.cmake) stop configure on a machine without the CUDA toolkit, even for a program that
# only wants the CPU. There, dstrain builds for the CPU against the wheel's CPU libraries
# (libtorch_cpu, libc10), declared here the way the wheel's own files declare them (the include
# directories, torch_cpu's compile definitions): the demo and the tests run on any Debian 12
# machine, and a GPU build needs the toolkit (docs/gpu.md).
#
# Sets what find_package(Torch) sets and the rest of the build reads: TORCH_LIBRARIES,
# TORCH_INCLUDE_DIRS, TORCH_CXX_FLAGS, TORCH_INSTALL_PREFIX, Torch_DIR, Torch_VERSION; and
# DSTRAIN_TORCH_CPU_PART ON when it took the CPU part of a CUDA LibTorch.

macro(dstrain_find_torch)
  set(DSTRAIN_TORCH_CPU_PART OFF)
  if(NOT DSTRAIN_HAVE_CUDA)
    find_path(DSTRAIN_TORCH_CONFIG_DIR TorchConfig.cmake PATH_SUFFIXES share/cmake/Torch Torch
              HINTS ${Torch_DIR})
  endif()
  if(NOT DSTRAIN_HAVE_CUDA AND DSTRAIN_TORCH_CONFIG_DIR)
    get_filename_component(DSTRAIN_TORCH_PREFIX "${DSTRAIN_TORCH_CONFIG_DIR}/../../.." ABSOLUTE)
    if(EXISTS "${DSTRAIN_TORCH_PREFIX}/lib/libtorch_cuda.so")
      set(DSTRAIN_TORCH_CPU_PART ON)
    endif()
  endif()
  if(NOT DSTRAIN_TORCH_CPU_PART)
    find_package(Torch 2.0 REQUIRED)
  else()
    set(PACKAGE_FIND_VERSION 2.0)
    include("${DSTRAIN_TORCH_CONFIG_DIR}/TorchConfigVersion.cmake")
    set(Torch_VERSION "${PACKAGE_VERSION}")
    set(Torch_DIR "${DSTRAIN_TORCH_CONFIG_DIR}")
    set(TORCH_INSTALL_PREFIX "${DSTRAIN_TORCH_PREFIX}")
    set(TORCH_INCLUDE_DIRS "${DSTRAIN_TORCH_PREFIX}/include"
                           "${DSTRAIN_TORCH_PREFIX}/include/torch/csrc/api/include")
    set(TORCH_CXX_FLAGS "")
    add_library(dstrain_torch_cpu_part INTERFACE)
    target_compile_definitions(dstrain_torch_cpu_part
                               INTERFACE USE_DISTRIBUTED USE_C10D_GLOO USE_RPC USE_TENSORPIPE)
    target_link_libraries(
      dstrain_torch_cpu_part
      INTERFACE "-Wl,--no-as-needed" "${DSTRAIN_TORCH_PREFIX}/lib/libtorch_cpu.so"
                "${DSTRAIN_TORCH_PREFIX}/lib/libc10.so" "-Wl,--as-needed")
    set(TORCH_LIBRARIES dstrain_torch_cpu_part)
    # The libraries' directory on the binaries' run path (they are linked by full path).
    list(APPEND CMAKE_BUILD_RPATH "${DSTRAIN_TORCH_PREFIX}/lib")
    message(STATUS "dstrain: no CUDA toolkit: building for the CPU against the CPU libraries of "
                   "the CUDA LibTorch ${Torch_VERSION} at ${DSTRAIN_TORCH_PREFIX}")
  endif()
endmacro()
