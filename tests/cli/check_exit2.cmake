# Bad command lines exit 2 with a message on stderr and run nothing.
# -DMAPPING=path/to/mapping
set(cases
  "bench|--only|foo" "bench|--backend|nope" "bench|--device|abc" "bench|--device|-1" "bench|--runs|0"
  "bench|--runs|65" "bench|--runs|3x" "bench|--sizes|1K,2K" "bench|--sizes|4K,1K,2" "bench|--sizes|1K,4K,1"
  "bench|--sizes|1K,2K,1.0000000000000002" "bench|--sizes|1K,2K,1.0009"
  "bench|--direction|sideways" "bench|--direction|h2d,,d2h" "bench|--sizes|1K,2K,2," "bench|--sizes|1K,,2K,2"
  "bench|--only|,latency" "bench|--only|latency,,trace" "bench|--bogus" "bench|--json|--csv" "bench|stray" "info|--bogus" "info|stray"
  "nonsense")
foreach(case ${cases})
  string(REPLACE "|" " " shown "${case}")
  string(REPLACE "|" ";" args "${case}")
  # A command line that should be refused may instead run forever (a --sizes
  # factor that never grows the size): bounded.
  execute_process(COMMAND ${MAPPING} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "mapping ${shown}: exit ${rc}, expected 2\n${out}\n${err}")
  endif()
  if(err STREQUAL "")
    message(FATAL_ERROR "mapping ${shown}: exit 2 without a message on stderr")
  endif()
  if(out MATCHES "GB/s")
    message(FATAL_ERROR "mapping ${shown}: ran a benchmark before refusing:\n${out}")
  endif()
  string(REGEX REPLACE "\n.*" "" first "${err}")
  message(STATUS "mapping ${shown} -> 2: ${first}")
endforeach()
foreach(cmd "--version" "bench|--version" "info|--version")
  string(REPLACE "|" ";" args "${cmd}")
  execute_process(COMMAND ${MAPPING} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "[0-9]+\\.[0-9]+\\.[0-9]+")
    message(FATAL_ERROR "mapping ${cmd}: exit ${rc}, output '${out}'")
  endif()
endforeach()

# A misspelt back end in the environment is a bad command line too (exit 2),
# not a back end that is absent here (77, "skipped": a CI job would pass).
execute_process(COMMAND ${CMAKE_COMMAND} -E env MAPPING_BACKEND=HOST ${MAPPING} bench --quick --only latency
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 2 OR NOT err MATCHES "MAPPING_BACKEND=HOST")
  message(FATAL_ERROR "MAPPING_BACKEND=HOST mapping bench: exit ${rc}, expected 2 naming the variable\n${out}\n${err}")
endif()

# --device 0 is device 0, whatever $MAPPING_DEVICE says (it applies only
# without --device).
execute_process(COMMAND ${CMAKE_COMMAND} -E env MAPPING_HOST_DEVICES=3 MAPPING_DEVICE=2
                ${MAPPING} bench --quick --backend host --device 0 --only latency --runs 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0 OR NOT out MATCHES "device 0:" OR out MATCHES "device 2:")
  message(FATAL_ERROR "MAPPING_DEVICE=2 mapping bench --device 0: exit ${rc}, not on device 0\n${out}\n${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env MAPPING_HOST_DEVICES=3 MAPPING_DEVICE=2
                ${MAPPING} bench --quick --backend host --only latency --runs 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0 OR NOT out MATCHES "device 2:")
  message(FATAL_ERROR "MAPPING_DEVICE=2 mapping bench (no --device): exit ${rc}, not on device 2\n${out}\n${err}")
endif()
