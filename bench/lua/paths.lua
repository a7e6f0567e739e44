-- GET the paths listed in BENCH_PATHS_FILE in turn (threads start at different lines), with the
-- Authorization header from BENCH_AUTHORIZATION.
local paths, index, auth = {}, 0, nil
local counter = 0
function setup(thread)
   thread:set("thread_index", counter)
   counter = counter + 1
end
function init(args)
   for line in io.lines(os.getenv("BENCH_PATHS_FILE")) do paths[#paths + 1] = line end
   index = (thread_index or 0) * 7919
   auth = os.getenv("BENCH_AUTHORIZATION")
end
function request()
   index = index + 1
   return wrk.format("GET", paths[(index % #paths) + 1], {["Authorization"] = auth})
end
