# SPDX-License-Identifier: Apache-2.0
# One static library per source folder, each seeing only its own headers and
# those of the libraries it links: a wrong include between floors fails to
# compile, instead of building and hiding the dependency.
#
# Every project header is included by its path from the repository root
# ("core/tiers/disk_tier.h", "kernels/common/half.h", "lab/model/transformer.h").
# The repository root itself is never on an include path: each folder target
# gets an include root of its own under the build tree,
#   ${KDN_INCLUDE_ROOTS}/<target>/<folder> -> ${PROJECT_SOURCE_DIR}/<folder>
# (a symbolic link), added PUBLIC; so a file sees the folders of the targets it
# links (transitively), and no others.
set(KDN_INCLUDE_ROOTS "${PROJECT_BINARY_DIR}/include-roots")

# kdn_folder_includes(<target> <folder> [INTERFACE]): gives <target> the include
# root that exposes <folder> (relative to the repository root).
function(kdn_folder_includes target folder)
  set(scope PUBLIC)
  if(ARGN STREQUAL "INTERFACE")
    set(scope INTERFACE)
  endif()
  set(link "${KDN_INCLUDE_ROOTS}/${target}/${folder}")
  get_filename_component(parent "${link}" DIRECTORY)
  file(MAKE_DIRECTORY "${parent}")
  if(NOT IS_SYMLINK "${link}")
    file(CREATE_LINK "${PROJECT_SOURCE_DIR}/${folder}" "${link}" SYMBOLIC)
  endif()
  target_include_directories(${target} ${scope} "$<BUILD_INTERFACE:${KDN_INCLUDE_ROOTS}/${target}>")
endfunction()

# kdn_floor(<target> <folder> SOURCES ... [LINKS ...] [PRIVATE_LINKS ...]):
# a static library of the folder's sources with its include root; LINKS are
# the floors below it that its headers or sources use.
function(kdn_floor target folder)
  cmake_parse_arguments(F "" "" "SOURCES;LINKS;PRIVATE_LINKS" ${ARGN})
  add_library(${target} STATIC ${F_SOURCES})
  kdn_folder_includes(${target} ${folder})
  target_link_libraries(${target} PUBLIC ${F_LINKS} PRIVATE ${F_PRIVATE_LINKS})
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KDN_WARNINGS}>)
endfunction()
