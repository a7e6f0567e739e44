-- GET with an Authorization header from BENCH_AUTHORIZATION (env), if set.
local auth = os.getenv("BENCH_AUTHORIZATION")
if auth and auth ~= "" then wrk.headers["Authorization"] = auth end
