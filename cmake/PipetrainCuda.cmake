# The optional CUDA backend (src/backend/cuda): decides whether it is built and
# provides pipetrain_configure_cuda(<target>) for src/CMakeLists.txt.
#
#   PIPETRAIN_ENABLE_CUDA        AUTO (default): ON when check_language(CUDA) finds a
#                                working nvcc, else OFF. ON: required (configure fails
#                                without nvcc). OFF: never (the fallback in
#                                src/backend/cuda/cuda_disabled.cpp is built instead).
#   PIPETRAIN_CUDA_ARCHITECTURES GPU architectures to compile for, CMake style
#                                ("90", "80;90", "90a"); default 80;90 (A100, H100/H200).
#                                Not "native": that needs a GPU at configure time.
#
# Result: PIPETRAIN_CUDA (TRUE/FALSE) in the top-level scope.
# Notes for CMake 3.25 with CUDA 13: CMake knows no C++20 flag for nvcc, so it is
# defined here (CMAKE_CUDA20_STANDARD_COMPILE_OPTION) after enable_language(CUDA).
# NCCL (the NcclCommunicator) is found by hand next to the toolkit (CUDA::nccl is not
# among CUDAToolkit's targets; NCCL_ROOT points elsewhere): PIPETRAIN_NCCL TRUE/FALSE.
# cuDNN (bf16 attention) is opened at run time, as cuBLAS is: only its headers are needed here.

set(PIPETRAIN_ENABLE_CUDA "AUTO" CACHE STRING
    "Build the CUDA backend: AUTO (if nvcc works), ON (required) or OFF")
set_property(CACHE PIPETRAIN_ENABLE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(PIPETRAIN_CUDA_ARCHITECTURES "80;90" CACHE STRING
    "CUDA architectures for the CUDA backend (CMAKE_CUDA_ARCHITECTURES syntax)")

set(PIPETRAIN_CUDA FALSE)
set(PIPETRAIN_NCCL FALSE)
string(TOUPPER "${PIPETRAIN_ENABLE_CUDA}" _pt_cuda_mode)
if(_pt_cuda_mode STREQUAL "AUTO" OR _pt_cuda_mode STREQUAL "ON" OR PIPETRAIN_ENABLE_CUDA)
  if(_pt_cuda_mode STREQUAL "AUTO")
    set(_pt_cuda_required FALSE)
  else()
    set(_pt_cuda_required TRUE)
  endif()
  # nvcc is often not on PATH (e.g. /usr/local/cuda/bin): point check_language at it
  # through CUDACXX, which the test project it runs inherits.
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(PIPETRAIN_NVCC nvcc
      HINTS ENV CUDA_HOME ENV CUDA_PATH ENV CUDAToolkit_ROOT /usr/local/cuda /opt/cuda
      PATH_SUFFIXES bin)
    if(PIPETRAIN_NVCC)
      set(ENV{CUDACXX} "${PIPETRAIN_NVCC}")
    endif()
  endif()
  # nvcc's host compiler: the C++ compiler of the rest of the build (not whatever g++
  # is first on PATH), unless chosen explicitly.
  if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER AND NOT DEFINED ENV{CUDAHOSTCXX}
     AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set(ENV{CUDAHOSTCXX} "${CMAKE_CXX_COMPILER}")
  endif()
  # Architectures must be known before enable_language(CUDA) (it would otherwise
  # compile its checks for the compiler's default architecture, which is fine, but
  # the targets should follow the option).
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "${PIPETRAIN_CUDA_ARCHITECTURES}")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # CMake 3.25 has no C++20 flag for nvcc: a target with CXX_STANDARD 20 then fails
    # to generate ("requires the language dialect CUDA20"). nvcc >= 12 takes -std=c++20.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION
       AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(PIPETRAIN_CUDA TRUE)
    find_path(PIPETRAIN_NCCL_INCLUDE nccl.h HINTS ENV NCCL_ROOT ${NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
              PATH_SUFFIXES include)
    find_library(PIPETRAIN_NCCL_LIBRARY nccl HINTS ENV NCCL_ROOT ${NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR}
                 PATH_SUFFIXES lib lib64)
    if(PIPETRAIN_NCCL_INCLUDE AND PIPETRAIN_NCCL_LIBRARY)
      set(PIPETRAIN_NCCL TRUE)
      message(STATUS "NCCL: ${PIPETRAIN_NCCL_LIBRARY}")
    else()
      message(STATUS "NCCL: not found (set NCCL_ROOT): the NCCL communicator is not built")
    endif()
    message(STATUS "CUDA backend: ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures "
                   "${PIPETRAIN_CUDA_ARCHITECTURES}, CUDA toolkit ${CUDAToolkit_VERSION})")
  elseif(_pt_cuda_required)
    message(FATAL_ERROR "PIPETRAIN_ENABLE_CUDA=${PIPETRAIN_ENABLE_CUDA} but no working CUDA "
                        "compiler was found (set CUDACXX or CMAKE_CUDA_COMPILER to nvcc, or "
                        "configure with -DPIPETRAIN_ENABLE_CUDA=OFF)")
  else()
    message(STATUS "CUDA backend: OFF (no working nvcc found; PIPETRAIN_ENABLE_CUDA=AUTO)")
  endif()
else()
  message(STATUS "CUDA backend: OFF (PIPETRAIN_ENABLE_CUDA=${PIPETRAIN_ENABLE_CUDA})")
endif()

# Adds the CUDA backend's build settings to <target> (pipetrain_lib); its sources
# are listed in src/CMakeLists.txt.
function(pipetrain_configure_cuda target)
  set_target_properties(${target} PROPERTIES
    CUDA_ARCHITECTURES "${PIPETRAIN_CUDA_ARCHITECTURES}"
    CUDA_RUNTIME_LIBRARY Shared
    CUDA_SEPARABLE_COMPILATION OFF
    # C++20 in .cu files too: CMake adds the -std=c++20 set up above (on CMake 3.25,
    # CMAKE_CUDA_STANDARD 20 alone would silently fall back to C++17).
    CUDA_STANDARD 20
    CUDA_STANDARD_REQUIRED ON)
  target_compile_options(${target} PRIVATE
    # Our warnings on the host side of .cu files, never -Werror there: nvcc and its
    # headers are not ours to keep warning-clean.
    "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>"
    "$<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<CONFIG:Debug>>:-lineinfo>")
  # Consumers see PIPETRAIN_HAVE_CUDA (the tests add the "cuda" backend with it).
  target_compile_definitions(${target} PUBLIC PIPETRAIN_HAVE_CUDA=1)
  # The runtime and cuBLAS by path, not as CUDA:: imported targets: the installed
  # static library's export then needs nothing from CUDAToolkit at find_package time
  # (the same approach as HDF5 in PipetrainDependencies.cmake).
  target_include_directories(${target} SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  # cuBLAS and cuBLASLt are opened when a CUDA backend starts (backend/cuda/cublas_loader):
  # linked, they cost every process half a second of start-up. Their sonames and the
  # toolkit's copies, for dlopen.
  target_link_libraries(${target} PRIVATE ${CUDA_cudart_LIBRARY} ${CMAKE_DL_LIBS})
  set(_pt_cublas_definitions)
  foreach(_lib cublas cublasLt)
    get_filename_component(_dir "${CUDA_${_lib}_LIBRARY}" DIRECTORY)
    string(TOUPPER ${_lib} _upper)
    set(_soname "lib${_lib}.so.${CUDAToolkit_VERSION_MAJOR}")
    list(APPEND _pt_cublas_definitions "PIPETRAIN_${_upper}_SONAME=\"${_soname}\""
         "PIPETRAIN_${_upper}_PATH=\"${_dir}/${_soname}\"")
  endforeach()
  set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/backend/cuda/cublas_loader.cpp APPEND
    PROPERTY COMPILE_DEFINITIONS ${_pt_cublas_definitions})
  # "90;80" -> "90,80" for `pipetrain --version` (a ';' cannot travel in a definition).
  string(REPLACE ";" "," _archs "${PIPETRAIN_CUDA_ARCHITECTURES}")
  set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/backend/cuda/cuda_backend.cpp APPEND
    PROPERTY COMPILE_DEFINITIONS "PIPETRAIN_CUDA_ARCHS=\"${_archs}\"")
  if(PIPETRAIN_NCCL)
    target_include_directories(${target} SYSTEM PRIVATE ${PIPETRAIN_NCCL_INCLUDE})
    target_link_libraries(${target} PRIVATE ${PIPETRAIN_NCCL_LIBRARY})
    target_compile_definitions(${target} PUBLIC PIPETRAIN_HAVE_NCCL=1)
  endif()
endfunction()
