# The CLI against its environment and output streams (each fixed here was
# wrong before):
# - a bad setting is a bad command line (exit 2), never 77 ("skipped": a CI
#   job would pass): MAPPING_HOST_DEVICES=0 with --backend host (was 77),
#   MAPPING_DEVICE past the back end's devices (was 77), MAPPING_HOST_LINK=nan
#   and an uncreatable MAPPING_TRACE (were 1), MAPPING_TRACE_MAX_EVENTS=lots,
#   any value the settings table refuses (MAPPING_TRACK=bogus was accepted);
#   mapping info still prints its whole report, and exits 2 (was 0);
# - an option without its value is named as written (--runs, not "-r");
# - MAPPING_TRACE=/dev/stdout with stdout a file or a pipe: the report, then
#   the trace (before: the file was replaced by the trace and the report
#   lost; a pipe got no trace, and a link to /proc/self/fd/1 was replaced
#   by a regular file);
# - MAPPING_TRACE_MAX_EVENTS bounds the trace; the command says how many
#   events were dropped, and the file's metadata counts them.
# -DMAPPING=path/to/mapping -DWORK=a scratch directory
set(quick bench --quick --only latency --runs 1)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

function(expect_exit want what)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 60)
  if(NOT rc EQUAL want OR NOT err MATCHES "${what}")
    message(FATAL_ERROR "${ARGN}: exit ${rc}, expected ${want} with a message matching '${what}'\n${out}\n${err}")
  endif()
  message(STATUS "exit ${rc}: ${ARGN}")
endfunction()

expect_exit(2 "MAPPING_HOST_DEVICES=\"0\"" MAPPING_HOST_DEVICES=0 ${MAPPING} ${quick} --backend host)
expect_exit(2 "MAPPING_HOST_DEVICES=\"x\"" MAPPING_HOST_DEVICES=x MAPPING_BACKEND=host ${MAPPING} ${quick})
expect_exit(2 "there is no device 5" MAPPING_DEVICE=5 ${MAPPING} ${quick} --backend host)
expect_exit(2 "MAPPING_HOST_LINK=\"nan\"" MAPPING_HOST_LINK=nan ${MAPPING} ${quick} --backend host)
# Any variable of the settings table (os/settings.c), even one the back end
# never reads: the message names it and what it accepts.
expect_exit(2 "MAPPING_TRACK=\"bogus\" is refused .*accepted: auto, uffd, mprotect or none" MAPPING_TRACK=bogus
            ${MAPPING} ${quick} --backend host)
expect_exit(2 "MAPPING_CUDA_SCATTER=\"fast\"" MAPPING_CUDA_SCATTER=fast ${MAPPING} ${quick} --backend host)
expect_exit(2 "MAPPING_TRACE=/nonexistent-dir/t.json" MAPPING_TRACE=/nonexistent-dir/t.json ${MAPPING} ${quick}
            --backend host)
expect_exit(2 "MAPPING_TRACE_MAX_EVENTS=\"lots\"" MAPPING_TRACE=${WORK}/t.json MAPPING_TRACE_MAX_EVENTS=lots
            ${MAPPING} ${quick} --backend host)
if(EXISTS ${WORK}/t.json)
  message(FATAL_ERROR "a refused MAPPING_TRACE_MAX_EVENTS left a trace")
endif()
# mapping info reports it all, and exits 2 (was 0) when a bad setting keeps
# the default device from opening.
foreach(case "MAPPING_HOST_LINK=nan|MAPPING_HOST_LINK" "MAPPING_HOST_DEVICES=0|MAPPING_HOST_DEVICES"
             "MAPPING_BACKEND=HOST|MAPPING_BACKEND=.HOST. is refused" "MAPPING_DEVICE=5|there is no device 5"
             "MAPPING_TRACE=/nonexistent-dir/t.json|MAPPING_TRACE" "MAPPING_MEMORY_BUDGET=1G|MAPPING_MEMORY_BUDGET")
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 setting)
  list(GET case 1 what)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=MAPPING_BACKEND ${setting} ${MAPPING} info --json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  string(JSON default ERROR_VARIABLE e TYPE "${out}" default)
  if(NOT rc EQUAL 2 OR e OR NOT default STREQUAL "NULL" OR NOT err MATCHES "mapping info: [^\n]*${what}")
    message(FATAL_ERROR "${setting} mapping info --json: exit ${rc}, default ${default} ${e}\n${out}\n${err}")
  endif()
  message(STATUS "exit 2, the whole report: ${setting} mapping info --json")
endforeach()
# mapping info shows the default device's memory budget ($MAPPING_MEMORY_BUDGET).
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=MAPPING_BACKEND MAPPING_MEMORY_BUDGET=1048576 ${MAPPING}
                info --json RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
string(JSON budget ERROR_VARIABLE e GET "${out}" memory_budget)
if(NOT rc EQUAL 0 OR e OR NOT budget EQUAL 1048576)
  message(FATAL_ERROR "MAPPING_MEMORY_BUDGET=1048576 mapping info --json: exit ${rc}, memory_budget ${budget} ${e}\n${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=MAPPING_BACKEND MAPPING_MEMORY_BUDGET=1048576 ${MAPPING} info
                RESULT_VARIABLE rc OUTPUT_VARIABLE out TIMEOUT 60)
if(NOT rc EQUAL 0 OR NOT out MATCHES "memory budget: 1048576 bytes")
  message(FATAL_ERROR "mapping info does not show MAPPING_MEMORY_BUDGET:\n${out}")
endif()
foreach(option runs backend device only sizes direction)
  expect_exit(2 "--${option} is unknown or lacks its value" ${MAPPING} bench --${option})
endforeach()

# MAPPING_TRACE=/dev/stdout: the report, then the trace, into a file and a pipe.
if(IS_SYMLINK /dev/stdout)
  foreach(into "> \"$1\"" "| cat > \"$1\"")
    file(REMOVE ${WORK}/out.txt)
    execute_process(COMMAND sh -c "MAPPING_TRACE=/dev/stdout \"$0\" info --json ${into}" ${MAPPING} ${WORK}/out.txt
                    RESULT_VARIABLE rc ERROR_VARIABLE err TIMEOUT 60)
    file(READ ${WORK}/out.txt out)
    string(FIND "${out}" "{\"displayTimeUnit\"" at)
    if(NOT rc EQUAL 0 OR at LESS 1)
      message(FATAL_ERROR "MAPPING_TRACE=/dev/stdout mapping info --json ${into}: exit ${rc}, the trace at ${at}:\n${out}\n${err}")
    endif()
    string(SUBSTRING "${out}" 0 ${at} report)
    string(SUBSTRING "${out}" ${at} -1 trace)
    string(JSON version ERROR_VARIABLE e1 GET "${report}" version)
    string(JSON events ERROR_VARIABLE e2 LENGTH "${trace}" traceEvents)
    if(e1 OR e2 OR NOT IS_SYMLINK /dev/stdout)
      message(FATAL_ERROR "MAPPING_TRACE=/dev/stdout ${into}: report ${e1}, trace ${e2}:\n${out}")
    endif()
    message(STATUS "MAPPING_TRACE=/dev/stdout ${into}: the report, then a trace of ${events} events")
  endforeach()
endif()

# The bound: at most 5 events kept, the rest dropped and counted.
execute_process(COMMAND ${CMAKE_COMMAND} -E env MAPPING_TRACE=${WORK}/bounded.json MAPPING_TRACE_MAX_EVENTS=5
                ${MAPPING} ${quick} --backend host RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
file(READ ${WORK}/bounded.json trace)
string(JSON max GET "${trace}" otherData max_events)
string(JSON kept GET "${trace}" otherData events)
string(JSON dropped GET "${trace}" otherData dropped_events)
if(NOT rc EQUAL 0 OR NOT max EQUAL 5 OR NOT kept EQUAL 5 OR dropped LESS 100
   OR NOT err MATCHES "warning: trace [^\n]*bounded.json: ${dropped} of [0-9]+ events were dropped")
  message(FATAL_ERROR "MAPPING_TRACE_MAX_EVENTS=5: exit ${rc}, max ${max}, kept ${kept}, dropped ${dropped}\n${err}")
endif()
message(STATUS "MAPPING_TRACE_MAX_EVENTS=5: ${kept} events kept, ${dropped} dropped, said on stderr")
file(REMOVE_RECURSE ${WORK})

# A driver library path that names a FIFO is refused at once with the
# reason (dlopen blocked for ever opening it: `mapping info` hung).
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND mkfifo ${WORK}/fifo.so RESULT_VARIABLE rc)
if(rc EQUAL 0)
  foreach(var MAPPING_OPENCL_LIBRARY MAPPING_CUDA_LIBRARY)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env ${var}=${WORK}/fifo.so ${MAPPING} info
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
    if(NOT rc EQUAL 0 OR NOT "${out}${err}" MATCHES "${var}=[^\n]*fifo.so: not a regular file")
      message(FATAL_ERROR "${var}=a FIFO: exit ${rc}, expected 0 naming the FIFO\n${out}\n${err}")
    endif()
    message(STATUS "${var}=a FIFO: refused, exit ${rc}")
  endforeach()
  file(REMOVE_RECURSE ${WORK})
else()
  message(STATUS "SKIP the FIFO library case: mkfifo failed")
endif()
