# ctest package.install_and_consume: installs the build tree into a fresh prefix, then
# configures, builds and runs tests/consumer against it. -DBUILD= -DSRC= -DWORK= -DGENERATOR=
# -DCXX= are passed by tests/CMakeLists.txt.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/prefix)
foreach(f include/fp8proj/projection.hpp share/fp8proj/configs/nvidia-h200.json bin/fp8proj)
  if(NOT EXISTS ${WORK}/prefix/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
file(GLOB capi ${WORK}/prefix/lib*/libfp8proj_c.so ${WORK}/prefix/lib*/libfp8proj.a)
list(LENGTH capi found)
if(NOT found EQUAL 2)
  message(FATAL_ERROR "libfp8proj.a and libfp8proj_c.so not both installed: ${capi}")
endif()
run(${CMAKE_COMMAND} -S ${SRC} -B ${WORK}/build -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX}
    -DCMAKE_PREFIX_PATH=${WORK}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK}/build)
run(${WORK}/build/consumer)
# The installed CLI finds the installed tables (share/fp8proj/configs next to bin/).
run(${WORK}/prefix/bin/fp8proj info)
