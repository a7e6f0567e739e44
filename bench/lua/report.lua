-- Appended to every benchmark script: print the figures as one JSON line for bench/loadgen.py.
function done(summary, latency, requests)
   local s = summary
   io.write(string.format(
      'BENCH_JSON {"requests":%d,"duration_us":%d,"errors_connect":%d,"errors_read":%d,' ..
      '"errors_write":%d,"errors_status":%d,"errors_timeout":%d,' ..
      '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
      s.requests, s.duration, s.errors.connect, s.errors.read, s.errors.write, s.errors.status,
      s.errors.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max, latency.mean))
end
