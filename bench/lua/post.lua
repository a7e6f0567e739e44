-- POST the same body to every request: BENCH_BODY, BENCH_CONTENT_TYPE, BENCH_AUTHORIZATION (env).
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = os.getenv("BENCH_CONTENT_TYPE") or "application/x-www-form-urlencoded"
local auth = os.getenv("BENCH_AUTHORIZATION")
if auth and auth ~= "" then wrk.headers["Authorization"] = auth end
