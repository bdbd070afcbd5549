# Checks of the warm-up and cold-pass fields of a `kvbridge bench` JSON
# report (included by run_bench_test.cmake with -DWARMUP=N): they exist, they
# agree with each other and with the options. Never a speed: only counts,
# positive times and rates that follow from bytes / seconds.
#   j: the report text; WARMUP: the --warmup the test ran with.
function(cold_get out)
  string(JSON v ERROR_VARIABLE e GET "${j}" ${ARGN})
  if(e)
    message(FATAL_ERROR "report has no ${ARGN}: ${e}")
  endif()
  set(${out} "${v}" PARENT_SCOPE)
endfunction()

# cold_expect("<message>" <if() condition words>...)
function(cold_expect what)
  if(NOT (${ARGN}))
    message(FATAL_ERROR "cold/warm-up report: ${what}")
  endif()
endfunction()

# rate = bytes / seconds / 1e9 within 1% (the report rounds to 4 digits).
function(cold_rate_agrees name bytes seconds rate)
  math(EXPR kb "${bytes} / 1000")
  cold_expect("${name}: seconds '${seconds}' not positive" seconds GREATER 0)
  # CMake has no float arithmetic: awk compares gbps * seconds * 1e6 with kB.
  execute_process(COMMAND awk "BEGIN { r = ${rate} * ${seconds} * 1e6; d = r - ${kb};
      if (d < 0) d = -d; exit (d <= 0.01 * ${kb} + 1) ? 0 : 1 }" RESULT_VARIABLE bad)
  cold_expect("${name}: ${rate} GB/s is not ${bytes} B / ${seconds} s" bad EQUAL 0)
endfunction()

cold_get(warmup warmup)
cold_get(wreq warmup_requests)
cold_get(wver warmup_verified)
cold_get(wfail warmup_failed)
cold_get(creq cold_requests)
cold_get(cbytes cold_bytes)
cold_get(csec cold_seconds)
cold_get(cgbps cold_gbps)
cold_get(cp50 cold_latency_ms p50)
cold_get(cp99 cold_latency_ms p99)
cold_get(first first_request_ms)
cold_get(req requests)
cold_get(bytes bytes)
cold_get(sec seconds)
cold_get(gbps gbps)

cold_expect("warmup ${warmup}, want ${WARMUP}" warmup EQUAL WARMUP)
cold_expect("warm-up failures: ${wfail}" wfail EQUAL 0)
cold_expect("warm-up verified ${wver} of ${wreq}" wver EQUAL wreq)
if(WARMUP GREATER 0)
  cold_expect("no warm-up requests with --warmup ${WARMUP}" wreq GREATER 0)
  cold_expect("cold pass of ${creq} requests, warm-up of ${wreq}" creq EQUAL wreq)
else()
  cold_expect("warm-up requests ${wreq} with --warmup 0" wreq EQUAL 0)
  cold_expect("cold pass of ${creq} requests (first wave of ${req})" creq GREATER 0 AND NOT creq GREATER req)
endif()
# Every request moves the same bytes.
math(EXPR per "${bytes} / ${req}")
math(EXPR want "${per} * ${creq}")
cold_expect("cold bytes ${cbytes}, want ${creq} x ${per}" cbytes EQUAL want)
cold_rate_agrees(cold ${cbytes} ${csec} ${cgbps})
cold_rate_agrees(steady ${bytes} ${sec} ${gbps})
cold_expect("cold latency p50 ${cp50} p99 ${cp99}" cp50 GREATER 0 AND NOT cp50 GREATER cp99)
cold_expect("first request latency ${first}" first GREATER 0)
