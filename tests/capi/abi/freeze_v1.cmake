# SPDX-License-Identifier: Apache-2.0
# Makes tests/capi/abi/kdn_v1.h from capi/include/kdn/kdn.h: the FROZEN banner,
# then the header with its KDN_EXPERIMENTAL section left out. For the one
# re-freeze before 1.0 is published (never after): run
#   cmake -P tests/capi/abi/freeze_v1.cmake
# from the repository's top, then put the SHA-256 it prints into
# KDN_V1_HEADER_SHA256 in tests/capi/CMakeLists.txt.
get_filename_component(top "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
file(READ "${top}/capi/include/kdn/kdn.h" header)
set(begin_marker "/* ========================================================================== */\n/* ---- Experimental")
set(end_marker "#endif /* KDN_EXPERIMENTAL */\n")
string(FIND "${header}" "${begin_marker}" begin)
string(FIND "${header}" "${end_marker}" end)
if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
  message(FATAL_ERROR "kdn.h: cannot find its experimental section")
endif()
string(LENGTH "${end_marker}" end_length)
math(EXPR after "${end} + ${end_length}")
string(SUBSTRING "${header}" 0 ${begin} stable)
string(SUBSTRING "${header}" ${after} -1 tail)
set(banner [=[/* FROZEN: tests/capi/abi/kdn_v1.h is a copy of the stable part of
 * capi/include/kdn/kdn.h as published in version 1.0 (its experimental
 * section left out). It must NEVER change again: it is what a caller built
 * against 1.0 was compiled with, and compat_v1.c and sizes_v1.c keep every
 * later libkdn.so 1.x working for that caller. To change the ABI, change
 * kdn.h (appending only, as its top says), never this file.
 * ------------------------------------------------------------------------- */
]=])
set(note [=[/* ---- Experimental ---------------------------------------------------------
 * (kdn.h's KDN_EXPERIMENTAL section is not part of the stable ABI and is
 * left out of this frozen copy.) */

]=])
file(WRITE "${CMAKE_CURRENT_LIST_DIR}/kdn_v1.h" "${banner}${stable}${note}${tail}")
file(SHA256 "${CMAKE_CURRENT_LIST_DIR}/kdn_v1.h" sha)
message(STATUS "wrote ${CMAKE_CURRENT_LIST_DIR}/kdn_v1.h, SHA-256 ${sha}")
