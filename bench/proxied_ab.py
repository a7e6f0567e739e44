"""Issue 46 item 7, alternating: svc-auth's CPU per proxied Patient read (a FHIR clinic on the test
EHR, open mode, the audit on) and per `/healthz`, this checkout against commits, all up at once.

    python -m bench.proxied_ab --baseline REV [--baseline REV2] [--rounds 4] [--seconds 5]

Every side is one embedded `serve` (`bench.fhir_reads`' shape and limits) on one shared test EHR;
each round drives each side in turn (ABBA order) with the proxied read, `/healthz` and a sandbox
Patient read (for reference), wrk at 16 connections; sums over the rounds. Also the voluntary
context switches of all of serve's threads per request (`/proc/PID/task/*/status`). The EHR's CPU
is shown, not counted."""
from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from bench.fhir_reads import NO_FHIR_LIMITS, Measured, _proxied_clinic, _sandbox_patient, _start_ehr
from bench.floor import baseline_tree
from bench.service import BenchService

LOADS = ("read", "healthz", "sandbox")


def _switches(pid: int) -> int:
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--loads", default=",".join(LOADS), help="which of read,healthz,sandbox to drive")
    args = parser.parse_args()
    chosen = [load for load in LOADS if load in args.loads.split(",")]
    ehr, origin = _start_ehr()
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: (ehr.terminate(), ehr.wait(30)))
        roots = {"this": None}
        for rev in args.baseline:
            tree, commit = stack.enter_context(baseline_tree(rev))
            roots[commit[:7]] = tree
        sides = {}
        for name, root in roots.items():
            service = BenchService(None, processes=1, extra_env=dict(NO_FHIR_LIMITS),
                                   **({"root": root} if root else {})).start()
            stack.callback(service.stop)
            measured = Measured(service, extra_pids=[ehr.pid])
            token = service.platform_token()
            sandbox = f"/fhir/r4/{service.organization_id}/Patient/{_sandbox_patient(service, token)}"
            sides[name] = (measured, {"read": _proxied_clinic(service, origin), "healthz": ("/healthz", {}),
                                      "sandbox": (sandbox, {"BENCH_AUTHORIZATION": f"Bearer {token}"})})
        for measured, loads in sides.values():  # warm-up
            for load in chosen:
                measured.run(*loads[load][:1], "get", loads[load][1], 1.5, warm_up=False)
        sums = {name: {load: [0.0, 0.0, 0.0, 0] for load in LOADS} for name in sides}
        names = list(sides)
        for number in range(args.rounds):
            for name in (names if number % 2 == 0 else names[::-1]):
                measured, loads = sides[name]
                for load in chosen:
                    p, e = loads[load]
                    switched = _switches(measured.service.proc.pid)
                    run = measured.run(p, "get", e, args.seconds, warm_up=False)
                    switched = _switches(measured.service.proc.pid) - switched
                    done = run["rps"] * run["seconds"]
                    total = sums[name][load]
                    total[0] += done
                    total[1] += run["cpu_seconds"]["serve"]
                    total[2] += run["cpu_seconds"]["ehr"]
                    total[3] += switched
                    print(f"round {number + 1} {name} {load}: {run['rps']:.0f}/s, "
                          f"{run['svc_cpu_ms_per_request']:.3f} CPU ms, errors {run['errors'] or 'none'}", flush=True)
        print(f"load average {os.getloadavg()}")
        for name, loads in sums.items():
            if len(chosen) < len(LOADS):
                print(name, {k: round(1000 * loads[k][1] / max(loads[k][0], 1), 3) for k in chosen})
                continue
            read, healthz, sandbox = (1000 * loads[k][1] / max(loads[k][0], 1) for k in LOADS)
            print(f"{name}: proxied read {read:.3f} CPU ms ({loads['read'][3] / max(loads['read'][0], 1):.1f} "
                  f"switches, EHR {1000 * loads['read'][2] / max(loads['read'][0], 1):.3f} ms), /healthz "
                  f"{healthz:.3f} ms ({loads['healthz'][3] / max(loads['healthz'][0], 1):.1f} switches), sandbox "
                  f"read {sandbox:.3f} ms ({loads['sandbox'][3] / max(loads['sandbox'][0], 1):.1f} switches): "
                  f"ratio {read / max(healthz, 1e-9):.2f}x", flush=True)


if __name__ == "__main__":
    main()
