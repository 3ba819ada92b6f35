# pgd_find_pkg(<prefix> <pkg-config module> <part> <option>)
# Finds a pkg-config module as the imported target PkgConfig::<prefix>, once per build tree.
# Each folder calls it for the packages that folder needs (engine/: libpcre2-8; server/:
# libmicrohttpd, jansson; tools/: libcurl, jansson; sim/: jansson), so a build of libpagoda
# alone (PGD_BUILD_ENGINE/SERVER/TOOLS=OFF) looks for none of them. The target is GLOBAL
# because the tests and fuzz targets beside the folder (tests/, tests/fuzz/) link it too.
# A missing package stops the configure with the part that needs it and the option that
# turns that part off.
function(pgd_find_pkg prefix module part option)
  if(TARGET PkgConfig::${prefix})
    return()
  endif()
  pkg_check_modules(${prefix} IMPORTED_TARGET GLOBAL ${module})
  if(NOT ${prefix}_FOUND)
    message(FATAL_ERROR "${part} needs the pkg-config module '${module}', which was not found: "
      "install it (scripts/setup.sh names the Debian packages) or configure with -D${option}=OFF")
  endif()
endfunction()
