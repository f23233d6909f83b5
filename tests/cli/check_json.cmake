# Runs a mapping command that prints JSON on stdout and checks that it parses
# and holds the expected keys. -DCOMMAND="mapping;bench;..." -DKEYS="a;b"
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${COMMAND} failed (${rc}):\n${err}")
endif()
foreach(key ${KEYS})
  string(JSON value ERROR_VARIABLE json_error GET "${out}" ${key})
  if(json_error)
    message(FATAL_ERROR "key ${key}: ${json_error}\noutput:\n${out}")
  endif()
  message(STATUS "${key} = ${value}")
endforeach()
