# Runs a benchmark program briefly (small sizes, minimal time) and checks that it wrote valid
# JSON with at least one measured benchmark. Usage: cmake -DBENCH=exe -DOUT=file.json -DFILTER=regex -P this.
execute_process(
  COMMAND ${BENCH} --benchmark_min_time=0.001 --benchmark_filter=${FILTER}
          --benchmark_out=${OUT} --benchmark_out_format=json
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${BENCH} exited with ${rc}")
endif()
file(READ ${OUT} json)
string(JSON count LENGTH "${json}" benchmarks)
if(count EQUAL 0)
  message(FATAL_ERROR "${OUT} lists no benchmarks")
endif()
set(measured 0)
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON error ERROR_VARIABLE no_error GET "${json}" benchmarks ${i} error_occurred)
  if(NOT error)
    math(EXPR measured "${measured} + 1")
  endif()
endforeach()
if(measured EQUAL 0)
  message(FATAL_ERROR "${OUT}: every benchmark reported an error")
endif()
message(STATUS "${OUT}: ${count} benchmarks, ${measured} measured")
