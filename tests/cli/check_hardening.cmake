# The CLI under hostile conditions (issue 24 item 6):
# - a report that cannot be written (stdout closed, /dev/full) exits 1 and
#   says so on stderr, for info, info --json, bench and --version;
# - --device N on a back end that has devices but not N exits 2 with the
#   valid range (not 77, "unavailable");
# - MAPPING_HOST_DEVICES=0 is refused (the default open names it) instead of
#   silently switching the default back end;
# - mapping info lists all 64 host devices, in text and JSON.
# -DMAPPING=path/to/mapping
set(quick_bench bench --quick --backend host --only latency --runs 1)
foreach(redirect ">&-" ">/dev/full")
  foreach(cmd "info" "info --json" "${quick_bench}" "${quick_bench} --json" "--version")
    string(REPLACE ";" " " cmd "${cmd}")
    execute_process(COMMAND sh -c "\"$0\" ${cmd} ${redirect}" ${MAPPING} RESULT_VARIABLE rc ERROR_VARIABLE err
                    TIMEOUT 120)
    if(NOT rc EQUAL 1 OR NOT err MATCHES "could not be written")
      message(FATAL_ERROR "mapping ${cmd} ${redirect}: exit ${rc}, expected 1 with a message; stderr:\n${err}")
    endif()
    message(STATUS "mapping ${cmd} ${redirect} -> 1")
  endforeach()
endforeach()

foreach(case "--backend|host|--device|5" "--device|5")
  string(REPLACE "|" ";" args "${case}")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env MAPPING_BACKEND=host ${MAPPING} bench ${args} --only latency
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "host has 1 device \\(valid: 0\\.\\.0\\)")
    message(FATAL_ERROR "mapping bench ${case}: exit ${rc}, expected 2 naming the range; stderr:\n${err}")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -E env MAPPING_HOST_DEVICES=3 ${MAPPING} bench --backend host --device 3
                RESULT_VARIABLE rc ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 2 OR NOT err MATCHES "host has 3 devices \\(valid: 0\\.\\.2\\)")
  message(FATAL_ERROR "3 host devices, --device 3: exit ${rc}; stderr:\n${err}")
endif()

foreach(value 0 00 abc 65)
  string(REPLACE "--backend;host;" "" default_bench "${quick_bench}")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=MAPPING_BACKEND MAPPING_HOST_DEVICES=${value}
                  ${MAPPING} ${default_bench} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  if(rc EQUAL 0 OR NOT err MATCHES "MAPPING_HOST_DEVICES=\"${value}\"")
    message(FATAL_ERROR "MAPPING_HOST_DEVICES=${value}, default back end: exit ${rc}, expected a refusal naming "
      "the variable; stdout:\n${out}\nstderr:\n${err}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=MAPPING_BACKEND MAPPING_HOST_DEVICES=${value}
                  ${MAPPING} info RESULT_VARIABLE rc OUTPUT_VARIABLE out TIMEOUT 120)
  if(NOT out MATCHES "no default device: [^\n]*MAPPING_HOST_DEVICES")
    message(FATAL_ERROR "MAPPING_HOST_DEVICES=${value}: mapping info shows a default back end:\n${out}")
  endif()
  message(STATUS "MAPPING_HOST_DEVICES=${value}: refused")
endforeach()

execute_process(COMMAND ${CMAKE_COMMAND} -E env MAPPING_HOST_DEVICES=64 ${MAPPING} info --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out TIMEOUT 120)
string(JSON host_devices LENGTH "${out}" backends 0 devices)
string(JSON host_name GET "${out}" backends 0 name)
if(NOT rc EQUAL 0 OR NOT host_name STREQUAL "host" OR NOT host_devices EQUAL 64)
  message(FATAL_ERROR "mapping info --json lists ${host_devices} of 64 host devices (exit ${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env MAPPING_HOST_DEVICES=64 ${MAPPING} info OUTPUT_VARIABLE out TIMEOUT 120)
if(NOT out MATCHES "\\[63\\] host memory \\(built-in back end\\), virtual device 63")
  message(FATAL_ERROR "mapping info does not list host device 63:\n${out}")
endif()
