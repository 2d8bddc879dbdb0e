# Install rules: `cmake --install BUILD --prefix P` gives
#   P/bin/pipetrain
#   P/<libdir>/libpipetrain.a                      (target pipetrain_lib)
#   P/include/pipetrain/**                         public headers
#   P/<libdir>/cmake/pipetrain/pipetrainConfig.cmake, pipetrainConfigVersion.cmake,
#                              pipetrainTargets*.cmake  -> find_package(pipetrain CONFIG)
#                                                          gives pipetrain::pipetrain
#   P/share/modulefiles/pipetrain/<version>.lua    Lmod modulefile (modules/pipetrain.lua.in)
#   P/share/doc/pipetrain/README.md
#   P/share/pipetrain/{jobscripts,inputs}          launch scripts, configs, sample schedules
# Included from the top-level CMakeLists.txt after the targets exist; it only adds
# install/export rules and changes nothing about how the targets are built.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(PIPETRAIN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/pipetrain"
    CACHE STRING "Where pipetrainConfig.cmake is installed (relative to the prefix)")

# --- Targets ------------------------------------------------------------------------
# The installed executable keeps the RPATH to the dependency libraries it was linked
# against outside the build tree (MPI, HDF5, OpenBLAS under non-default directories).
set_target_properties(pipetrain PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS pipetrain RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# The library is exported as pipetrain::pipetrain. Its PUBLIC usage requirements name
# the INTERFACE targets of PipetrainDependencies.cmake (HDF5, BLAS, Kokkos as found at
# build time, with their absolute paths), so they travel in the same export set
# (as pipetrain::pipetrain_hdf5, ...). pipetrain_warnings only appears as a
# $<LINK_ONLY:> dependency of the static library and adds nothing for consumers.
set_target_properties(pipetrain_lib PROPERTIES EXPORT_NAME pipetrain)
install(TARGETS pipetrain_lib pipetrain_hdf5 pipetrain_blas pipetrain_kokkos pipetrain_pcre2 pipetrain_onednn
               pipetrain_warnings
  EXPORT pipetrainTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/pipetrain
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h")
install(EXPORT pipetrainTargets
  NAMESPACE pipetrain::
  FILE pipetrainTargets.cmake
  DESTINATION ${PIPETRAIN_INSTALL_CMAKEDIR})

# --- Package config -------------------------------------------------------------------
# What the build found, so that pipetrainConfig.cmake asks for the same packages.
if(TARGET OpenBLAS::OpenBLAS OR OpenBLAS_FOUND)
  set(PIPETRAIN_CONFIG_BLAS "OpenBLAS")
else()
  set(PIPETRAIN_CONFIG_BLAS "BLAS")
endif()
get_target_property(_pt_kokkos_links pipetrain_kokkos INTERFACE_LINK_LIBRARIES)
if("Kokkos::kokkos" IN_LIST _pt_kokkos_links)
  set(PIPETRAIN_CONFIG_KOKKOS "target")
else()
  set(PIPETRAIN_CONFIG_KOKKOS "library")
endif()
if(CLI11_FOUND)
  set(PIPETRAIN_CONFIG_CLI11 "package")
else()
  set(PIPETRAIN_CONFIG_CLI11 "headers")
endif()
if(tomlplusplus_FOUND)
  set(PIPETRAIN_CONFIG_TOML "package")
else()
  set(PIPETRAIN_CONFIG_TOML "headers")
endif()

# The optional CUDA backend (cmake/PipetrainCuda.cmake) links the CUDA runtime and
# cuBLAS by path, so the package needs nothing from CUDAToolkit; it is only reported.
if(PIPETRAIN_CUDA)
  set(PIPETRAIN_CONFIG_CUDA "ON (CUDA ${CUDAToolkit_VERSION}, architectures ${PIPETRAIN_CUDA_ARCHITECTURES})")
else()
  set(PIPETRAIN_CONFIG_CUDA "OFF")
endif()
# One line naming the MPI library (FindMPI leaves the version string empty when it
# cannot run a test program, e.g. when cross-compiling).
string(REGEX REPLACE "[\r\n].*" "" PIPETRAIN_CONFIG_MPI "${MPI_C_LIBRARY_VERSION_STRING}")
if(NOT PIPETRAIN_CONFIG_MPI)
  list(GET MPI_C_LIBRARIES 0 PIPETRAIN_CONFIG_MPI)
endif()
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/pipetrainConfig.cmake.in
  ${PROJECT_BINARY_DIR}/pipetrainConfig.cmake
  INSTALL_DESTINATION ${PIPETRAIN_INSTALL_CMAKEDIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
# 0.x: a minor release may break the API, so only the same major.minor is compatible.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/pipetrainConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/pipetrainConfig.cmake
  ${PROJECT_BINARY_DIR}/pipetrainConfigVersion.cmake
  DESTINATION ${PIPETRAIN_INSTALL_CMAKEDIR})

# --- Documentation, scripts, inputs ------------------------------------------------------
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/jobscripts/
  DESTINATION ${CMAKE_INSTALL_DATADIR}/pipetrain/jobscripts
  USE_SOURCE_PERMISSIONS)
install(FILES ${PROJECT_SOURCE_DIR}/inputs/austen.txt
  DESTINATION ${CMAKE_INSTALL_DATADIR}/pipetrain/inputs)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/inputs/
  DESTINATION ${CMAKE_INSTALL_DATADIR}/pipetrain/inputs
  FILES_MATCHING PATTERN "*.toml" PATTERN "*.csv")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/inputs/tokenizers
  DESTINATION ${CMAKE_INSTALL_DATADIR}/pipetrain/inputs)

# --- Lmod modulefile ----------------------------------------------------------------------
# Generated at install time, not configure time, so that it names the prefix actually
# installed to (`cmake --install build --prefix P`); with DESTDIR it still names P.
set(_pt_module_code "")
foreach(_v IN ITEMS PROJECT_VERSION CMAKE_CXX_COMPILER_ID CMAKE_CXX_COMPILER_VERSION CMAKE_BUILD_TYPE
                    CMAKE_INSTALL_BINDIR CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_INCLUDEDIR
                    CMAKE_INSTALL_DATADIR CMAKE_INSTALL_DOCDIR PIPETRAIN_INSTALL_CMAKEDIR
                    MPI_C_VERSION HDF5_VERSION HDF5_IS_PARALLEL
                    OpenBLAS_VERSION PIPETRAIN_CONFIG_BLAS PIPETRAIN_CONFIG_KOKKOS
                    PIPETRAIN_CONFIG_CUDA)
  string(APPEND _pt_module_code "set(${_v} [==[${${_v}}]==])\n")
endforeach()
string(APPEND _pt_module_code "set(PIPETRAIN_MODULE_MPI [==[${PIPETRAIN_CONFIG_MPI}]==])\n")
file(WRITE ${PROJECT_BINARY_DIR}/pipetrain_modulefile.cmake "${_pt_module_code}
# Full paths: a relative GNUInstallDirs value is under the install prefix.
foreach(_d IN ITEMS BINDIR LIBDIR INCLUDEDIR DATADIR DOCDIR)
  if(IS_ABSOLUTE \"\${CMAKE_INSTALL_\${_d}}\")
    set(PIPETRAIN_MODULE_\${_d} \"\${CMAKE_INSTALL_\${_d}}\")
  else()
    set(PIPETRAIN_MODULE_\${_d} \"\${CMAKE_INSTALL_PREFIX}/\${CMAKE_INSTALL_\${_d}}\")
  endif()
endforeach()
configure_file([==[${PROJECT_SOURCE_DIR}/modules/pipetrain.lua.in]==]
               [==[${PROJECT_BINARY_DIR}/modules/pipetrain-install.lua]==] @ONLY)
")
install(CODE "include([==[${PROJECT_BINARY_DIR}/pipetrain_modulefile.cmake]==])")
install(FILES ${PROJECT_BINARY_DIR}/modules/pipetrain-install.lua
  DESTINATION ${CMAKE_INSTALL_DATADIR}/modulefiles/pipetrain
  RENAME ${PROJECT_VERSION}.lua)
