-- Authorization-code exchange: each request redeems the next pre-minted code from BENCH_CODES_FILE.
-- Every wrk thread takes every Nth line (N = BENCH_THREADS) so no code is sent twice.
local codes, index = {}, 0
local counter = 0
function setup(thread)
   thread:set("thread_index", counter)
   counter = counter + 1
end
function init(args)
   local n, i = tonumber(os.getenv("BENCH_THREADS") or "1"), 0
   for line in io.lines(os.getenv("BENCH_CODES_FILE")) do
      if i % n == thread_index then codes[#codes + 1] = line end
      i = i + 1
   end
end
function request()
   index = index + 1
   local code = codes[index] or "exhausted"
   return wrk.format("POST", nil, {["Content-Type"] = "application/x-www-form-urlencoded",
                                   ["Authorization"] = os.getenv("BENCH_AUTHORIZATION")},
                     "grant_type=authorization_code&code=" .. code)
end
