# The layer table of docs/architecture.md: each nibble library may link only the libraries listed for it.
# nibble_add_library() refuses any other dependency, so the direction is enforced by the build.
set(NIBBLE_ALLOWED_DEPS_core "")
set(NIBBLE_ALLOWED_DEPS_formats "core")
set(NIBBLE_ALLOWED_DEPS_io "core;formats")
set(NIBBLE_ALLOWED_DEPS_ref "core;formats;io")
set(NIBBLE_ALLOWED_DEPS_cuda "core;formats;io")
set(NIBBLE_ALLOWED_DEPS_text "core")
set(NIBBLE_ALLOWED_DEPS_sampling "core")
set(NIBBLE_ALLOWED_DEPS_grammar "core")
set(NIBBLE_ALLOWED_DEPS_models "core;formats;io;ref;cuda")
set(NIBBLE_ALLOWED_DEPS_engine "core;formats;io;ref;cuda;models;sampling;text;grammar")
set(NIBBLE_ALLOWED_DEPS_server "core;formats;io;ref;cuda;models;sampling;engine;text;grammar")

# nibble_add_library(NAME SOURCES ... [DEPS layer...] [EXTERNAL target...])
# Creates target nibble_<NAME>; headers are included as "NAME/file.h" from src/.
function(nibble_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;EXTERNAL" ${ARGN})
  if(NOT DEFINED NIBBLE_ALLOWED_DEPS_${name})
    message(FATAL_ERROR "nibble: '${name}' is not in the layer table (cmake/layers.cmake)")
  endif()
  foreach(dep IN LISTS ARG_DEPS)
    if(NOT dep IN_LIST NIBBLE_ALLOWED_DEPS_${name})
      message(FATAL_ERROR "nibble: layer '${name}' may not depend on '${dep}' "
                          "(allowed: ${NIBBLE_ALLOWED_DEPS_${name}})")
    endif()
  endforeach()
  add_library(nibble_${name} STATIC ${ARG_SOURCES})
  target_include_directories(nibble_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  # -Wno-restrict: GCC 12 at -O3 reports false overlaps inside std::string (GCC bug 105329).
  target_compile_options(nibble_${name} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
      $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-restrict>)
  list(TRANSFORM ARG_DEPS PREPEND nibble_)
  target_link_libraries(nibble_${name} PUBLIC ${ARG_DEPS} ${ARG_EXTERNAL})
endfunction()
