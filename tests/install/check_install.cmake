# Installs the build into a scratch prefix, then builds tests/install/app.c
# against it, HOW = pkgconfig: `cc app.c $(pkg-config --cflags --libs mapping)`,
# or HOW = find_package: a CMake project with find_package(mapping). The
# program must run. HOW = subdirectory: a parent project includes the source
# tree with add_subdirectory, links mapping::mapping_static, and gets none of
# mapping's tests. HOW = mpi_pkgconfig / mpi_find_package: the same for
# libmapping_mpi (tests/install/mpi_app.c: `cc mpi_app.c $(pkg-config
# --cflags --libs mapping_mpi)`, or find_package(mapping COMPONENTS mpi) and
# mapping::mapping_mpi), run on 2 ranks with MPIEXEC. HOW = readme: the
# commands of README.md's install section, as written
# (check_readme_install.cmake).
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

if(HOW STREQUAL "readme") # README.md's install section, as written
  include(${CMAKE_CURRENT_LIST_DIR}/check_readme_install.cmake)
  return()
endif()

if(HOW STREQUAL "subdirectory")
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/subdirectory -B ${WORK_DIR}/parent
      -DMAPPING_SOURCE_DIR=${SOURCE_DIR} -DCMAKE_C_COMPILER=${C_COMPILER} -DMAPPING_WITH_CUDA=OFF
      -DMAPPING_WITH_OPENCL=OFF)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/parent --target parent_app -j2)
  run(${WORK_DIR}/parent/parent_app)
  execute_process(COMMAND ${CMAKE_CTEST_COMMAND} -N --test-dir ${WORK_DIR}/parent OUTPUT_VARIABLE listed)
  if(NOT listed MATCHES "Total Tests: 1\n")
    message(FATAL_ERROR "the parent project should have its one test only:\n${listed}")
  endif()
  message(STATUS "add_subdirectory: the parent has its own test only, and links mapping::mapping_static")
  return()
endif()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f bin/mapping bin/mapping-plot-bench include/mapping.h share/doc/mapping/LICENSE share/man/man1/mapping.1)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "missing after install: ${f}")
  endif()
endforeach()
file(GLOB libdirs ${prefix}/lib ${prefix}/lib64 ${prefix}/lib/*-linux-gnu)
set(pcdir "")
foreach(d ${libdirs})
  if(EXISTS ${d}/pkgconfig/mapping.pc AND EXISTS ${d}/libmapping.so AND EXISTS ${d}/libmapping.a)
    set(pcdir ${d}/pkgconfig)
  endif()
endforeach()
if(NOT pcdir)
  message(FATAL_ERROR "no lib dir with libmapping.so, libmapping.a and pkgconfig/mapping.pc under ${prefix}")
endif()

# While the version is 0.x, the package accepts only the same minor version.
get_filename_component(libdir ${pcdir} DIRECTORY)
set(PACKAGE_FIND_VERSION_MAJOR 0)
set(PACKAGE_FIND_VERSION_MINOR 0)
set(PACKAGE_FIND_VERSION 0.0)
include(${libdir}/cmake/mapping/mapping-config-version.cmake)
if(PACKAGE_VERSION MATCHES "^0\\." AND PACKAGE_VERSION_COMPATIBLE)
  message(FATAL_ERROR "mapping ${PACKAGE_VERSION} claims to be compatible with a request for 0.0")
endif()

if(HOW MATCHES "^mpi_")
  set(mpirun ${MPIEXEC} -np 2 --oversubscribe --timeout 60)
  if(NOT EXISTS ${pcdir}/mapping_mpi.pc OR NOT EXISTS ${libdir}/libmapping_mpi.so
     OR NOT EXISTS ${libdir}/cmake/mapping/mappingMpiTargets.cmake OR NOT EXISTS ${prefix}/include/mapping_mpi.h)
    message(FATAL_ERROR "missing after install: mapping_mpi.pc, libmapping_mpi.so, mappingMpiTargets.cmake or mapping_mpi.h")
  endif()
  if(HOW STREQUAL "mpi_pkgconfig")
    set(ENV{PKG_CONFIG_PATH} ${pcdir})
    run(pkg-config --cflags --libs mapping_mpi)
    string(STRIP "${last_output}" flags)
    if(NOT flags MATCHES "-lmapping_mpi" OR NOT flags MATCHES "-lmapping( |$)" OR flags MATCHES ";")
      message(FATAL_ERROR "pkg-config --libs mapping_mpi: ${flags}")
    endif()
    separate_arguments(flags UNIX_COMMAND "${flags}")
    # The plain compiler, not mpicc: the .pc file brings MPI's flags.
    run(${C_COMPILER} ${SOURCE_DIR}/tests/install/mpi_app.c ${flags} -o ${WORK_DIR}/mpi_app)
    run(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} ${mpirun} ${WORK_DIR}/mpi_app)
  else()
    run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/mpi_consumer -B ${WORK_DIR}/consumer
        -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${C_COMPILER})
    run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
    run(${mpirun} ${WORK_DIR}/consumer/mpi_consumer)
    # A component the package does not have fails find_package, saying so.
    execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/mpi_consumer -B ${WORK_DIR}/nocomp
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${C_COMPILER} -DMAPPING_COMPONENT=nosuch
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(rc EQUAL 0)
      message(FATAL_ERROR "find_package(mapping COMPONENTS nosuch) succeeded")
    endif()
  endif()
  if(NOT last_output MATCHES "ok on 2 ranks")
    message(FATAL_ERROR "the MPI program said: ${last_output}")
  endif()
  message(STATUS "${HOW}: ${last_output}")
elseif(HOW STREQUAL "static_pkgconfig")
  # mapping-static.pc links libmapping.a: the program runs with no
  # libmapping.so to be found, and does not ask for one.
  set(ENV{PKG_CONFIG_PATH} ${pcdir})
  run(pkg-config --cflags --libs mapping-static)
  string(STRIP "${last_output}" flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run(${C_COMPILER} ${SOURCE_DIR}/tests/install/app.c ${flags} -o ${WORK_DIR}/app_static)
  run(${WORK_DIR}/app_static)
  set(said "${last_output}")
  find_program(READELF readelf)
  if(READELF)
    run(${READELF} -d ${WORK_DIR}/app_static)
    if(last_output MATCHES "libmapping")
      message(FATAL_ERROR "linked with mapping-static.pc, the program still needs libmapping.so:\n${last_output}")
    endif()
  endif()
  message(STATUS "pkg-config mapping-static build: ${said}")
elseif(HOW STREQUAL "pkgconfig")
set(ENV{PKG_CONFIG_PATH} ${pcdir})
run(pkg-config --cflags --libs mapping)
string(STRIP "${last_output}" flags)
if(flags MATCHES "rpath")
  message(FATAL_ERROR "mapping.pc must not carry an rpath (distributions reject it): ${flags}")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${C_COMPILER} ${SOURCE_DIR}/tests/install/app.c ${flags} -o ${WORK_DIR}/app_pkgconfig)
run(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} ${WORK_DIR}/app_pkgconfig)
message(STATUS "pkg-config build: ${last_output}")
else()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/consumer
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${C_COMPILER})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run(${WORK_DIR}/consumer/consumer)
message(STATUS "find_package build: ${last_output}")
endif()
