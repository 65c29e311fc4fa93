# SPDX-License-Identifier: Apache-2.0
# models.checksums: the reference model the repository carries (models/) is
# the published one, byte for byte (the SHA-256 pinned in models/README.md),
# not a Git LFS pointer or a truncated copy.
set(expected
    stories260K.bin b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696
    tok512.bin 037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312
    reference/kv260k.k.f32 285ef812654e2d0be75597598b92fd7f7f0c8c49fc51438ff9c51db1e5ca0cb0
    reference/kv260k.v.f32 d0a1f38119a5a95b1f2fd5350844add93f7b4e6c40f4b901b052a1c764186ccc)
list(LENGTH expected n)
math(EXPR last "${n} - 1")
foreach(i RANGE 0 ${last} 2)
  math(EXPR j "${i} + 1")
  list(GET expected ${i} file)
  list(GET expected ${j} want)
  if(NOT EXISTS "${MODELS}/${file}")
    message(FATAL_ERROR "${MODELS}/${file} is missing")
  endif()
  file(SHA256 "${MODELS}/${file}" got)
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "${MODELS}/${file}: SHA-256 ${got}, want ${want}")
  endif()
endforeach()
message(STATUS "models/: the 4 reference files, as published")
