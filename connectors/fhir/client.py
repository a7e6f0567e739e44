"""HTTP to one FHIR base: the SMART Backend Services token, JSON reads with retries, paging and the
CapabilityStatement verdict. Knows transport and authentication, not what is searched."""
from __future__ import annotations

import json
import logging
import re
import time
import uuid
from urllib.parse import unquote, urlencode, urlsplit

import urllib3
from jose import jwt

from connectors.base import ConnectorError, ConnectorUnavailable
from connectors.fhir.cache import ExpiringCache
from connectors.fhir.capability import offers_patient_everything

SCOPES = ("system/Practitioner.rs", "system/Appointment.rs", "system/Patient.rs", "system/Encounter.rs",
          "system/Condition.rs", "system/Observation.rs", "system/MedicationRequest.rs",
          "system/AllergyIntolerance.rs", "system/DocumentReference.rs")
ASSERTION_SECONDS = 300          # a client assertion's lifetime (SMART: at most 5 minutes)
CAPABILITIES_SECONDS = 3600      # how long an EHR's CapabilityStatement verdict is cached
ATTEMPTS = 4                     # per request, for 429, 5xx, timeouts and refused connections
BACKOFF_SECONDS = 0.5            # doubled per attempt, unless the EHR says Retry-After
MAX_RETRY_AFTER_SECONDS = 30.0   # a longer Retry-After ends the attempts: the task retries later
TIMEOUT = urllib3.Timeout(connect=5.0, read=30.0)
PERMANENT_ISSUES = ("login", "forbidden", "security")
ERROR_EXCERPT_CHARS = 300        # how much of an EHR's error body a message keeps

log = logging.getLogger("svc_auth.connectors.fhir")


class AccessRefused(ConnectorError):
    """The EHR refused svc-auth's access (401/403, an OperationOutcome login/forbidden/security)."""


class RequestRefused(ConnectorError):
    """The EHR answered a request with a status that is neither success nor worth retrying (400,
    405, 422...): permanent for that request."""


class FhirClient:
    """HTTP to one FHIR base: discovery, the backend-services token, JSON reads with retries."""

    def __init__(self, base_url: str, client_id: str, auth: str, keys, tokens: ExpiringCache,
                 capabilities: ExpiringCache, http: urllib3.PoolManager | None = None, sleep=time.sleep,
                 scopes=None):
        """`scopes(smart_configuration) -> scopes to ask`: the profile's and discovery's choice
        (`connectors.fhir.profiles`); by default `SCOPES`."""
        self.base = base_url.rstrip("/")
        self.client_id, self.auth, self.keys, self.tokens = client_id, auth, keys, tokens
        self.capabilities = capabilities
        self.http = http or urllib3.PoolManager(timeout=TIMEOUT, retries=False)
        self.sleep = sleep
        self._token_endpoint: str | None = None
        self._scopes_for = scopes or (lambda configuration: SCOPES)
        self.scopes: tuple[str, ...] = SCOPES  # what the last grant asked for
        self.recorder = None  # the disclosure audit's (connectors.connector_for): one call per FHIR read

    # -- SMART Backend Services -------------------------------------------------------------
    def smart_configuration(self) -> dict:
        status, body, _ = self._send("GET", f"{self.base}/.well-known/smart-configuration")
        if status != 200 or not isinstance(body, dict) or not body.get("token_endpoint"):
            raise ConnectorError(f"The EHR at {self.base} publishes no SMART configuration "
                                 f"(.well-known/smart-configuration answered {status}); check the FHIR base URL.")
        return body

    def token_endpoint(self) -> str:
        if self._token_endpoint is None:
            configuration = self.smart_configuration()
            self.scopes = tuple(self._scopes_for(configuration))
            self._token_endpoint = configuration["token_endpoint"]
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
        form = urlencode({"grant_type": "client_credentials", "scope": " ".join(self.scopes),
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
        try:
            body = self._get(url)
        except (ConnectorError, LookupError):
            self._record("failure", url, None)
            raise
        self._record("success", url, body)
        return body

    def _record(self, outcome: str, url: str, body) -> None:
        """One `ehr.fetch` disclosure record per read, through the recorder given to the connector:
        the patients of what it returned, or (a failure) those its URL asked for."""
        parts = urlsplit(url)
        path = parts.path[len(urlsplit(self.base).path):].strip("/")
        if self.recorder is None or path == "metadata":  # the CapabilityStatement is no patient data
            return
        if isinstance(body, dict) and body.get("resourceType") == "Bundle":
            resources = [entry.get("resource") or {} for entry in body.get("entry") or ()]
        else:
            resources = [body] if isinstance(body, dict) else []
        if body is None:
            patients = [m[1] for m in _PATIENT_REFERENCE.finditer(unquote(url))]
        else:
            patients = [p for resource in resources for p in patients_in(resource)]
        self.recorder(outcome, path.split("/")[0], [r.get("id") for r in resources], patients, parts.query)

    def _get(self, url: str) -> dict:
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
                                 f"client registration and its scopes ({' '.join(self.scopes)}).")
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


_PATIENT_REFERENCE = re.compile(r"(?:^|/)Patient/([A-Za-z0-9\-.]{1,64})")


def patients_in(resource: dict) -> list[str]:
    """The patients whose compartment `resource` is in: a Patient's id, or the `Patient/{id}` its
    subject, patient or participants reference (absolute or relative, versioned or not)."""
    if resource.get("resourceType") == "Patient":
        return [resource["id"]] if isinstance(resource.get("id"), str) else []
    refs = [(resource.get("subject") or {}).get("reference"), (resource.get("patient") or {}).get("reference")]
    refs += [(p.get("actor") or {}).get("reference") for p in resource.get("participant") or () if isinstance(p, dict)]
    return [m[1] for m in (_PATIENT_REFERENCE.search(r) for r in refs if isinstance(r, str)) if m]


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
    """What the EHR said: an OperationOutcome's first issue, else a bounded, printable excerpt of
    any other JSON body (e.g. `{"error": ...}`), else "no details"."""
    if isinstance(body, dict) and body.get("resourceType") == "OperationOutcome":
        issue = next(iter(body.get("issue") or ()), {})
        issue = issue if isinstance(issue, dict) else {}
        text = (issue.get("details") or {}).get("text") if isinstance(issue.get("details"), dict) else None
        return _excerpt(text or issue.get("diagnostics") or issue.get("code") or "no details")
    if body is None:
        return "no details"
    return _excerpt(json.dumps(body, ensure_ascii=True))


def _excerpt(text, limit: int = ERROR_EXCERPT_CHARS) -> str:
    """`text` as one printable ASCII line of at most `limit` characters."""
    flat = " ".join("".join(c if c.isprintable() and ord(c) < 128 else " " for c in str(text)).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."
