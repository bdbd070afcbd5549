# libplugin_KVBRIDGE.so: kvbridge as a NIXL backend plug-in (docs/nixl.md).
# NIXL_INCLUDE_DIR: NIXL's headers laid out as an install with
# -Dinstall_headers=true makes them (nixl_types.h, backend/backend_plugin.h,
# utils/common/nixl_log.h, telemetry_event.h ...) plus the abseil headers
# its logging header includes (absl/log/...), or NIXL_ABSL_INCLUDE_DIR for
# those; scripts/nixl-headers.sh assembles one from source checkouts.
# The plug-in is self-contained (kvbridge linked in statically, nothing of
# NIXL's libraries needed: NIXL loads plug-ins RTLD_LOCAL), so it loads into
# the PyPI wheel's NIXL as into a source build.
set(NIXL_INCLUDE_DIR "" CACHE PATH "NIXL's headers (an install's include/ or an assembled folder)")
set(NIXL_ABSL_INCLUDE_DIR "" CACHE PATH "abseil's headers, when not inside NIXL_INCLUDE_DIR")
if(NOT EXISTS "${NIXL_INCLUDE_DIR}/backend/backend_plugin.h")
  message(FATAL_ERROR "KVB_NIXL=ON needs NIXL_INCLUDE_DIR, a folder with backend/backend_plugin.h "
                      "(got '${NIXL_INCLUDE_DIR}'); see docs/nixl.md")
endif()
set(_kvb_nixl_inc ${NIXL_INCLUDE_DIR} ${NIXL_INCLUDE_DIR}/backend)
foreach(_d utils core/telemetry)
  if(EXISTS "${NIXL_INCLUDE_DIR}/${_d}")
    list(APPEND _kvb_nixl_inc "${NIXL_INCLUDE_DIR}/${_d}")
  endif()
endforeach()
if(NIXL_ABSL_INCLUDE_DIR)
  list(APPEND _kvb_nixl_inc ${NIXL_ABSL_INCLUDE_DIR})
endif()

enable_language(CXX)
add_library(kvbridge_nixl MODULE ${PROJECT_SOURCE_DIR}/compat/nixl/kvb_nixl.cpp)
# NIXL's headers and abseil's are not ours: no warnings from them.
target_include_directories(kvbridge_nixl SYSTEM PRIVATE ${_kvb_nixl_inc})
target_link_libraries(kvbridge_nixl PRIVATE kvbridge_static)
# C's struct kvb_engine_limits and function kvb_engine_limits share a name,
# which g++'s -Wshadow calls hiding a constructor.
target_compile_options(kvbridge_nixl PRIVATE -Wno-shadow)
# kvbridge's symbols stay inside the plug-in; an undefined symbol (abseil,
# libnixl_*) fails the link here instead of NIXL's dlopen at run time.
# Only NIXL's two entry points are exported.
file(WRITE ${CMAKE_BINARY_DIR}/kvb_nixl.map
  "{ global: nixl_plugin_init; nixl_plugin_fini; local: *; };\n")
target_link_options(kvbridge_nixl PRIVATE -Wl,--exclude-libs,ALL -Wl,--no-undefined
  -Wl,--as-needed -Wl,--version-script=${CMAKE_BINARY_DIR}/kvb_nixl.map)
set_target_properties(kvbridge_nixl PROPERTIES
  PREFIX "lib" OUTPUT_NAME plugin_KVBRIDGE
  CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
# NIXL's wheel and source builds use libstdc++'s new string ABI.
target_compile_definitions(kvbridge_nixl PRIVATE _GLIBCXX_USE_CXX11_ABI=1)
install(TARGETS kvbridge_nixl LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/kvbridge/nixl-plugins)
