"""A broken or hostile EHR (tests/helpers/hostile_ehr.py) cannot hang, exhaust or mislead svc-auth (issue
28): driven through a real `svc-auth serve` (the FHIR API, the hub page), `snapshot run` and `ehr
check`, each attack answers within the caller's documented deadline plus a margin, memory stays
bounded while an endless body streams, nothing outside the clinic's FHIR base is ever requested,
an EHR's error is an error, and no reference to a foreign host reaches an app. Every attack has
its positive control (the same clinic answering normally) in the same run."""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from helpers.environment import ROOT
from helpers.hostile_ehr import NPI, TOKEN, HostileEhr
from helpers.processes import free_port, settings_env, start_process, stop_process
from helpers.tokens import mint_platform_token
from fhir_api.api import RETRY_AFTER_SECONDS, TOTAL_EHR_PAGES
from lifecycle.applications import install_application
from lifecycle.users import create_user
from lifecycle.verification import record_platform_verification
from workers.snapshot import night_window

INTERACTIVE_DEADLINE = 3     # SVC_EHR_INTERACTIVE_DEADLINE here (the default is 10 s)
BATCH_DEADLINE = 5           # SVC_EHR_BATCH_DEADLINE here (the default is 120 s)
MARGIN = 5.0                 # seconds on top of a deadline: the service's own work on a busy 2-core machine
SNAPSHOT_SECONDS = 60        # `snapshot run` of the attacked clinic and a sandbox one ends within this
SERVE_GROWTH_BYTES = 64 * 1024 * 1024     # serve's peak RSS grows less than this while an endless body streams
NIGHT_PEAK_BYTES = 320 * 1024 * 1024      # `snapshot run`'s peak RSS (the batch body limit is 32 MiB)

pytestmark = [pytest.mark.slow,
              pytest.mark.svc_settings(ehr_interactive_deadline=INTERACTIVE_DEADLINE, ehr_batch_deadline=BATCH_DEADLINE)]


@pytest.fixture
def served(settings, world, tmp_path):
    """A real `svc-auth serve` (its address and process)."""
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    proc = start_process(["serve", "--port", str(port)], settings_env(settings, SVC_ISSUER=issuer, SVC_PUBLIC_URL=issuer),
                         port, log_path=tmp_path / "serve.log")
    yield issuer, proc
    stop_process(proc)


MEASURED = ("import resource, subprocess, sys\n"
            "code = subprocess.call(sys.argv[2:])\n"
            "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
            "sys.exit(code)")
"""Runs a command and writes its peak RSS (KiB) to a file. Linux counts a new process's peak from
the memory it was forked with, kept through `exec`, so neither `RUSAGE_CHILDREN` nor `wait4` in
this test process says what the command used: they start at this process's own size (about 300 MiB
late in a whole `make test`, which failed these tests). This small process forks the command, so
the figure starts near its own few MiB."""


def cli(settings, *args, timeout: float = 120):
    """`svc-auth ARGS` as a child: (CompletedProcess, seconds, the peak RSS in bytes of that command
    and of the children it waited for, `MEASURED`); a child still running at `timeout` is killed and
    the test fails."""
    started = time.monotonic()
    with tempfile.NamedTemporaryFile("r") as peak:
        proc = subprocess.Popen([sys.executable, "-c", MEASURED, peak.name, sys.executable, "-m", "cli.__main__", *args],
                                env=settings_env(settings), cwd=str(ROOT), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"svc-auth {' '.join(args)} did not end within {timeout} s")
        seconds = time.monotonic() - started
        kib = int(peak.read() or 0)
    return subprocess.CompletedProcess(args, proc.returncode, out, err), seconds, kib * 1024


@pytest.fixture
def hostile_clinic(runtime, world, served, hostile):
    """The hostile EHR connected as an open FHIR clinic (`--fhir-auth none`), the app installed, a
    physician with the EHR's NPI and a `user/*.rs` token: (org id, the physician, token, serve's address)."""
    hostile.calm()
    done, _, _ = cli(runtime.settings, "orgs", "create", "--name", "Hostile Clinic", "--ehr", "fhir",
                     "--fhir-base-url", hostile.base, "--fhir-auth", "none", "--json")
    assert done.returncode == 0, done.stderr
    org_id = json.loads(done.stdout)["id"]
    install_application(world.app.id, org_id)
    ana = create_user(org_id, "ana@hostile.example", "Ana", "Lopez", "alopez", NPI)
    issuer, _ = served
    return org_id, ana, mint_platform_token(runtime, issuer, ana, world.app, org_id), issuer


def get(url: str, token: str | None = None, timeout: float = INTERACTIVE_DEADLINE + MARGIN, headers=None):
    """GET within `timeout`: (status, JSON or text body, seconds); the test fails past the timeout."""
    sent = {"Accept": "application/fhir+json", **(headers or {})}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    started = time.monotonic()
    request = urllib.request.Request(url, headers=sent)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=timeout) as response:
            status, raw, answered = response.status, response.read(), response.headers
    except urllib.error.HTTPError as err:
        status, raw, answered = err.code, err.read(), err.headers
    except (TimeoutError, urllib.error.URLError) as exc:
        pytest.fail(f"GET {url} did not answer within {timeout} s ({exc})")
    seconds = time.monotonic() - started
    try:
        body = json.loads(raw)
    except ValueError:
        body = raw.decode("utf-8", "replace")
    return status, body, seconds, answered


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def fhir(hostile_clinic, path: str, timeout: float = INTERACTIVE_DEADLINE + MARGIN):
    org_id, _, token, issuer = hostile_clinic
    return get(f"{issuer}/fhir/r4/{org_id}{path}", token, timeout)


def assert_outcome(status: int, body, expected: int, code: str | None = None) -> None:
    assert status == expected, (status, body)
    assert isinstance(body, dict) and body["resourceType"] == "OperationOutcome", body
    if code:
        assert body["issue"][0]["code"] == code, body


def peak_rss(pid: int) -> int:
    """A live process's peak resident memory so far (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def inside_base(hostile: HostileEhr) -> None:
    """Every request the EHR received was for its FHIR base, under the host name it was configured with."""
    for path, _ in hostile.requests():
        assert path.startswith("/fhir/R4/") and ".." not in path and "%2e" not in path.lower(), path
        assert "admin" not in path, path


# -- 2. only the clinic's FHIR base ------------------------------------------------------------

@pytest.mark.parametrize("attack", ["next-outside-base", "next-encoded", "next-dotdot", "next-prefix",
                                    "next-other-host", "redirect"])
def test_a_next_link_or_redirect_outside_the_base_is_refused_before_any_request(hostile_clinic, hostile, attack):
    status, body, _, _ = fhir(hostile_clinic, "/Observation?patient=pt-1")
    assert status == 200 and [e["resource"]["id"] for e in body["entry"]] == ["obs-1"], body   # the control
    hostile.calm()
    hostile.attack(attack, on="Observation")
    status, body, _seconds, _ = fhir(hostile_clinic, "/Observation?patient=pt-1")
    assert_outcome(status, body, 502, "exception")
    assert "127.0.0.1" not in json.dumps(body) and "localhost" not in json.dumps(body)
    assert len(hostile.requests()) == 1, hostile.requests()    # the first page only: the way out was not taken
    inside_base(hostile)


def test_svc_auth_s_bearer_token_never_leaves_the_base_of_a_smart_backend_clinic(runtime, world, served, hostile):
    hostile.calm()
    done, _, _ = cli(runtime.settings, "orgs", "create", "--name", "Hostile SMART Clinic", "--ehr", "fhir",
                     "--fhir-base-url", hostile.base, "--fhir-client-id", "svc-auth-at-hostile", "--json")
    assert done.returncode == 0, done.stderr
    org_id = json.loads(done.stdout)["id"]
    install_application(world.app.id, org_id)
    ana = create_user(org_id, "ana@smart-hostile.example", "Ana", "Lopez", "alopez", NPI)
    issuer, _ = served
    smart = (org_id, ana, mint_platform_token(runtime, issuer, ana, world.app, org_id), issuer)
    status, body, _, _ = fhir(smart, "/Observation?patient=pt-1")
    assert status == 200 and body["total"] == 1, body                                   # the control
    hostile.attack("next-outside-base", on="Observation")
    status, body, _, _ = fhir(smart, "/Observation?patient=pt-1")
    assert_outcome(status, body, 502, "exception")
    bearer = [path for path, authorization in hostile.requests() if authorization == f"Bearer {TOKEN}"]
    assert len(bearer) == 2 and all(p.startswith("/fhir/R4/Observation?") for p in bearer), hostile.requests()
    assert not any("admin" in path for path, _ in hostile.requests()), hostile.requests()


# -- 1. bounds: loops, endless pages, endless bodies, drips, Retry-After ------------------------

def test_a_next_link_repeated_forever_ends_the_search(hostile_clinic, hostile):
    hostile.attack("next-same", on="Observation")
    status, body, _seconds, _ = fhir(hostile_clinic, "/Observation?patient=pt-1")
    assert_outcome(status, body, 502, "exception")
    assert len(hostile.requests()) == 2, hostile.requests()    # the first page, then the loop once


def test_endless_pages_end_the_search_at_its_page_limit(hostile_clinic, hostile):
    hostile.attack("next-endless", on="Observation")
    status, body, _seconds, _ = fhir(hostile_clinic, "/Observation?patient=pt-1")
    assert_outcome(status, body, 502, "exception")
    assert len(hostile.requests()) == 20, len(hostile.requests())   # SVC_EHR_INTERACTIVE_MAX_PAGES


def test_a_page_is_served_without_its_total_when_counting_would_pass_its_budget(hostile_clinic, hostile):
    hostile.attack("next-endless-full", on="Observation")
    status, body, _, _ = fhir(hostile_clinic, "/Observation?patient=pt-1")
    assert status == 200 and len(body["entry"]) == 50 and "total" not in body, body
    # 30 matches an EHR page: the 2 EHR pages the 50 need, then `total`'s own budget (issue 46: no
    # longer the whole 20-page limit)
    assert len(hostile.requests()) == 2 + TOTAL_EHR_PAGES, len(hostile.requests())


def test_an_endless_body_on_a_read_is_cut_at_the_size_limit_and_serve_stays_small(hostile_clinic, hostile, served):
    _, proc = served
    status, body, _, _ = fhir(hostile_clinic, "/Patient/pt-1")
    assert status == 200 and body["id"] == "pt-1", body                  # the control
    before = peak_rss(proc.pid)
    hostile.attack("endless-body", on="Patient")
    for _ in range(3):
        status, body, _seconds, _ = fhir(hostile_clinic, "/Patient/pt-1")
        assert_outcome(status, body, 502, "exception")
    status, body, _, _ = fhir(hostile_clinic, "/Appointment?patient=pt-1")
    assert status == 200, body                                           # the rest of the EHR still served
    hostile.attack("endless-body", on="Appointment")
    status, body, _, _ = fhir(hostile_clinic, "/Appointment?patient=pt-1")
    assert_outcome(status, body, 502, "exception")
    grown = peak_rss(proc.pid) - before
    assert grown < SERVE_GROWTH_BYTES, f"serve's peak RSS grew by {grown >> 20} MiB"


def test_a_body_of_many_empty_objects_is_refused_unparsed_and_serve_stays_small(hostile_clinic, hostile, served):
    """`[{},{},...]` just under the 4 MiB cap parses to ~120 MiB of Python objects: refused before
    parsing (502), on a read and on a search, while the same clinic's other answers are served."""
    _, proc = served
    status, body, _, _ = fhir(hostile_clinic, "/Observation?patient=pt-1")
    assert status == 200 and [e["resource"]["id"] for e in body["entry"]] == ["obs-1"], body   # the control
    before = peak_rss(proc.pid)
    hostile.attack("many-objects", on="Observation")
    for path in ("/Observation?patient=pt-1", "/Observation/obs-1", "/Observation?patient=pt-1"):
        status, body, _seconds, _ = fhir(hostile_clinic, path)
        assert_outcome(status, body, 502, "exception")
    status, body, _, _ = fhir(hostile_clinic, "/Patient/pt-1")
    assert status == 200 and body["id"] == "pt-1", body                  # the rest of the EHR still served
    grown = peak_rss(proc.pid) - before
    assert grown < SERVE_GROWTH_BYTES, f"serve's peak RSS grew by {grown >> 20} MiB"


def test_a_slow_drip_hits_the_deadline_not_a_timeout_per_byte(hostile_clinic, hostile):
    hostile.attack("drip", on="Patient")
    status, body, seconds, _ = fhir(hostile_clinic, "/Patient/pt-1")
    assert_outcome(status, body, 504, "timeout")
    assert INTERACTIVE_DEADLINE - 0.5 <= seconds <= INTERACTIVE_DEADLINE + MARGIN, seconds


def test_a_long_retry_after_is_not_waited_by_an_app_s_read(hostile_clinic, hostile):
    hostile.attack("retry-after", on="Patient")
    status, body, _seconds, headers = fhir(hostile_clinic, "/Patient/pt-1")
    assert_outcome(status, body, 503, "transient")
    assert headers["Retry-After"] == str(RETRY_AFTER_SECONDS) and len(hostile.requests()) == 1, hostile.requests()


# -- 3. an EHR's error is an error ---------------------------------------------------------------

def test_an_error_outcome_where_a_searchset_belongs_is_a_502_never_an_empty_result(hostile_clinic, hostile):
    hostile.attack("outcome-warning", on="Observation")           # warnings beside the matches: fine
    status, body, _, _ = fhir(hostile_clinic, "/Observation?patient=pt-1")
    assert status == 200 and [e["resource"]["id"] for e in body["entry"]] == ["obs-1"], body
    for attack in ("outcome-200", "outcome-entry"):
        hostile.attack(attack, on="Observation")
        status, body, _, _ = fhir(hostile_clinic, "/Observation?patient=pt-1")
        assert_outcome(status, body, 502, "exception")
        assert "the EHR's error" not in json.dumps(body)             # the EHR's words go to the log only
    hostile.attack("outcome-200", on="Patient")
    status, body, _, _ = fhir(hostile_clinic, "/Patient/pt-1")
    assert_outcome(status, body, 502, "exception")


# -- 5. references point only at the platform ---------------------------------------------------

def test_references_to_a_foreign_host_never_reach_the_app(hostile_clinic, hostile):
    _, _, _, issuer = hostile_clinic
    hostile.attack("foreign-refs", on="Observation")
    hostile.attack("foreign-refs", on="Patient")
    _, read, _, _ = fhir(hostile_clinic, "/Observation/obs-1")
    _, searched, _, _ = fhir(hostile_clinic, "/Observation")  # (by patient, nothing: its subject is not pt-1)
    _, person, _, _ = fhir(hostile_clinic, "/Patient/pt-1")
    for answer in (read, searched, person):
        text = json.dumps(answer)
        assert "attacker.example" not in text and "127.0.0.1:1/" not in text and hostile.origin not in text, text
    assert read["subject"] == {"display": "A reference outside the clinic's EHR (removed)"}
    assert read["performer"] == [{"display": "A reference outside the clinic's EHR (removed)"}, {"display": "Dr. Y"},
                                 {"reference": "Practitioner/pr-1"}]
    assert read["extension"][0]["url"] == "http://hl7.org/fhir/StructureDefinition/data-absent-reason"  # not a link
    assert person["managingOrganization"] == {"display": "Elsewhere"}
    assert person["photo"] == [{"contentType": "image/png"}]
    assert searched["entry"][0]["fullUrl"].startswith(issuer)


# -- a malformed resource is left out, never a 500 ----------------------------------------------

def served_entries(body: dict) -> list[tuple[str, str]]:
    """(search mode, `Type/id`) of a searchset's entries but its OperationOutcomes."""
    return [(e["search"]["mode"], f"{e['resource']['resourceType']}/{e['resource']['id']}")
            for e in body.get("entry") or () if e["search"]["mode"] != "outcome"]


def outcomes_of(body: dict) -> list[dict]:
    return [e["resource"]["issue"][0] for e in body.get("entry") or () if e["search"]["mode"] == "outcome"]


@pytest.mark.parametrize("path, attacked, expected", [
    ("/Condition?patient=pt-1", "Condition", [("match", "Condition/cond-1")]),
    ("/Condition?patient=pt-1&_revinclude=Provenance:target", "Condition",
     [("match", "Condition/cond-1"), ("include", "Provenance/prov-1")]),
    ("/Condition?patient=pt-1&_revinclude=Provenance:target", "Provenance",
     [("match", "Condition/cond-1"), ("include", "Provenance/prov-1")]),
    ("/MedicationRequest?patient=pt-1&_include=MedicationRequest:medication", "MedicationRequest",
     [("match", "MedicationRequest/mr-1"), ("include", "Medication/med-1")]),
])
def test_a_resource_without_a_valid_id_is_left_out_and_the_bundle_says_so(hostile_clinic, hostile, path, attacked,
                                                                          expected):
    """A match or `_revinclude`d resource the EHR sent without an `id`, or with one that is no FHIR
    id, cannot be served (its `fullUrl` would be invalid): the Bundle holds the others and a warning
    `incomplete` outcome counting those left out (it was a 500, `KeyError: 'id'`)."""
    status, body, _, _ = fhir(hostile_clinic, path)
    assert status == 200 and served_entries(body) == expected and not outcomes_of(body), body    # the control
    hostile.attack("bad-ids", on=attacked)
    status, body, _, _ = fhir(hostile_clinic, path)
    assert status == 200 and served_entries(body) == expected and body["total"] == 1, body
    assert outcomes_of(body) == [{"severity": "warning", "code": "incomplete", "diagnostics": (
        "The clinic's EHR answered 2 resources without a valid id (FHIR requires one): left out.")}], body


def test_a_chart_read_by_everything_passes_over_entries_that_are_no_objects(runtime, hostile_clinic, hostile):
    """`Patient/{id}/$everything` answering entries that are no entry object beside the chart: the
    chart is built from the real ones (an entry that was no object raised AttributeError)."""
    from connectors import Bounds, connector_for
    from helpers.hostile_ehr import patient
    from models.directory import Organization
    org_id = hostile_clinic[0]
    hostile.attack("offered", on="metadata")
    hostile.attack("junk-entries", on="$everything")
    connector = connector_for(runtime, Organization.get_by_id(org_id), Bounds.batch(runtime.settings))
    chart = connector.fetch_chart(patient()["id"])
    assert chart.patient.id == patient()["id"]
    assert any(path.endswith("/$everything") or "/$everything?" in path for path, _ in hostile.requests())


def test_a_provenance_target_written_as_a_bare_string_is_no_reference(hostile_clinic, hostile):
    """A Provenance whose `target` holds a string beside its Reference objects: revincluded by the
    Reference to the page (it was a 500, `AttributeError`), the string naming nothing."""
    path, expected = "/Condition?patient=pt-1&_revinclude=Provenance:target", [
        ("match", "Condition/cond-1"), ("include", "Provenance/prov-1")]
    status, body, _, _ = fhir(hostile_clinic, path)
    assert status == 200 and served_entries(body) == expected, body                              # the control
    hostile.attack("string-refs", on="Provenance")
    status, body, _, _ = fhir(hostile_clinic, path)
    assert status == 200 and served_entries(body) == expected, body
    assert body["entry"][1]["resource"]["target"][1] == "Patient/pt-1", body      # as the EHR holds it


def test_an_appointment_actor_written_as_a_bare_string_takes_no_part(hostile_clinic, hostile):
    """An Appointment whose `participant[].actor` is a string, not a Reference: it matches no
    `practitioner=` search (it was a 500, `AttributeError`); the well-formed one beside it is served."""
    path = "/Appointment?practitioner=Practitioner/pr-1"
    status, body, _, _ = fhir(hostile_clinic, path)
    assert status == 200 and served_entries(body) == [("match", "Appointment/ap-1")], body       # the control
    hostile.attack("string-refs", on="Appointment")
    status, body, _, _ = fhir(hostile_clinic, path)
    assert status == 200 and served_entries(body) == [("match", "Appointment/ap-1")] and body["total"] == 1, body


# -- the hub page ----------------------------------------------------------------------------------

def hub_page(runtime, issuer: str, user_id: str):
    done, _, _ = cli(runtime.settings, "sandbox", "signin-link", "--user", user_id, "--json")
    assert done.returncode == 0, done.stderr
    link = urllib.parse.urlsplit(json.loads(done.stdout)["url"])
    status, _, _, headers = get(f"{issuer}{link.path}?{link.query}")
    assert status == 302, status
    cookie = headers["Set-Cookie"].split(";")[0]
    return get(f"{issuer}/sandbox/hub", headers={"Cookie": cookie, "Accept": "text/html"})


@pytest.mark.parametrize("attack", ["next-same", "next-endless", "drip", "endless-body"])
def test_the_hub_page_answers_within_its_deadline_without_the_ehr_s_data(runtime, hostile_clinic, hostile, attack):
    _, ana, _, issuer = hostile_clinic
    status, page, _, _ = hub_page(runtime, issuer, ana.id)
    assert status == 200 and "Jane Doe" in page, page                                   # the control
    hostile.attack(attack, on="Appointment")
    status, page, seconds, _ = hub_page(runtime, issuer, ana.id)
    assert status == 200 and "Jane Doe" not in page and "appointments-error" in page, page
    assert seconds <= INTERACTIVE_DEADLINE + MARGIN, seconds


# -- `ehr check` -----------------------------------------------------------------------------------

@pytest.mark.parametrize("attack", ["drip", "endless-body", "outcome-200"])
def test_ehr_check_names_the_failure_within_its_deadline(runtime, hostile_clinic, hostile, attack):
    org_id = hostile_clinic[0]
    done, _, _ = cli(runtime.settings, "ehr", "check", "--org", org_id, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stdout + done.stderr   # the control
    hostile.attack(attack, on="Practitioner")
    done, seconds, _ = cli(runtime.settings, "ehr", "check", "--org", org_id, "--json",
                           timeout=INTERACTIVE_DEADLINE + 3 * MARGIN)
    verdict = json.loads(done.stdout)
    assert done.returncode == 1 and not verdict["ok"], verdict
    assert seconds <= INTERACTIVE_DEADLINE + 3 * MARGIN, seconds    # one step's deadline, and a process's start
    failed = verdict["steps"][-1]
    assert failed["step"] == "practitioner" and not failed["ok"], verdict
    assert {"drip": "deadline", "endless-body": "max_bytes", "outcome-200": "error"}[attack] in failed["detail"], failed


# -- the night ----------------------------------------------------------------------------------

def move_clock_to(clock, when: dt.datetime) -> None:
    clock.offset = 0.0
    clock.advance((when - clock.now()).total_seconds())


def night_of(runtime, world, ana) -> dt.date:
    """A night whose window the test chooses, Ana in the hub (the app opened) the afternoon before."""
    night = runtime.clock.now().date() + dt.timedelta(days=30)
    start, _ = night_window(runtime.settings, night)
    move_clock_to(runtime.clock, start - dt.timedelta(hours=10))
    record_platform_verification(runtime, world.app, ana)
    return night


@pytest.mark.parametrize("attack, bound", [("next-endless", "max_pages"), ("next-same", "repeated_next"),
                                           ("endless-body", "max_bytes"), ("outcome-200", "error"),
                                           ("many-objects-32", "json_values"),
                                           ("next-outside-base", "outside_base")])
def test_the_night_fails_loudly_for_the_attacked_clinic_and_the_others_go_on(runtime, world, hostile_clinic, hostile,
                                                                              attack, bound):
    org_id, ana, _, _ = hostile_clinic
    night = night_of(runtime, world, ana)
    done, _, _ = cli(runtime.settings, "snapshot", "run", "--date", night.isoformat(), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["organizations"][org_id] == 1, report                # the control
    hostile.attack(attack, on="Appointment")
    done, _seconds, peak = cli(runtime.settings, "snapshot", "run", "--date", night.isoformat(), "--json",
                              timeout=SNAPSHOT_SECONDS)
    report = json.loads(done.stdout)
    assert done.returncode == 1, report
    assert report["organizations"][org_id].startswith("failed: ") and bound in report["organizations"][org_id], report
    assert world.org.id in report["built"], report                      # the sandbox clinic's night is built
    assert peak < NIGHT_PEAK_BYTES, f"a child's peak RSS reached {peak >> 20} MiB"
    inside_base(hostile)


# -- the base, normalised ---------------------------------------------------------------------------

@pytest.mark.parametrize("url, inside", [
    ("https://ehr.example/fhir/R4/Patient/x", True),
    ("HTTPS://EHR.example:443/fhir/R4/Patient/x", True),          # scheme and host case, the default port
    ("https://ehr.example/fhir/R4", True),
    ("https://ehr.example/fhir/R4/Appointment?page=2&_getpages=abc", True),
    ("https://ehr.example/fhir/R4x/Patient/x", False),           # a sibling path: the boundary is a `/`
    ("https://ehr.example/fhir/R4/../admin", False),
    ("https://ehr.example/fhir/R4/./Patient/x", False),
    ("https://ehr.example/fhir/R4/%2e%2e/admin", False),
    ("https://ehr.example/fhir/R4/%2E%2E%2Fadmin", False),
    ("https://ehr.example/fhir/R4/%252e%252e/admin", False),     # encoded twice
    ("https://ehr.example/fhir/R4\\..\\admin", False),
    ("https://ehr.example/fhir/R4/Patient/x\n", False),
    ("https://user@ehr.example/fhir/R4/Patient/x", False),
    ("https://ehr.example.attacker.example/fhir/R4/Patient/x", False),
    ("https://ehr.example:8443/fhir/R4/Patient/x", False),
    ("http://ehr.example/fhir/R4/Patient/x", False),             # not downgraded to http
    ("//ehr.example/fhir/R4/Patient/x", False),
    ("ftp://ehr.example/fhir/R4/Patient/x", False),
    ("https://ehr.example/admin", False),
])
def test_the_base_is_compared_after_normalising(url, inside):
    from connectors.fhir.transport import inside_base
    assert inside_base(url, "https://ehr.example/fhir/R4/") is inside
