# `mapping bench` with MAPPING_TRACE on a device that takes no bytes
# (/dev/full): the trace cannot be written, so the command must fail (exit 1,
# the reason on stderr), not exit 0 and print the failure after the status.
# -DMAPPING=path
if(NOT EXISTS /dev/full)
  message(STATUS "SKIP: no /dev/full here")
  return()
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env MAPPING_TRACE=/dev/full
                ${MAPPING} bench --quick --backend host --only latency --runs 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "exit ${rc}, expected 1:\n${out}\n${err}")
endif()
if(NOT err MATCHES "cannot write the trace to /dev/full")
  message(FATAL_ERROR "no reason on stderr:\n${err}")
endif()
