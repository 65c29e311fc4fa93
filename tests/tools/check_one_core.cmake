# SPDX-License-Identifier: Apache-2.0
# The kdn command holds one copy of the core: it links the C ABI statically
# (refengine/CMakeLists.txt), so it must not also load libkdn.so, which has a
# copy of its own; and the C ABI it calls must be in the binary.
#   cmake -DREADELF=<readelf> -DNM=<nm> -DEXE=<kdn> -P check_one_core.cmake
cmake_minimum_required(VERSION 3.25)

foreach(var READELF NM EXE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_one_core.cmake: pass -D${var}=...")
  endif()
endforeach()

execute_process(COMMAND "${READELF}" -d "${EXE}" OUTPUT_VARIABLE dyn ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${EXE} failed (${rc}): ${err}")
endif()
if(dyn MATCHES "NEEDED[^\n]*\\[(libkdn\\.so[^]]*)\\]")
  message(FATAL_ERROR "${EXE} needs ${CMAKE_MATCH_1}, which carries a second copy of the core")
endif()

execute_process(COMMAND "${NM}" -C --defined-only "${EXE}" OUTPUT_VARIABLE syms ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} --defined-only ${EXE} failed (${rc}): ${err}")
endif()
foreach(sym kdn_kv_store kdn_kv_retrieve kdn_kv_blend "kdn::store::KvStore::Store(")
  string(FIND "${syms}" " ${sym}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${EXE} does not define ${sym}")
  endif()
endforeach()
message(STATUS "${EXE}: one core, linked statically with the C ABI; no libkdn.so")
