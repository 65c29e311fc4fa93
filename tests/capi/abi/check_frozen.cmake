# SPDX-License-Identifier: Apache-2.0
# Fails when the frozen 1.0 header (tests/capi/abi/kdn_v1.h) was changed:
# it is what a caller built against 1.0 compiled with, and stays as it is.
# Usage: cmake -DHEADER=<kdn_v1.h> -DEXPECTED=<sha256> -P check_frozen.cmake
file(SHA256 "${HEADER}" actual)
if(NOT actual STREQUAL EXPECTED)
  message(FATAL_ERROR "${HEADER} changed (SHA-256 ${actual}, pinned ${EXPECTED}). "
                      "It is the frozen 1.0 header: change capi/include/kdn/kdn.h instead "
                      "(appending only), never this copy.")
endif()
message(STATUS "kdn_v1.h is the frozen 1.0 header (SHA-256 ${actual})")
