# SPDX-License-Identifier: Apache-2.0
# Runs at install time (capi/CMakeLists.txt's install(CODE)): writes kdn.pc
# for the prefix being installed to (CMAKE_INSTALL_PREFIX here is the one of
# `cmake --install --prefix`) and installs it to <libdir>/pkgconfig.
# In: KDN_PC_TEMPLATE, KDN_PC_STAGING_DIR (a folder of the build tree),
# KDN_PC_VERSION, KDN_PC_LIBDIR and KDN_PC_INCLUDEDIR (relative to the
# prefix, or absolute).
set(KDN_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${KDN_PC_${dir}}")
    set(KDN_PC_${dir}_FULL "${KDN_PC_${dir}}")
  else()
    set(KDN_PC_${dir}_FULL "\${prefix}/${KDN_PC_${dir}}")
  endif()
endforeach()
# A prefix outside the linker's own search path gets a run path in Libs, so
# that a program linked with `pkg-config --libs kdn` finds libkdn.so where it
# was installed (no LD_LIBRARY_PATH).
set(KDN_PC_LIBS_EXTRA "")
if(NOT CMAKE_INSTALL_PREFIX MATCHES "^/usr/?$")
  set(KDN_PC_LIBS_EXTRA " -Wl,-rpath,\${libdir}")
endif()
# One staging file per prefix: two installs at once do not share it.
string(MD5 kdn_pc_tag "${CMAKE_INSTALL_PREFIX}")
set(kdn_pc_staged "${KDN_PC_STAGING_DIR}/kdn-${kdn_pc_tag}.pc")
configure_file("${KDN_PC_TEMPLATE}" "${kdn_pc_staged}" @ONLY)
if(IS_ABSOLUTE "${KDN_PC_LIBDIR}")
  set(kdn_pc_destination "${KDN_PC_LIBDIR}/pkgconfig")
else()
  set(kdn_pc_destination "${CMAKE_INSTALL_PREFIX}/${KDN_PC_LIBDIR}/pkgconfig")
endif()
file(INSTALL DESTINATION "${kdn_pc_destination}" TYPE FILE FILES "${kdn_pc_staged}" RENAME kdn.pc)
