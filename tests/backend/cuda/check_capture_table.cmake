# lint.capture_table: every public function of include/mapping.h that takes
# a stream or an event (a mapping_stream *, a mapping_event *, or a native
# queue), and the blocking calls that run on the device's native queue, is a
# row of the capture table of tests/conformance/capture.c, which runs each
# one while a stream is being captured into a CUDA graph. A new such
# function fails here until the table (and docs/cuda.md's) has it.
#   cmake -DHEADER=include/mapping.h -DTABLE=tests/conformance/capture.c -P check_capture_table.cmake
file(READ ${HEADER} header)
file(READ ${TABLE} table)
string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" "" header "${header}") # comments
string(REGEX REPLACE "[\r\n\t ]+" " " header "${header}")
string(REPLACE ";" "`" header "${header}") # CMake lists are ;-separated: declarations end with ` here
string(REGEX MATCHALL "MAPPING_API [^`{]*\\([^`{]*\\) *`" prototypes "${header}")
set(missing "")
set(count 0)
foreach(p IN LISTS prototypes)
  if(NOT p MATCHES "([a-z_0-9]+) *\\(([^()]*)\\) *`$")
    continue()
  endif()
  set(name ${CMAKE_MATCH_1})
  set(params "${CMAKE_MATCH_2}")
  if(params MATCHES "mapping_stream \\*|mapping_event \\*|native_queue" OR
     name MATCHES "^mapping_(sync_to_gpu|sync_to_cpu|pipeline_run|multimirror_sync_to_cpu)$")
    math(EXPR count "${count} + 1")
    string(FIND "${table}" "{\"${name}\"" at)
    if(at EQUAL -1)
      list(APPEND missing ${name})
    endif()
  endif()
endforeach()
if(count LESS 20)
  message(FATAL_ERROR "check_capture_table: only ${count} stream-taking functions found in ${HEADER}: the parse is broken")
endif()
if(missing)
  string(REPLACE ";" ", " missing "${missing}")
  message(FATAL_ERROR "tests/conformance/capture.c: the capture table has no row for ${missing}: add each with "
    "what it does under stream capture (recorded, refused or run now), and a line to docs/cuda.md's table")
endif()
message(STATUS "check_capture_table: ${count} stream-taking public functions, each in the capture table")
