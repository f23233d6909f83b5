# example.install: follows README.md's "Install and use from your project"
# as written. The shell blocks marked <!-- example.install: NAME --> are
# taken from the README and run with sh, with HOME a scratch folder (so
# "$HOME/.local" is the prefix) and `cc` the build's compiler:
# - install: the `cmake -S . -B build` and `cmake --build build` lines are
#   skipped (the build under test is that build, already made: configuring
#   it again would change it under the other tests); `cmake --install build
#   --prefix "$HOME/.local"` runs as written, `build` being that build;
# - CMakeLists.txt + cmake: a consumer project with find_package, built and
#   run (it must print "ok");
# - pkg-config + LD_LIBRARY_PATH: app.c built with the rpath, run; then
#   built without it and run with LD_LIBRARY_PATH.
# Included by check_install.cmake (HOW = readme), which defines run().
file(READ ${SOURCE_DIR}/README.md readme)

# The first fenced block after <!-- example.install: NAME -->.
function(readme_block name var)
  set(marker "<!-- example.install: ${name} -->")
  string(FIND "${readme}" "${marker}" at)
  if(at LESS 0)
    message(FATAL_ERROR "README.md has no block marked '${marker}'")
  endif()
  string(SUBSTRING "${readme}" ${at} -1 rest)
  string(FIND "${rest}" "```" open)
  string(SUBSTRING "${rest}" ${open} -1 rest)
  string(FIND "${rest}" "\n" eol)
  math(EXPR eol "${eol} + 1")
  string(SUBSTRING "${rest}" ${eol} -1 rest)
  string(FIND "${rest}" "```" close)
  string(SUBSTRING "${rest}" 0 ${close} body)
  if(body MATCHES ";")
    message(FATAL_ERROR "README.md's block '${name}' has a ';' (this test passes blocks through CMake lists)")
  endif()
  set(${var} "${body}" PARENT_SCOPE)
endfunction()

# Runs a README block with sh -e in `dir`; its output must match `expect`.
function(run_block dir expect prelude name)
  readme_block(${name} body)
  message(STATUS "README block '${name}', in ${dir}:\n${body}")
  run(sh -ec "${prelude}${body}")
  if(NOT last_output MATCHES "${expect}")
    message(FATAL_ERROR "README block '${name}' printed:\n${last_output}\n(expected '${expect}')")
  endif()
  set(last_output "${last_output}" PARENT_SCOPE)
endfunction()

set(home ${WORK_DIR}/home)
file(MAKE_DIRECTORY ${home} ${WORK_DIR}/bin ${WORK_DIR}/source ${WORK_DIR}/cmake_app ${WORK_DIR}/pc_app)
set(ENV{HOME} ${home})
unset(ENV{LD_LIBRARY_PATH})
unset(ENV{PKG_CONFIG_PATH})
file(CREATE_LINK ${C_COMPILER} ${WORK_DIR}/bin/cc SYMBOLIC)
get_filename_component(cmake_dir ${CMAKE_COMMAND} DIRECTORY)
set(ENV{PATH} "${WORK_DIR}/bin:${cmake_dir}:$ENV{PATH}")

# Install: `build` is the build under test.
file(CREATE_LINK ${BUILD_DIR} ${WORK_DIR}/source/build SYMBOLIC)
# (No ';' in what goes through run(): CMake would split the argument there.)
set(skip_build [=[
cmake() {
  if [ "$1 $2 $3" = "-S . -B" ]
  then echo "(skipped: configure, the build under test is configured)"
  elif [ "$1 $2" = "--build build" ]
  then echo "(skipped: build, the build under test is built)"
  else command cmake "$@"
  fi
}
]=])
set(cd_source "cd '${WORK_DIR}/source'\n")
run_block(${WORK_DIR}/source "Installing: .*/\\.local/include/mapping\\.h" "${cd_source}${skip_build}" install)
if(NOT EXISTS ${home}/.local/include/mapping.h)
  message(FATAL_ERROR "the README's install block put nothing in $HOME/.local")
endif()

# CMake: the README's CMakeLists.txt beside app.c.
readme_block(CMakeLists.txt lists)
file(WRITE ${WORK_DIR}/cmake_app/CMakeLists.txt "${lists}")
configure_file(${SOURCE_DIR}/tests/install/app.c ${WORK_DIR}/cmake_app/app.c COPYONLY)
run_block(${WORK_DIR}/cmake_app "\nok\n$" "cd '${WORK_DIR}/cmake_app'\n" cmake)

# pkg-config: with the rpath, then with LD_LIBRARY_PATH (one shell: the
# first block exports PKG_CONFIG_PATH).
configure_file(${SOURCE_DIR}/tests/install/app.c ${WORK_DIR}/pc_app/app.c COPYONLY)
readme_block(pkg-config with_rpath)
readme_block(LD_LIBRARY_PATH with_path)
run(sh -ec "cd '${WORK_DIR}/pc_app'\n${with_rpath}echo '-- then without the rpath:'\n${with_path}")
if(NOT last_output MATCHES "^ok\n-- then without the rpath:\nok\n$")
  message(FATAL_ERROR "README's pkg-config blocks printed:\n${last_output}\n(expected ok twice)")
endif()
message(STATUS "README: installed with cmake --install, built and ran a program with find_package and with "
               "pkg-config (rpath, then LD_LIBRARY_PATH)")
