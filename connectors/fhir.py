"""The FHIR R4 connector (`ehr: fhir`): a clinic's EHR over HL7 FHIR R4 (US Core), reached with
SMART Backend Services. The only module that knows FHIR search syntax.

An organization on `fhir` has a FHIR base URL (`ehr_url`), svc-auth's client id at that EHR
(`fhir_client_id`) and `fhir_auth`: `smart-backend` (default) or `none` (an open test server).

- **Authentication** (SMART Backend Services): the token endpoint comes from
  `{base}/.well-known/smart-configuration`; the token from the `client_credentials` grant with a
  `private_key_jwt` client assertion (RFC 7523: `iss` = `sub` = client id, `aud` = the token
  endpoint, a unique `jti`, `exp` 5 minutes ahead, RS384, the `kid` of a key published at
  `{SVC_ISSUER}/ehr/jwks.json`). Tokens are cached per runtime until shortly before they expire,
  and renewed once when the EHR answers 401.
- **Appointments**: the Practitioner by NPI (`identifier=http://hl7.org/fhir/sid/us-npi|<npi>`),
  then its Appointments in the window with `_include=Appointment:patient` (no query per patient),
  following the Bundle's `next` links. Listed statuses: `LISTED_STATUSES`; the others are not.
- **Charts**: the Patient, then its resources page by page: `Patient/{id}/$everything` where the
  EHR's CapabilityStatement (`{base}/metadata`, read once per runtime and base, cached an hour)
  offers an operation `everything` on Patient and does not refuse it (a 4xx on its first page
  makes the connector fall back, remembered for the hour); else searches by patient of `CHART_TYPES`
  (Condition, MedicationRequest, AllergyIntolerance, Encounter, Observation, DocumentReference).
  Either way each page is spooled to disk (`connectors.fhir_chart`), so the EHR is read once and
  memory stays flat for thousands of resources; the PDF and JSON stream from the spool.
- **The platform FHIR API** (`read_resource`, `search_resources`): a read is `GET {base}/{type}/{id}`
  (404/410: `ResourceNotFound`); a search translates the neutral `ResourceQuery` into this EHR's
  search parameters (`SEARCH_DATE`, `PATIENT_SEARCH`) and yields the matches of the asked type
  lazily, page by page. Ids, NPIs and types are validated before they reach a URL; a query that
  cannot apply to the type (a date on Practitioner) matches nothing.
- **Errors**: 401/403 and an OperationOutcome `login`/`forbidden` are permanent
  (`ConnectorError`, saying what to fix); 429, 5xx, timeouts and refused connections are retried
  with backoff, honouring `Retry-After`, then raised as `ConnectorUnavailable` (the task retries).
"""
from __future__ import annotations

import datetime as dt
import itertools
import json
import logging
import re
import threading
import time
import uuid
from types import MappingProxyType
from urllib.parse import urlencode, urlsplit

import urllib3
from jose import jwt

from connectors.base import (Appointment, Chart, ConnectorError, ConnectorUnavailable, Patient, PatientNotFound,
                             Provider, ResourceNotFound, ResourceQuery)
from connectors.fhir_chart import CHART_TYPES, ChartSpool, text_of

NPI_SYSTEM = "http://hl7.org/fhir/sid/us-npi"
FHIR_ID = re.compile(r"[A-Za-z0-9\-.]{1,64}")  # FHIR R4 id (always `fullmatch`ed)
RESOURCE_TYPE = re.compile(r"[A-Z][A-Za-z]{1,63}")
TOKEN_VALUE = re.compile(r"[A-Za-z0-9\-.]{1,64}")  # an identifier value: no `,` (OR) nor `|` (system)
SEARCH_DATE = MappingProxyType({"Appointment": "date", "Encounter": "date", "Observation": "date",
                                "Condition": "onset-date", "MedicationRequest": "authoredon",
                                "AllergyIntolerance": "date", "DocumentReference": "date"})
"""The search parameter of each type's date (a `ResourceQuery`'s start/end)."""
PATIENT_SEARCH = frozenset(("Appointment", "Encounter", "Condition", "Observation", "MedicationRequest",
                            "AllergyIntolerance", "DocumentReference"))
"""Types searched by `patient`; Patient itself by `_id`."""
PRACTITIONER_SEARCH = frozenset(("Appointment", "Encounter"))
LISTED_STATUSES = ("proposed", "pending", "booked", "arrived", "checked-in")
"""FHIR Appointment statuses that are listed (the FHIR code is the API's `status`); `cancelled`,
`noshow`, `entered-in-error`, `fulfilled` and `waitlist` are not."""
SCOPES = ("system/Practitioner.rs", "system/Appointment.rs", "system/Patient.rs", "system/Encounter.rs",
          "system/Condition.rs", "system/Observation.rs", "system/MedicationRequest.rs",
          "system/AllergyIntolerance.rs", "system/DocumentReference.rs")
PAGE_SIZE = 100
ASSERTION_SECONDS = 300          # a client assertion's lifetime (SMART: at most 5 minutes)
TOKEN_MARGIN_SECONDS = 30        # a cached token is renewed this long before it expires
CAPABILITIES_SECONDS = 3600      # how long an EHR's CapabilityStatement verdict is cached
ATTEMPTS = 4                     # per request, for 429, 5xx, timeouts and refused connections
BACKOFF_SECONDS = 0.5            # doubled per attempt, unless the EHR says Retry-After
MAX_RETRY_AFTER_SECONDS = 30.0   # a longer Retry-After ends the attempts: the task retries later
TIMEOUT = urllib3.Timeout(connect=5.0, read=30.0)
PERMANENT_ISSUES = ("login", "forbidden", "security")
MAX_REFERENCE_DEPTH = 64         # how deep into a resource references are made relative

log = logging.getLogger("svc_auth.connectors.fhir")


class AccessRefused(ConnectorError):
    """The EHR refused svc-auth's access (401/403, an OperationOutcome login/forbidden/security)."""


class RequestRefused(ConnectorError):
    """The EHR answered a request with a status that is neither success nor worth retrying (400,
    405, 422...): permanent for that request."""


class ExpiringCache:
    """Values of one runtime by key, each until `margin` seconds before it expires: the access
    tokens per (token endpoint, client id), and what each EHR's CapabilityStatement offers."""

    def __init__(self, margin: float = 0.0):
        self._lock = threading.Lock()
        self._values: dict = {}
        self.margin = margin

    def get(self, key):
        """The value, or None when there is none or it expired."""
        with self._lock:
            value, expires = self._values.get(key, (None, 0.0))
        return value if time.time() < expires - self.margin else None

    def put(self, key, value, expires_in: float) -> None:
        with self._lock:
            self._values[key] = (value, time.time() + expires_in)

    def drop(self, key) -> None:
        with self._lock:
            self._values.pop(key, None)


def bearer_tokens() -> ExpiringCache:
    """A runtime's EHR access tokens: renewed `TOKEN_MARGIN_SECONDS` before they expire."""
    return ExpiringCache(margin=TOKEN_MARGIN_SECONDS)


class FhirClient:
    """HTTP to one FHIR base: discovery, the backend-services token, JSON reads with retries."""

    def __init__(self, base_url: str, client_id: str, auth: str, keys, tokens: ExpiringCache,
                 capabilities: ExpiringCache, http: urllib3.PoolManager | None = None, sleep=time.sleep):
        self.base = base_url.rstrip("/")
        self.client_id, self.auth, self.keys, self.tokens = client_id, auth, keys, tokens
        self.capabilities = capabilities
        self.http = http or urllib3.PoolManager(timeout=TIMEOUT, retries=False)
        self.sleep = sleep
        self._token_endpoint: str | None = None

    # -- SMART Backend Services -------------------------------------------------------------
    def smart_configuration(self) -> dict:
        status, body, _ = self._send("GET", f"{self.base}/.well-known/smart-configuration")
        if status != 200 or not isinstance(body, dict) or not body.get("token_endpoint"):
            raise ConnectorError(f"The EHR at {self.base} publishes no SMART configuration "
                                 f"(.well-known/smart-configuration answered {status}); check the FHIR base URL.")
        return body

    def token_endpoint(self) -> str:
        if self._token_endpoint is None:
            self._token_endpoint = self.smart_configuration()["token_endpoint"]
        return self._token_endpoint

    def access_token(self) -> str | None:
        """A bearer token for this EHR (None for an open server), from the cache or a new grant."""
        if self.auth == "none":
            return None
        endpoint = self.token_endpoint()
        key = (endpoint, self.client_id)
        token = self.tokens.get(key)
        if token:
            return token
        kid, pem = self.keys.current()
        now = int(time.time())
        assertion = jwt.encode({"iss": self.client_id, "sub": self.client_id, "aud": endpoint,
                                "jti": uuid.uuid4().hex, "iat": now, "exp": now + ASSERTION_SECONDS},
                               pem.decode(), algorithm="RS384", headers={"kid": kid})
        form = urlencode({"grant_type": "client_credentials", "scope": " ".join(SCOPES),
                          "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                          "client_assertion": assertion})
        status, body, _ = self._send("POST", endpoint, body=form.encode(),
                                     headers={"Content-Type": "application/x-www-form-urlencoded",
                                              "Accept": "application/json"})
        if status != 200 or not isinstance(body, dict) or not body.get("access_token"):
            error = body.get("error") if isinstance(body, dict) else None
            raise ConnectorError(
                f"The EHR's token endpoint refused svc-auth ({error or f'HTTP {status}'}): check that svc-auth is "
                f"registered there with client id {self.client_id!r} and its JWKS URL (/ehr/jwks.json), and that "
                f"the registration is active.")
        self.tokens.put(key, body["access_token"], float(body.get("expires_in") or 300))
        return body["access_token"]

    # -- FHIR reads ---------------------------------------------------------------------------
    def get(self, path_or_url: str, params: dict | None = None) -> dict:
        """GET a FHIR JSON resource (a relative path or an absolute `next` link of this server)."""
        url = path_or_url if path_or_url.startswith(("http://", "https://")) else f"{self.base}/{path_or_url}"
        if params:
            url += ("&" if "?" in url else "?") + urlencode(params, doseq=True)
        if urlsplit(url).netloc != urlsplit(self.base).netloc:
            raise ConnectorError(f"The EHR sent a link to another server ({urlsplit(url).netloc}); not followed.")
        for renewed in (False, True):
            headers = {"Accept": "application/fhir+json"}
            token = self.access_token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            status, body, _ = self._send("GET", url, headers=headers)
            if status == 401 and token and not renewed:
                self.tokens.drop((self.token_endpoint(), self.client_id))  # expired or revoked: ask once more
                continue
            break
        if status in (401, 403) or _issue_code(body) in PERMANENT_ISSUES:
            raise AccessRefused(f"The EHR refused svc-auth's access (HTTP {status}: {_issue_text(body)}); check the "
                                 f"client registration and its scopes ({' '.join(SCOPES)}).")
        if status in (404, 410):  # unknown, or deleted
            raise LookupError(_issue_text(body))
        if status != 200 or not isinstance(body, dict):
            raise RequestRefused(f"The EHR answered HTTP {status} to {urlsplit(url).path}: {_issue_text(body)}")
        return body

    def pages(self, resource_type: str, params: dict):
        """A search's Bundles, one page at a time, along their `next` links."""
        bundle = self.get(resource_type, params)
        while True:
            yield bundle
            following = next((link.get("url") for link in bundle.get("link") or () if link.get("relation") == "next"),
                             None)
            if not following:
                return
            bundle = self.get(following)

    def offers_everything(self) -> bool:
        """Whether the EHR's CapabilityStatement offers `Patient/{id}/$everything` (cached per base)."""
        offered = self.capabilities.get(self.base)
        if offered is None:
            try:
                offered = offers_patient_everything(self.get("metadata"))
            except ConnectorUnavailable:
                raise
            except (ConnectorError, LookupError) as exc:
                log.warning("the EHR at %s serves no CapabilityStatement (%s): charts use searches", self.base, exc)
                offered = False
            self.capabilities.put(self.base, offered, CAPABILITIES_SECONDS)
        return offered

    def _send(self, method: str, url: str, body: bytes | None = None, headers: dict | None = None):
        """(status, parsed JSON or None, headers), retrying 429, 5xx, timeouts and refusals."""
        delay = BACKOFF_SECONDS
        for attempt in range(1, ATTEMPTS + 1):
            try:
                response = self.http.request(method, url, body=body, headers=headers, redirect=False)
            except urllib3.exceptions.HTTPError as exc:
                outcome, wait = f"{type(exc).__name__}", delay
            else:
                if response.status != 429 and response.status < 500:
                    return response.status, _json(response.data), response.headers
                outcome = f"HTTP {response.status}"
                wait = _retry_after(response.headers.get("Retry-After"), delay)
            if attempt == ATTEMPTS or wait > MAX_RETRY_AFTER_SECONDS:
                raise ConnectorUnavailable(f"The EHR at {urlsplit(url).netloc} is unavailable ({outcome}); "
                                           f"the request will be retried.")
            log.info("EHR %s answered %s; retrying in %.1f s", urlsplit(url).netloc, outcome, wait)
            self.sleep(wait)
            delay *= 2


class FhirConnector:
    """One organization's FHIR EHR, behind the connector interface."""

    def __init__(self, organization, client: FhirClient):
        self.organization = organization
        self.client = client

    def practitioner_id(self, npi: str) -> str | None:
        """The FHIR id of the Practitioner with this NPI, or None when the EHR has none."""
        bundle = self.client.get("Practitioner", {"identifier": f"{NPI_SYSTEM}|{npi}", "_elements": "id"})
        ids = [e["resource"]["id"] for e in bundle.get("entry") or () if e.get("resource", {}).get("resourceType")
               == "Practitioner"]
        if len(ids) > 1:
            log.warning("%d practitioners have NPI %s in %s; using the first", len(ids), npi, self.organization.id)
        return ids[0] if ids else None

    def fetch_appointments(self, provider: Provider, start: dt.datetime, end: dt.datetime):
        practitioner = self.practitioner_id(provider.npi)
        if practitioner is None:
            log.warning("no Practitioner with NPI %s in the EHR of %s: no appointments", provider.npi,
                        self.organization.id)
            return
        params = {"practitioner": f"Practitioner/{practitioner}", "date": [f"ge{_instant(start)}", f"lt{_instant(end)}"],
                  "status": ",".join(LISTED_STATUSES), "_include": "Appointment:patient", "_count": PAGE_SIZE}
        for page in self.client.pages("Appointment", params):  # a page at a time: memory stays flat
            resources = [entry.get("resource") or {} for entry in page.get("entry") or ()]
            patients = {f"Patient/{r.get('id')}": r for r in resources if r.get("resourceType") == "Patient"}
            for resource in resources:
                if resource.get("resourceType") == "Appointment":
                    mapped = appointment_of(resource, patients)
                    if mapped is not None:
                        yield mapped

    def check(self, npi: str | None, now: dt.datetime) -> list[dict]:
        """`svc-auth ehr check`: discovery, the token, one Practitioner search (by `npi` when given)
        and one Appointment search; a verdict per step, stopping at the first failure."""
        steps = []

        def step(name: str, action):
            try:
                steps.append({"step": name, "ok": True, "detail": action()})
            except (ConnectorError, LookupError) as exc:
                steps.append({"step": name, "ok": False, "detail": str(exc)})
            return steps[-1]["ok"]

        client, found = self.client, {}
        open_server = client.auth == "none"
        if not step("discovery", lambda: "not used: an open server (--fhir-auth none)" if open_server
                    else f"token endpoint {client.token_endpoint()}"):
            return steps
        if not step("token", lambda: "not used: an open server" if open_server
                    else f"access token granted to {client.client_id}" if client.access_token() else "no token"):
            return steps

        def practitioner():
            params = {"identifier": f"{NPI_SYSTEM}|{npi}"} if npi else {"_count": 1}
            entries = self.client.get("Practitioner", params).get("entry") or ()
            found["id"] = next((e["resource"]["id"] for e in entries), None)
            if npi and found["id"] is None:
                raise ConnectorError(f"no Practitioner has NPI {npi}")
            return f"Practitioner/{found['id']}" if found["id"] else "the search answered (no practitioners)"
        if not step("practitioner", practitioner):
            return steps

        def appointments():
            params = {"date": f"ge{_instant(now)}", "_count": 1}
            if found.get("id"):
                params["practitioner"] = f"Practitioner/{found['id']}"
            bundle = self.client.get("Appointment", params)
            return f"the search answered ({bundle.get('total', len(bundle.get('entry') or ()))} from now on)"
        step("appointments", appointments)
        return steps

    def fetch_chart(self, patient_id: str) -> Chart:
        """The patient's chart: the Patient, then its resources (`chart_resources`) spooled page by
        page; the PDF and JSON read encounters, observations and documents back from the spool."""
        if not FHIR_ID.fullmatch(patient_id or ""):
            raise PatientNotFound(f"No patient has id {patient_id!r} in this EHR.")
        try:
            resource = self.client.get(f"Patient/{patient_id}")
        except LookupError:
            raise PatientNotFound(f"No patient has id {patient_id!r} in this EHR.") from None
        patient = patient_of(resource)
        if patient.date_of_birth is None:
            raise ConnectorError(f"Patient {patient_id} has no birthDate in the EHR; a chart needs it.")
        spool = ChartSpool(patient_id)
        try:
            for resource in self.chart_resources(patient_id):
                spool.add(resource)
        except BaseException:
            spool.close()
            raise
        if spool.left_out:
            log.warning("%d resources read for Patient %s name another patient: left out", spool.left_out, patient_id)
        return Chart(patient=patient, organization_name=self.organization.name, problems=spool.problems,
                     medications=spool.medications, allergies=spool.allergies,
                     encounter_source=lambda: spool.read("encounters"),
                     observation_source=lambda: spool.read("observations"),
                     document_source=lambda: spool.read("documents"))

    def chart_resources(self, patient_id: str):
        """The patient's chart resources, a page at a time: `$everything` where the EHR offers it,
        else one search by patient per type of `CHART_TYPES`."""
        if self.client.offers_everything():
            params = {"_type": ",".join(CHART_TYPES), "_count": PAGE_SIZE}
            pages = self.client.pages(f"Patient/{patient_id}/$everything", params)
            try:
                first = next(pages)
            except (LookupError, RequestRefused, AccessRefused) as exc:  # listed, yet refused to this client
                # (a registration refused altogether fails the searches below with what to fix)
                log.warning("the EHR at %s refused $everything (%s): charts use searches", self.client.base, exc)
                self.client.capabilities.put(self.client.base, False, CAPABILITIES_SECONDS)
            else:
                for page in itertools.chain((first,), pages):
                    for entry in page.get("entry") or ():
                        yield entry.get("resource") or {}
                return
        of_patient = {"patient": f"Patient/{patient_id}", "_count": PAGE_SIZE}
        for resource_type in CHART_TYPES:
            yield from self._all(resource_type, of_patient)

    def _all(self, resource_type: str, params: dict):
        """The matches of a search of `resource_type`, following its pages lazily."""
        for page in self.client.pages(resource_type, params):
            for entry in page.get("entry") or ():
                resource = entry.get("resource") or {}
                mode = (entry.get("search") or {}).get("mode", "match")  # not an `include`d or `outcome` entry
                if resource.get("resourceType") == resource_type and mode == "match":
                    yield resource

    def read_resource(self, resource_type: str, resource_id: str) -> dict:
        """`GET {base}/{type}/{id}`; `ResourceNotFound` when the EHR has none (404, 410) or the id
        cannot be a FHIR id."""
        if not RESOURCE_TYPE.fullmatch(resource_type or "") or not FHIR_ID.fullmatch(resource_id or ""):
            raise ResourceNotFound(f"No {str(resource_type)[:64]} has id {str(resource_id)[:64]!r} in this EHR.")
        try:
            resource = self.client.get(f"{resource_type}/{resource_id}")
        except LookupError:
            raise ResourceNotFound(f"No {resource_type} has id {resource_id!r} in this EHR.") from None
        if resource.get("resourceType") != resource_type or resource.get("id") != resource_id:
            raise ResourceNotFound(f"No {resource_type} has id {resource_id!r} in this EHR.")
        return relative_references(resource, self.client.base)

    def search_resources(self, query: ResourceQuery):
        """The resources matching `query`, from `query.offset` on, in the EHR's order; pages are
        read only as the caller iterates. A query the EHR cannot answer for the type matches nothing."""
        params = search_params(query)
        if params is None:
            return iter(())
        found = self._all(query.resource_type, {**params, "_count": PAGE_SIZE})
        return (relative_references(r, self.client.base) for r in itertools.islice(found, query.offset, None))


def relative_references(value, base: str, depth: int = 0):
    """`value` with each `reference` that is an absolute URL into this EHR's `base` made relative
    (`{base}/Patient/x` -> `Patient/x`): the platform API serves its own base, never the EHR's.
    Other references (relative, another server's, `#contained`) are kept as they are."""
    if depth > MAX_REFERENCE_DEPTH:
        return value
    if isinstance(value, list):
        return [relative_references(item, base, depth + 1) for item in value]
    if not isinstance(value, dict):
        return value
    found = {key: relative_references(item, base, depth + 1) for key, item in value.items()}
    reference = found.get("reference")
    if isinstance(reference, str) and reference.startswith(base + "/"):
        found["reference"] = reference[len(base) + 1:]
    return found


def search_params(query: ResourceQuery) -> dict | None:
    """The FHIR search parameters of a `ResourceQuery`, or None when nothing can match it (an
    invalid id, or a field that does not apply to the type)."""
    kind = query.resource_type
    if not RESOURCE_TYPE.fullmatch(kind or ""):
        return None
    ids, narrowed = set(query.ids), bool(query.ids)
    for own, value in (("Patient", query.patient), ("Practitioner", query.practitioner)):
        if value is not None and kind == own:  # the patient (practitioner) itself
            ids, narrowed = (ids & {value}) if narrowed else {value}, True
    if narrowed and (not ids or not all(FHIR_ID.fullmatch(i or "") for i in ids)):
        return None
    params = {"_id": ",".join(sorted(ids))} if ids else {}
    if query.patient is not None and kind != "Patient":
        if kind not in PATIENT_SEARCH or not FHIR_ID.fullmatch(query.patient):
            return None
        params["patient"] = f"Patient/{query.patient}"
    if query.practitioner is not None and kind != "Practitioner":
        if kind not in PRACTITIONER_SEARCH or not FHIR_ID.fullmatch(query.practitioner):
            return None
        params["practitioner"] = f"Practitioner/{query.practitioner}"
    if query.npi is not None:
        if kind != "Practitioner" or not TOKEN_VALUE.fullmatch(query.npi):
            return None
        params["identifier"] = f"{NPI_SYSTEM}|{query.npi}"
    if query.start is not None or query.end is not None:
        if kind not in SEARCH_DATE:
            return None
        params[SEARCH_DATE[kind]] = ([f"ge{_instant(query.start)}"] if query.start else []) + \
            ([f"lt{_instant(query.end)}"] if query.end else [])
    return params


def offers_patient_everything(statement) -> bool:
    """Whether a CapabilityStatement offers Patient `$everything`: an operation named `everything`
    on Patient (or defined by the standard Patient-everything OperationDefinition)."""
    if not isinstance(statement, dict) or statement.get("resourceType") != "CapabilityStatement":
        return False

    def everything(operation) -> bool:
        return isinstance(operation, dict) and (operation.get("name") in ("everything", "$everything") or str(
            operation.get("definition") or "").endswith("/OperationDefinition/Patient-everything"))

    for rest in statement.get("rest") or ():
        if not isinstance(rest, dict) or rest.get("mode", "server") != "server":
            continue
        for resource in rest.get("resource") or ():
            if isinstance(resource, dict) and resource.get("type") == "Patient" and any(
                    map(everything, resource.get("operation") or ())):
                return True
    return False


def appointment_of(resource: dict, patients: dict) -> Appointment | None:
    """Our Appointment for a FHIR Appointment (None when it is not listed or names no patient)."""
    if resource.get("status") not in LISTED_STATUSES or not resource.get("start"):
        return None
    reference = next((p["actor"]["reference"] for p in resource.get("participant") or ()
                      if str((p.get("actor") or {}).get("reference", "")).startswith("Patient/")), None)
    patient = patients.get(reference)
    if patient is None:
        return None
    if not patient.get("birthDate"):
        log.warning("Patient %s has no birthDate: appointment %s is not listed", patient.get("id"), resource.get("id"))
        return None
    location = next(((p.get("actor") or {}).get("display", "") for p in resource.get("participant") or ()
                     if str((p.get("actor") or {}).get("reference", "")).startswith("Location/")), "")
    start = _datetime(resource["start"])
    return Appointment(id=resource["id"], start=start, end=_datetime(resource.get("end") or resource["start"]),
                       status=resource["status"], appointment_type=text_of(resource.get("appointmentType")),
                       reason=text_of((resource.get("reasonCode") or [None])[0]) or resource.get("description", ""),
                       location=location or "", patient=patient_of(patient))


def patient_of(resource: dict) -> Patient:
    name = next(iter(resource.get("name") or ()), {})
    birth = resource.get("birthDate") or ""
    return Patient(id=resource["id"], first_name=" ".join(name.get("given") or ()), last_name=name.get("family", ""),
                   date_of_birth=dt.date.fromisoformat(birth) if len(birth) == 10 else None,
                   sex=resource.get("gender", "unknown"))


def _instant(moment: dt.datetime) -> str:
    return moment.replace(microsecond=0).isoformat() + "Z"


def _datetime(text: str) -> dt.datetime:
    """A FHIR instant as naive UTC."""
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value.astimezone(dt.timezone.utc).replace(tzinfo=None) if value.tzinfo else value


def _json(data: bytes):
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None


def _retry_after(value: str | None, default: float) -> float:
    try:
        return max(0.0, float(value)) if value is not None else default
    except ValueError:
        return default


def _issue_code(body) -> str | None:
    if isinstance(body, dict) and body.get("resourceType") == "OperationOutcome":
        return next((issue.get("code") for issue in body.get("issue") or ()), None)
    return None


def _issue_text(body) -> str:
    if isinstance(body, dict) and body.get("resourceType") == "OperationOutcome":
        issue = next(iter(body.get("issue") or ()), {})
        return (issue.get("details") or {}).get("text") or issue.get("diagnostics") or issue.get("code") or "no details"
    return "no details"


def connect(runtime, organization) -> FhirConnector:
    if not organization.ehr_url:
        raise ConnectorError(f"Organization {organization.id} is on FHIR but has no FHIR base URL "
                             f"(svc-auth orgs update --org {organization.id} --fhir-base-url URL).")
    if organization.fhir_auth != "none" and not organization.fhir_client_id:
        raise ConnectorError(f"Organization {organization.id} has no FHIR client id "
                             f"(svc-auth orgs update --org {organization.id} --fhir-client-id ID).")
    client = FhirClient(organization.ehr_url, organization.fhir_client_id, organization.fhir_auth,
                        runtime.ehr_keys, runtime.ehr_tokens, runtime.ehr_capabilities)
    return FhirConnector(organization, client)
