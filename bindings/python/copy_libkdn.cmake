# SPDX-License-Identifier: Apache-2.0
# Copies libkdn into the Python package (beside the extension, which finds it
# through its RUNPATH $ORIGIN):
#   cmake -DSRC=<libkdn.so.X.Y.Z> -DDST=<pkg>/kdn/libkdn.so.X -DBUILD_DIR=<build>
#         [-DOBJCOPY=<objcopy>] -P copy_libkdn.cmake
# Without debug info when OBJCOPY is given (a RelWithDebInfo libkdn.so is
# 55 MiB, 4 without; the wheel 1.5 MiB instead of 19): to debug, run with
# LD_LIBRARY_PATH=<build>, which the loader searches before RUNPATH.
# The run path keeps only what the installed libkdn would: the build's ends in
# an empty entry (CMake's padding, `/usr/local/cuda/lib:`), which the loader
# reads as the current directory, so a library there would be loaded in place
# of the system's; and nothing into the build tree.
if(OBJCOPY)
  execute_process(COMMAND ${OBJCOPY} --strip-debug ${SRC} ${DST} COMMAND_ERROR_IS_FATAL ANY)
else()
  file(COPY_FILE ${SRC} ${DST})
endif()

file(READ_ELF ${DST} RUNPATH runpath RPATH rpath)
set(kept)
foreach(dir IN LISTS runpath rpath)
  cmake_path(IS_PREFIX BUILD_DIR "${dir}" NORMALIZE in_build)
  if(IS_ABSOLUTE "${dir}" AND NOT in_build)
    list(APPEND kept "${dir}")
  endif()
endforeach()
list(REMOVE_DUPLICATES kept)
if(kept)
  list(JOIN kept ":" kept)
  file(RPATH_SET FILE ${DST} NEW_RPATH "${kept}")
else()
  file(RPATH_REMOVE FILE ${DST})
endif()
