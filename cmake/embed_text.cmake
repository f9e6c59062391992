# Writes a C++ source that holds a text file as a raw string literal, so the binary needs no file at
# run time (tpcli serve's chat page). Run at build time by CMakeLists.txt's add_custom_command:
#   cmake -DINPUT=page.html -DOUTPUT=page.cpp -DHEADER=serve/chat_page.h -DNAMESPACE=tpcli::serve
#         -DFUNCTION=chat_page -P embed_text.cmake
# The generated function returns the file's bytes exactly: std::string_view FUNCTION().
foreach(var INPUT OUTPUT HEADER NAMESPACE FUNCTION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "embed_text.cmake: -D${var}=... is missing")
  endif()
endforeach()
file(READ "${INPUT}" text)
# A raw string ends at )DELIM": the delimiter must not occur in the text (C++ allows 16 characters).
set(delimiter "tpcli_embed")
string(FIND "${text}" ")${delimiter}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "embed_text.cmake: ${INPUT} contains )${delimiter}\", which would end the raw string literal early; change the delimiter in ${CMAKE_CURRENT_LIST_FILE}")
endif()
get_filename_component(input_name "${INPUT}" NAME)
set(source "// Generated from ${input_name} by cmake/embed_text.cmake at build time: edit ${input_name}, not this file.
#include \"${HEADER}\"

namespace ${NAMESPACE} {

std::string_view ${FUNCTION}() {
  static constexpr char TEXT[] = R\"${delimiter}(${text})${delimiter}\";
  return {TEXT, sizeof(TEXT) - 1};
}

}  // namespace ${NAMESPACE}
")
# Written as is (no @VAR@ substitution), and copied over OUTPUT only when it changed.
file(WRITE "${OUTPUT}.tmp" "${source}")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
