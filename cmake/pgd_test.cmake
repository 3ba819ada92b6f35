# pgd_test(<name> SOURCES <src...> LABELS <labels...> [ARGS <args...>] [INTERNAL])
# One executable and one ctest test. INTERNAL tests may include src/ headers.
# Exit code 77 means "skipped".
function(pgd_test name)
  cmake_parse_arguments(T "INTERNAL" "" "SOURCES;LABELS;ARGS;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  if(T_INTERNAL)
    target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  endif()
  target_link_libraries(${name} PRIVATE pagoda Threads::Threads ${T_LIBS})
  add_test(NAME ${name} COMMAND ${name} ${T_ARGS})
  set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}" SKIP_RETURN_CODE 77)
endfunction()
