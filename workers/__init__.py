"""Background work on Dramatiq: the nightly appointment snapshot and chart ZIP builds.

- `workers.broker`: the task queue (RedisBroker with `SVC_REDIS_URL`, else an in-process broker
  with a worker thread inside `serve`), and the `task` decorator actors are declared with.
- `workers.snapshot`: the nightly, NPI-filtered appointment snapshot (one task per organization).
- `workers.charts`: chart retrieval ZIPs (`enqueue_chart_build`, `test_mode_object`).
- `workers.scheduler`: enqueues the nightly sync once per day at the start of SVC_SYNC_WINDOW.
"""
