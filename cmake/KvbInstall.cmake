# `cmake --install <build> [--prefix P]`: what a framework links against.
#
#   bin/kvbridge                              the CLI (runtime)
#   <libdir>/libkvbridge.so.<version>, .so.0  shared library, SONAME libkvbridge.so.0 (runtime)
#   <libdir>/libkvbridge.so, libkvbridge.a    link-time name, static library (development)
#   <libdir>/libkvbridge_ts_mooncake.so       TokenSpeed's ts_mooncake_* C ABI v1 (runtime)
#   include/kvbridge/*.h                      public headers (development)
#   <libdir>/pkgconfig/kvbridge.pc            pkg-config (development)
#   <libdir>/cmake/kvbridge/                  find_package(kvbridge): kvbridge::kvbridge,
#                                             kvbridge::kvbridge_static (development)
#
# Components "runtime" and "development" let a packager split the two
# (`cmake --install build --component runtime`). The pkg-config file and the
# CMake package locate the prefix from their own path, so a tree installed
# with --prefix (or DESTDIR) and moved elsewhere still works.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KVB_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvbridge)

install(TARGETS kvbridge kvbridge_static EXPORT kvbridgeTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# TokenSpeed's C ABI: <libdir>/libkvbridge_ts_mooncake.so, header
# include/kvbridge/ts_mooncake.h (with the others).
install(TARGETS kvbridge_ts_mooncake LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
install(TARGETS kvbridge_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvbridge DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT development FILES_MATCHING PATTERN "*.h")

# The CMake package. The exported static target links kvbridge::deps (its
# install interface, CMakeLists.txt), which kvbridgeConfig.cmake makes from the
# consumer's own pkg-config lookups before loading kvbridgeTargets.cmake.
install(EXPORT kvbridgeTargets NAMESPACE kvbridge:: DESTINATION ${KVB_CMAKE_DIR}
  COMPONENT development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvbridgeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvbridgeConfig.cmake INSTALL_DESTINATION ${KVB_CMAKE_DIR})
# 0.x: a minor release may change the API, so only the same major.minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvbridgeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvbridgeConfig.cmake
  ${PROJECT_BINARY_DIR}/kvbridgeConfigVersion.cmake
  DESTINATION ${KVB_CMAKE_DIR} COMPONENT development)

# pkg-config. prefix is ${pcfiledir}/<up to the prefix> when the install dirs
# are relative (the usual case), so the file is right whatever --prefix or
# DESTDIR the install used; absolute install dirs are written as they are.
set(KVB_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${KVB_PC_DIR}")
  set(KVB_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _up "/kvb_root/${KVB_PC_DIR}" "/kvb_root")
  string(REGEX REPLACE "/$" "" _up "${_up}")
  set(KVB_PC_PREFIX "\${pcfiledir}/${_up}")
endif()
foreach(d LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${d}}")
    set(KVB_PC_${d} "${CMAKE_INSTALL_${d}}")
  else()
    set(KVB_PC_${d} "\${prefix}/${CMAKE_INSTALL_${d}}")
  endif()
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvbridge.pc.in ${PROJECT_BINARY_DIR}/kvbridge.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvbridge.pc DESTINATION ${KVB_PC_DIR} COMPONENT development)
