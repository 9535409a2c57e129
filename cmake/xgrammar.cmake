# xgrammar's C++ core as a static library, from the sdist scripts/setup.sh fetches (docs/third_party.md):
# the sources xgrammar's own CMakeLists.txt builds (cpp/**.cc less the Python bindings in cpp/tvm_ffi),
# built here without its -Werror and LTO flags, so a compiler's new warning cannot break our build.
set(NIBBLE_XGRAMMAR_DIR "${PROJECT_SOURCE_DIR}/.deps/xgrammar-0.2.8"
    CACHE PATH "xgrammar sdist directory, from scripts/setup.sh")
if(NOT EXISTS "${NIBBLE_XGRAMMAR_DIR}/include/xgrammar/xgrammar.h")
  message(FATAL_ERROR "nibble: xgrammar not found at ${NIBBLE_XGRAMMAR_DIR}; run scripts/setup.sh")
endif()
file(GLOB_RECURSE NIBBLE_XGRAMMAR_SOURCES CONFIGURE_DEPENDS "${NIBBLE_XGRAMMAR_DIR}/cpp/*.cc")
list(FILTER NIBBLE_XGRAMMAR_SOURCES EXCLUDE REGEX "/cpp/tvm_ffi/.*\\.cc$")
add_library(nibble_xgrammar_core STATIC ${NIBBLE_XGRAMMAR_SOURCES})
set_target_properties(nibble_xgrammar_core PROPERTIES CXX_STANDARD 17 POSITION_INDEPENDENT_CODE ON
                                                      CXX_CLANG_TIDY "" CXX_INCLUDE_WHAT_YOU_USE "")
target_compile_options(nibble_xgrammar_core PRIVATE -O3 -w)
target_compile_definitions(nibble_xgrammar_core PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0)
target_include_directories(nibble_xgrammar_core SYSTEM PUBLIC "${NIBBLE_XGRAMMAR_DIR}/include")
target_include_directories(nibble_xgrammar_core SYSTEM PUBLIC "${NIBBLE_XGRAMMAR_DIR}/3rdparty/picojson"
                                                              "${NIBBLE_XGRAMMAR_DIR}/3rdparty/dlpack/include")
target_link_libraries(nibble_xgrammar_core PUBLIC Threads::Threads)
