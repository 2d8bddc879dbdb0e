# Finds every third-party dependency and exposes it as an imported target.
# Works with Debian packages and with a site's module-loaded installs
# (pass their prefixes in CMAKE_PREFIX_PATH).

set(MPI_CXX_SKIP_MPICXX ON CACHE BOOL "Skip the deprecated MPI C++ bindings")
find_package(MPI REQUIRED COMPONENTS C)

# A parallel HDF5 first; -DHDF5_PREFER_PARALLEL=OFF (or only a serial one installed) builds
# against a serial HDF5: one-rank checkpoints work, and a multi-rank run that would write
# one says at its start that it needs a parallel HDF5 (io/h5io.cpp).
set(HDF5_PREFER_PARALLEL ON CACHE BOOL "Prefer a parallel (MPI) HDF5")
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(WARNING "HDF5 found at ${HDF5_INCLUDE_DIRS} is serial: checkpoints of one rank only "
                  "(multi-rank runs that checkpoint, and `data text` on several ranks, need a parallel HDF5)")
endif()
add_library(pipetrain_hdf5 INTERFACE)
target_include_directories(pipetrain_hdf5 SYSTEM INTERFACE ${HDF5_INCLUDE_DIRS})
target_link_libraries(pipetrain_hdf5 INTERFACE ${HDF5_C_LIBRARIES})
target_compile_definitions(pipetrain_hdf5 INTERFACE ${HDF5_DEFINITIONS})

# BLAS: OpenBLAS preferred (its CMake package, then FindBLAS), any CBLAS accepted.
find_package(OpenBLAS CONFIG QUIET)
add_library(pipetrain_blas INTERFACE)
if(OpenBLAS_FOUND)
  target_include_directories(pipetrain_blas SYSTEM INTERFACE ${OpenBLAS_INCLUDE_DIRS})
  target_link_libraries(pipetrain_blas INTERFACE ${OpenBLAS_LIBRARIES})
  target_compile_definitions(pipetrain_blas INTERFACE PIPETRAIN_HAVE_OPENBLAS=1)
  message(STATUS "BLAS: OpenBLAS ${OpenBLAS_VERSION} (${OpenBLAS_LIBRARIES})")
else()
  find_package(BLAS REQUIRED)
  find_path(PIPETRAIN_CBLAS_INCLUDE_DIR cblas.h REQUIRED)
  target_include_directories(pipetrain_blas SYSTEM INTERFACE ${PIPETRAIN_CBLAS_INCLUDE_DIR})
  target_link_libraries(pipetrain_blas INTERFACE ${BLAS_LIBRARIES})
  message(STATUS "BLAS: ${BLAS_LIBRARIES}")
endif()

# oneDNN (optional): bf16 products on CPUs with AVX512_BF16 or AMX
# (include/pipetrain/backend/bf16_products.hpp). Found by its header and library, so a
# site's module install works through CMAKE_PREFIX_PATH as Debian's libdnnl-dev does.
option(PIPETRAIN_WITH_ONEDNN "Run bf16 products on the CPU through oneDNN when it is found" ON)
add_library(pipetrain_onednn INTERFACE)
if(PIPETRAIN_WITH_ONEDNN)
  find_path(PIPETRAIN_ONEDNN_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
  find_library(PIPETRAIN_ONEDNN_LIB NAMES dnnl)
endif()
if(PIPETRAIN_WITH_ONEDNN AND PIPETRAIN_ONEDNN_INCLUDE_DIR AND PIPETRAIN_ONEDNN_LIB)
  target_include_directories(pipetrain_onednn SYSTEM INTERFACE $<BUILD_INTERFACE:${PIPETRAIN_ONEDNN_INCLUDE_DIR}>)
  target_link_libraries(pipetrain_onednn INTERFACE ${PIPETRAIN_ONEDNN_LIB} ${CMAKE_DL_LIBS})
  target_compile_definitions(pipetrain_onednn INTERFACE PIPETRAIN_HAVE_ONEDNN=1)
  message(STATUS "oneDNN: ${PIPETRAIN_ONEDNN_LIB} (bf16 products)")
else()
  message(STATUS "oneDNN: not used (bf16 products widen to f32 for sgemm)")
endif()

# Kokkos: a site's proper Kokkos::kokkos is used as is. Debian's Trilinos
# export points at /usr/lib/include, so there we link the libraries directly.
find_package(Kokkos QUIET)
add_library(pipetrain_kokkos INTERFACE)
set(_pt_kokkos_ok FALSE)
if(TARGET Kokkos::kokkos)
  get_target_property(_pt_kk_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  set(_pt_kokkos_ok TRUE)
  foreach(_d IN LISTS _pt_kk_inc)
    if(NOT _d MATCHES "^\\$<" AND NOT EXISTS "${_d}")
      set(_pt_kokkos_ok FALSE)
    endif()
  endforeach()
endif()
if(_pt_kokkos_ok)
  target_link_libraries(pipetrain_kokkos INTERFACE Kokkos::kokkos)
  message(STATUS "Kokkos: Kokkos::kokkos target")
else()
  find_path(PIPETRAIN_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp PATH_SUFFIXES trilinos REQUIRED)
  find_library(PIPETRAIN_KOKKOSCORE_LIB NAMES kokkoscore trilinos_kokkoscore REQUIRED)
  target_include_directories(pipetrain_kokkos SYSTEM INTERFACE ${PIPETRAIN_KOKKOS_INCLUDE_DIR})
  target_link_libraries(pipetrain_kokkos INTERFACE ${PIPETRAIN_KOKKOSCORE_LIB} ${CMAKE_DL_LIBS})
  message(STATUS "Kokkos: ${PIPETRAIN_KOKKOSCORE_LIB} (headers in ${PIPETRAIN_KOKKOS_INCLUDE_DIR})")
endif()

# PCRE2 (8-bit): the BPE pre-tokenizer's Unicode letter and number classes.
find_path(PIPETRAIN_PCRE2_INCLUDE_DIR pcre2.h REQUIRED)
find_library(PIPETRAIN_PCRE2_LIB pcre2-8 REQUIRED)
add_library(pipetrain_pcre2 INTERFACE)
target_include_directories(pipetrain_pcre2 SYSTEM INTERFACE $<BUILD_INTERFACE:${PIPETRAIN_PCRE2_INCLUDE_DIR}>)
target_link_libraries(pipetrain_pcre2 INTERFACE ${PIPETRAIN_PCRE2_LIB})

find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 QUIET CONFIG)
if(NOT CLI11_FOUND)
  find_path(PIPETRAIN_CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 SYSTEM INTERFACE ${PIPETRAIN_CLI11_INCLUDE_DIR})
endif()
find_package(tomlplusplus QUIET CONFIG)
if(NOT TARGET tomlplusplus::tomlplusplus)
  find_path(PIPETRAIN_TOML_INCLUDE_DIR toml++/toml.h REQUIRED)
  add_library(tomlplusplus::tomlplusplus INTERFACE IMPORTED)
  target_include_directories(tomlplusplus::tomlplusplus SYSTEM INTERFACE ${PIPETRAIN_TOML_INCLUDE_DIR})
endif()
