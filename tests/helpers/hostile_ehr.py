"""A hostile FHIR R4 EHR for the tests: an open server (`--fhir-auth none`) on a free loopback port,
in a thread of the test process, that answers a small clinic (one practitioner, one patient, one
booked appointment (an hour into the dates an Appointment search asks), one observation, one
condition and its provenance, one medication request and its medication) until a test switches an
attack on for a resource type.

Attacks (`HostileEhr.attack(name, on=TYPE)`; reads and searches of TYPE):
- `next-other-host`, `next-outside-base`, `next-encoded`, `next-dotdot`, `next-prefix`: a searchset
  whose `next` leaves the FHIR base (another host name, the same host outside the base path, the
  way out spelled `%2e%2e`, spelled `..`, a sibling path `/fhir/R4x`);
- `next-same`: an empty page whose `next` is the same URL, forever;
- `next-endless`: a new empty page each time, forever; `next-endless-full`: the same with 30 new
  matches on each page;
- `endless-body`: a 200 whose body never ends (chunked, as fast as it is read);
- `drip`: a 200 whose body comes one byte a second;
- `many-objects`: a 200 searchset (or resource) whose `entry` is empty objects, `[{},{},...]`, the
  body 1 KiB short of the interactive cap (4 MiB, `SVC_EHR_INTERACTIVE_MAX_BYTES`);
  `many-objects-32`: the same 1 KiB short of the batch cap (32 MiB, `SVC_EHR_BATCH_MAX_BYTES`);
- `outcome-200`: a 200 OperationOutcome of severity `error`; `outcome-entry`: a searchset carrying
  an `outcome` entry of severity `error`; `outcome-warning`: the normal searchset plus an
  `outcome` entry of severity `warning` (fine);
- `foreign-refs`: resources whose references and attachment URLs name another host;
- `redirect`: a 302 to another host; `retry-after`: 503 with `Retry-After: 30`;
- `no-id`: a searchset whose resources have no `id` (FHIR requires one: svc-auth fails that read or
  night with a clear error naming the answer);
- `bad-ids`: the normal searchset plus a copy of each match without `id` and one whose `id` is no
  FHIR id (`../x`);
- `junk-entries`: the normal searchset plus entries that are no entry object (`"x"`, `7`, `null`,
  `{"resource": "y"}`, an entry without `resource`); on `$everything` (with `offered` on `metadata`,
  which then offers it), `Patient/{id}/$everything` answers the patient's chart so;
- `long-text`: the Condition's `code.text` is `LONG_WORD`, one word of 60,000 characters without a
  space (a chart build wrapped such a word in time cubic in its length: hours);
- `malformed` (on Condition): beside `cond-1`, Conditions not in R4's shape: `cond-2` whose `code` is
  a bare string, `cond-3` whose `code.coding` holds a string, `cond-4` whose `code.coding` is a string;
- `large-problems` (on Condition): `LARGE_PAGES` pages of 8 Conditions, each with a text of about
  1 MB (words), along `next` links: some 80 MB of problems in all;
- `slow-endless`: each page comes after `SLOW_PAGE_SECONDS`, well within any deadline per request,
  and links a new next page, forever;
- `string-refs`: a Provenance whose second `target` is a bare string (`"Patient/pt-1"`), an
  Appointment search answering beside `ap-1` an `ap-2` whose `participant[].actor`s are bare strings;
- `export-forgotten` (on `$export`): `metadata` offers Bulk Data export, each `POST Patient/$export`
  answers 202 with a new status URL (`$export-status/N`), and every status URL answers 404 (the EHR
  forgets each job at once), to a GET and a DELETE.

For a `smart-backend` clinic it serves `.well-known/smart-configuration` and a token endpoint
(`/oauth/token`) that grants `TOKEN` to any client assertion.

`requests()` lists every request's path (raw, as sent) and its `Authorization` header, so a test
sees what was (not) followed."""
from __future__ import annotations

import datetime as dt
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

NPI_SYSTEM = "http://hl7.org/fhir/sid/us-npi"
NPI = "1417000043"
FOREIGN = "http://attacker.example/fhir"
BASE_PATH = "/fhir/R4"
TOKEN = "hostile-ehr-token"   # what its token endpoint grants svc-auth (`smart-backend` clinics)
LONG_WORD = "Asthma" + "x" * 59_994   # `long-text`: one word, no space (60,000 characters)
LARGE_PAGES = 10                    # `large-problems`: pages of 8 Conditions of ~1 MB of text each
SLOW_PAGE_SECONDS = 1.0              # `slow-endless`: the wait before each page
DRIP_SECONDS = 120          # a drip stops by itself after this long (the test has long failed by then)
MANY_OBJECTS_BYTES = {"many-objects": 4 * 1024 * 1024 - 1024, "many-objects-32": 32 * 1024 * 1024 - 1024}


class HostileEhr:
    """The running server: its base, the attacks switched on, and the requests it received."""

    def __init__(self):
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.ehr = self
        self.port = self.server.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self.base = self.origin + BASE_PATH
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._attacks: dict[str, str] = {}
        self._requests: list[tuple[str, str | None]] = []
        self._jobs = 0
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def attack(self, name: str, on: str) -> None:
        with self._lock:
            self._attacks[on] = name

    def calm(self) -> None:
        with self._lock:
            self._attacks.clear()
            self._requests.clear()

    def kick_off(self) -> int:
        """The number of a new export job (`export-forgotten`)."""
        with self._lock:
            self._jobs += 1
            return self._jobs

    def attack_on(self, kind: str) -> str | None:
        with self._lock:
            return self._attacks.get(kind)

    def record(self, path: str, authorization: str | None) -> None:
        with self._lock:
            self._requests.append((path, authorization))

    def requests(self) -> list[tuple[str, str | None]]:
        with self._lock:
            return list(self._requests)

    def close(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


def practitioner() -> dict:
    return {"resourceType": "Practitioner", "id": "pr-1", "identifier": [{"system": NPI_SYSTEM, "value": NPI}],
            "name": [{"family": "Lopez", "given": ["Ana"]}]}


def patient(foreign: bool = False) -> dict:
    found = {"resourceType": "Patient", "id": "pt-1", "name": [{"family": "Doe", "given": ["Jane"]}],
             "birthDate": "1970-01-02", "gender": "female"}
    if foreign:
        found["generalPractitioner"] = [{"reference": f"{FOREIGN}/Practitioner/x"}]
        found["managingOrganization"] = {"reference": f"{FOREIGN}/Organization/o", "display": "Elsewhere"}
        found["photo"] = [{"contentType": "image/png", "url": f"{FOREIGN}/Binary/photo"}]
    return found


def appointment(start: dt.datetime = dt.datetime(2030, 1, 7, 9)) -> dict:
    return {"resourceType": "Appointment", "id": "ap-1", "status": "booked", "start": f"{start.isoformat()}Z",
            "end": f"{(start + dt.timedelta(minutes=30)).isoformat()}Z", "description": "Check-up",
            "participant": [{"actor": {"reference": "Practitioner/pr-1"}, "status": "accepted"},
                            {"actor": {"reference": "Patient/pt-1"}, "status": "accepted"}]}


def searched_start(query: str) -> dt.datetime | None:
    """An hour after the lower bound of an Appointment search's dates (`date=ge...`, Oracle's
    `-date-or-req-period=ge...`), as an EHR answers the searched days; None when not searched so."""
    for name in ("date", "-date-or-req-period"):
        for value in parse_qs(query).get(name, ()):
            if value.startswith("ge"):
                try:
                    found = dt.datetime.fromisoformat(value[2:].replace("Z", "+00:00"))
                except ValueError:
                    return None
                return found.astimezone(dt.timezone.utc).replace(tzinfo=None) + dt.timedelta(hours=1)
    return None


def string_actors() -> dict:
    """An Appointment whose participants' `actor` is a bare string, not a Reference object."""
    found = appointment()
    return {**found, "id": "ap-2", "participant": [{**p, "actor": p["actor"]["reference"]} for p in found["participant"]]}


def condition() -> dict:
    return {"resourceType": "Condition", "id": "cond-1", "code": {"text": "Asthma"},
            "subject": {"reference": "Patient/pt-1"}}


def provenance(string_target: bool = False) -> dict:
    second = "Patient/pt-1" if string_target else {"reference": "Patient/pt-1"}
    return {"resourceType": "Provenance", "id": "prov-1", "recorded": "2030-01-07T09:00:00Z",
            "target": [{"reference": "Condition/cond-1"}, second],
            "agent": [{"who": {"reference": "Practitioner/pr-1"}}]}


def medication_request() -> dict:
    return {"resourceType": "MedicationRequest", "id": "mr-1", "status": "active", "intent": "order",
            "subject": {"reference": "Patient/pt-1"}, "medicationReference": {"reference": "Medication/med-1"}}


def medication() -> dict:
    return {"resourceType": "Medication", "id": "med-1", "code": {"text": "Salbutamol"}}


def observation(base: str, foreign: bool = False) -> dict:
    found = {"resourceType": "Observation", "id": "obs-1", "status": "final", "code": {"text": "Weight"},
             "subject": {"reference": f"{base}/Patient/pt-1"}, "valueQuantity": {"value": 70, "unit": "kg"},
             "extension": [{"url": "http://hl7.org/fhir/StructureDefinition/data-absent-reason",
                            "valueCode": "unknown"}]}
    if foreign:
        found["subject"] = {"reference": f"{FOREIGN}/Patient/pt-1"}
        found["performer"] = [{"reference": f"{FOREIGN}/Practitioner/x"},
                              {"reference": "//attacker.example/fhir/Practitioner/y", "display": "Dr. Y"},
                              {"reference": f"{base}/Practitioner/pr-1"}]
        found["derivedFrom"] = [{"reference": "http://127.0.0.1:1/fhir/R4/Observation/z"}]
    return found


def searchset(resources: list[dict], next_url: str | None = None, outcome: dict | None = None) -> dict:
    entries = [{"resource": r, "search": {"mode": "match"}} for r in resources]
    if outcome:
        entries.append({"resource": outcome, "search": {"mode": "outcome"}})
    return {"resourceType": "Bundle", "type": "searchset", "total": len(resources), "entry": entries,
            "link": [{"relation": "next", "url": next_url}] if next_url else []}


def with_junk(bundle: dict) -> dict:
    """`bundle` with entries that are no entry object (a string, a number, null, a string resource,
    an entry without a resource) after its real ones."""
    bundle["entry"] += ["x", 7, None, {"resource": "y"}, {"search": {"mode": "match"}}]
    return bundle


def bulk_statement() -> dict:
    """A CapabilityStatement offering Bulk Data export (`Patient/$export`) of the types this EHR answers."""
    kinds = ("Patient", "Practitioner", "Appointment", "Observation", "Condition", "Provenance",
             "MedicationRequest", "Medication")
    return {"resourceType": "CapabilityStatement", "status": "active", "kind": "instance", "fhirVersion": "4.0.1",
            "format": ["json"], "instantiates": ["http://hl7.org/fhir/uv/bulkdata/CapabilityStatement/bulk-data"],
            "rest": [{"mode": "server", "resource": [
                {"type": k, **({"operation": [{"name": "patient-export"}]} if k == "Patient" else {})} for k in kinds]}]}


def outcome(severity: str) -> dict:
    return {"resourceType": "OperationOutcome",
            "issue": [{"severity": severity, "code": "exception", "diagnostics": f"the EHR's {severity}"}]}


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], OSError):  # a reader that hangs up is what a bounded client does
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True   # headers and body are two writes: no 40 ms wait between pages

    def log_message(self, *args):  # quiet
        pass

    @property
    def ehr(self) -> HostileEhr:
        return self.server.ehr

    def do_POST(self):  # noqa: N802: the token endpoint of a `smart-backend` clinic grants any assertion
        self.ehr.record(self.path, self.headers.get("Authorization"))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == f"{BASE_PATH}/Patient/$export" and self.ehr.attack_on("$export") == "export-forgotten":
            return self.send_json(202, outcome("information"),
                                  {"Content-Location": f"{self.ehr.base}/$export-status/{self.ehr.kick_off()}"})
        if self.path != "/oauth/token":
            return self.send_json(404, outcome("error"))
        self.send_json(200, {"access_token": TOKEN, "token_type": "Bearer", "expires_in": 300})

    def do_DELETE(self):  # noqa: N802: an export's status URL (`export-forgotten`: no job is ever known)
        self.ehr.record(self.path, self.headers.get("Authorization"))
        self.send_json(404, outcome("error"))

    def do_GET(self):
        self.ehr.record(self.path, self.headers.get("Authorization"))
        parts = urlsplit(self.path)
        if parts.path == f"{BASE_PATH}/.well-known/smart-configuration":
            return self.send_json(200, {"token_endpoint": f"{self.ehr.origin}/oauth/token",
                                        "token_endpoint_auth_methods_supported": ["private_key_jwt"]})
        if parts.path != BASE_PATH and not parts.path.startswith(BASE_PATH + "/"):
            return self.send_json(404, outcome("error"))
        rest = parts.path[len(BASE_PATH) + 1:].split("/")
        kind, ident = rest[0], (rest[1] if len(rest) > 1 else None)
        if rest == ["metadata"] and self.ehr.attack_on("$export") == "export-forgotten":
            return self.send_json(200, bulk_statement())
        if rest[-1] in ("metadata", "$everything") and self.ehr.attack_on(rest[-1]):
            return self.everything(rest[-1], self.ehr.attack_on(rest[-1]))
        attack = self.ehr.attack_on(kind)
        asked = (parse_qs(parts.query).get("page") or ["1"])[0]
        page = int(asked) if asked.isdigit() else 1
        ehr, base = self.ehr, self.ehr.base
        if attack == "endless-body":
            return self.endless(kind, ident)
        if attack == "drip":
            return self.drip()
        if attack in MANY_OBJECTS_BYTES:
            return self.many_objects(MANY_OBJECTS_BYTES[attack])
        if attack == "redirect":
            return self.send_json(302, {}, {"Location": f"http://localhost:{ehr.port}{BASE_PATH}/{kind}"})
        if attack == "retry-after":
            return self.send_json(503, outcome("error"), {"Retry-After": "30"})
        if attack == "outcome-200":
            return self.send_json(200, outcome("error"))
        if ident is not None:
            found = {"Patient": patient(attack == "foreign-refs"), "Practitioner": practitioner(),
                     "Appointment": appointment(), "Observation": observation(base, attack == "foreign-refs"),
                     "Condition": condition(), "Provenance": provenance(), "MedicationRequest": medication_request(),
                     "Medication": medication()}.get(kind)
            if found is None or found["id"] != ident:
                return self.send_json(404, outcome("error"))
            return self.send_json(200, found)
        following = {"next-other-host": f"http://localhost:{ehr.port}{BASE_PATH}/{kind}?page=2",
                     "next-outside-base": f"{ehr.origin}/admin/exfiltrate?page=2",
                     "next-encoded": f"{base}/%2e%2e/%2e%2e/admin/exfiltrate?page=2",
                     "next-dotdot": f"{base}/../../admin/exfiltrate?page=2",
                     "next-prefix": f"{ehr.origin}/fhir/R4x/{kind}?page=2",
                     "next-same": f"{base}/{kind}?page=loop",
                     "next-endless": f"{base}/{kind}?page={page + 1}"}.get(attack or "")
        if following and attack in ("next-same", "next-endless"):
            return self.send_json(200, searchset([], following))
        if attack == "next-endless-full":
            found = [{**observation(base), "id": f"obs-{page}-{n}"} for n in range(30)]
            return self.send_json(200, searchset(found, f"{base}/{kind}?page={page + 1}"))
        matches = {"Practitioner": [practitioner()], "Patient": [patient(attack == "foreign-refs")],
                   "Appointment": [appointment(searched_start(parts.query) or dt.datetime(2030, 1, 7, 9)), patient()],
                   "Observation": [observation(base, attack == "foreign-refs")], "Condition": [condition()],
                   "Provenance": [provenance(attack == "string-refs")], "MedicationRequest": [medication_request()],
                   "Medication": [medication()]}.get(kind, [])
        if attack == "no-id":
            matches = [{k: v for k, v in r.items() if k != "id"} for r in matches]
        if attack == "bad-ids":
            ours = [r for r in matches if r["resourceType"] == kind]
            matches += [{k: v for k, v in r.items() if k != "id"} for r in ours] + [{**r, "id": "../x"} for r in ours]
        if attack == "long-text":
            matches = [{**r, "code": {"text": LONG_WORD}} if r["resourceType"] == "Condition" else r for r in matches]
        if attack == "slow-endless":
            ehr.stopping.wait(SLOW_PAGE_SECONDS)
            return self.send_json(200, searchset([], f"{base}/{kind}?page={page + 1}"))
        if attack == "large-problems" and kind == "Condition":
            found = [{**condition(), "id": f"cond-{page}-{n}", "code": {"text": f"Problem {page}-{n} " + "lorem " * 170_000}}
                     for n in range(8)]
            return self.send_json(200, searchset(found, f"{base}/{kind}?page={page + 1}" if page < LARGE_PAGES else None))
        if attack == "malformed" and kind == "Condition":
            matches += [{**condition(), "id": "cond-2", "code": "Asthma"},
                        {**condition(), "id": "cond-3", "code": {"coding": ["J45"]}},
                        {**condition(), "id": "cond-4", "code": {"coding": "J45"}}]
        if attack == "string-refs" and kind == "Appointment":
            matches.insert(1, string_actors())
        if attack == "junk-entries":
            return self.send_json(200, with_junk(searchset(matches, following)))
        if attack == "outcome-entry":
            return self.send_json(200, searchset(matches, outcome=outcome("error")))
        if attack == "outcome-warning":
            return self.send_json(200, searchset(matches, outcome=outcome("warning")))
        return self.send_json(200, searchset(matches, following))

    def everything(self, path: str, attack: str) -> None:
        """`metadata` offering Patient `$everything` (attack `offered`), and `Patient/{id}/$everything`
        answering the patient, an Observation and a Condition (`junk-entries`: with junk entries)."""
        if path == "metadata":
            return self.send_json(200, {"resourceType": "CapabilityStatement", "status": "active", "kind": "instance",
                                        "fhirVersion": "4.0.1", "format": ["json"], "rest": [{"mode": "server", "resource": [
                                            {"type": "Patient", "operation": [{"name": "everything"}]}]}]})
        bundle = searchset([patient(), observation(self.ehr.base), condition()])
        return self.send_json(200, with_junk(bundle) if attack == "junk-entries" else bundle)

    def send_json(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/fhir+json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def endless(self, kind: str, ident: str | None) -> None:
        """A 200 whose JSON never closes: chunks as fast as the reader takes them."""
        self.send_response(200)
        self.send_header("Content-Type", "application/fhir+json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        head = (json.dumps({"resourceType": kind, "id": ident})[:-1] + ', "extension": [' if ident
                else '{"resourceType": "Bundle", "type": "searchset", "entry": [')
        item = (json.dumps({"url": "http://example.org/x", "valueString": "x" * 1000}) if ident
                else json.dumps({"resource": appointment(), "search": {"mode": "match"}})) + ","
        chunk = (item * max(1, 64 * 1024 // len(item))).encode()
        try:
            self.write_chunk(head.encode())
            while not self.ehr.stopping.is_set():
                self.write_chunk(chunk)
        except OSError:
            pass  # the reader hung up: what a bounded client does
        self.close_connection = True

    def many_objects(self, size: int) -> None:
        """A 200 searchset of `size` bytes whose entries are empty objects: ~30x its size once parsed."""
        head, tail = b'{"resourceType": "Bundle", "type": "searchset", "entry": [', b"{}]}"
        body = head + b"{}," * ((size - len(head) - len(tail)) // 3) + tail
        self.send_response(200)
        self.send_header("Content-Type", "application/fhir+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass  # the reader hung up

    def drip(self) -> None:
        """A 200 whose body comes one byte a second (a large Content-Length it never reaches)."""
        body = json.dumps(patient()).encode() * 1000
        self.send_response(200)
        self.send_header("Content-Type", "application/fhir+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            for n in range(DRIP_SECONDS):
                if self.ehr.stopping.wait(1.0 if n else 0.0):
                    break
                self.wfile.write(body[n:n + 1])
                self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
