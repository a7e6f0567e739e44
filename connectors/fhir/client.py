"""HTTP to one FHIR base: the SMART Backend Services token, JSON reads, paging and the
CapabilityStatement verdict. Knows authentication, not what is searched; every request goes through
`connectors.fhir.transport` under the caller's `Bounds` (retries, deadlines, sizes, the base)."""
from __future__ import annotations

import json
import logging
import time
import uuid
from urllib.parse import parse_qs, urlencode, urlsplit

from jose import jwt

from connectors.base import (
    BoundExceeded,
    ConnectorError,
    ConnectorUnavailable,
    DeadlineExceeded,
    EhrReportedError,
    TypeNotGranted,
)
from connectors.bounds import Bounds
from connectors.compartment import asked_patients, patients_of
from connectors.fhir.cache import ExpiringCache
from connectors.fhir.capability import offers_patient_everything
from connectors.fhir.connections import Connections
from connectors.fhir.grants import granted_types, requested_scopes
from connectors.fhir.transport import Transport
from models.fhir_grammar import is_resource_type

SCOPES = requested_scopes("v2")
"""What svc-auth asks by default: a `system/{Type}.rs` for every type it serves (`connectors.fhir.grants`)."""
ASSERTION_SECONDS = 300          # a client assertion's lifetime (SMART: at most 5 minutes)
CAPABILITIES_SECONDS = 3600      # how long an EHR's CapabilityStatement verdict is cached
PERMANENT_ISSUES = ("login", "forbidden", "security")
FAILED_SEVERITIES = ("error", "fatal")
ERROR_EXCERPT_CHARS = 300        # how much of an EHR's error text `ehr check` shows (`ehr_said`)
ISSUE_TYPES = frozenset((
    "invalid", "structure", "required", "value", "invariant", "security", "login", "unknown", "expired",
    "forbidden", "suppressed", "processing", "not-supported", "duplicate", "multiple-matches", "not-found",
    "deleted", "too-long", "code-invalid", "extension", "too-costly", "business-rule", "conflict", "transient",
    "lock-error", "no-store", "exception", "timeout", "incomplete", "throttled", "informational"))
"""R4's IssueType codes: the only words of an EHR's OperationOutcome a message repeats."""
ISSUE_SEVERITIES = ("fatal", "error", "warning", "information")

log = logging.getLogger("svc_auth.connectors.fhir")


class AccessRefused(ConnectorError):
    """The EHR refused svc-auth's access (401/403, an OperationOutcome login/forbidden/security);
    `status`: the HTTP status of that answer (None: no request made), `detail`: what the EHR said."""

    def __init__(self, message: str, status: int | None = None, detail: str = ""):
        super().__init__(message)
        self.status, self.detail = status, detail


class NotGranted(AccessRefused, TypeNotGranted):
    """The clinic's EHR has not granted svc-auth a scope for this type (the token response's
    `scope`): no request is made; the FHIR API answers 403 `forbidden`."""

    def __init__(self, resource_type: str):
        super().__init__(f"The clinic's EHR has not granted svc-auth access to {resource_type} "
                         f"(no system/{resource_type} scope in svc-auth's token).")
        self.resource_type = resource_type


class RequestRefused(ConnectorError):
    """The EHR answered a request with a status that is neither success nor worth retrying (400,
    405, 422...): permanent for that request."""


class FhirClient:
    """HTTP to one FHIR base: discovery, the backend-services token, JSON reads with retries."""

    def __init__(self, base_url: str, client_id: str, auth: str, keys, tokens: ExpiringCache,
                 capabilities: ExpiringCache, bounds: Bounds, http: Connections | None = None,
                 sleep=time.sleep, scopes=None, configurations: ExpiringCache | None = None, watchdog=None,
                 clock=time.time, aio=None):
        """`bounds`: the caller's (`connectors.bounds`); `scopes(smart_configuration) -> scopes to
        ask`: the profile's and discovery's choice (`connectors.fhir.profiles`); by default `SCOPES`.
        `clock`: the runtime's wall clock (`runtime.clock.time`), for an HTTP-date `Retry-After`."""
        self.base = base_url.rstrip("/")
        self._base_path = urlsplit(self.base).path
        self.client_id, self.auth, self.keys, self.tokens = client_id, auth, keys, tokens
        self.capabilities = capabilities
        self.bounds = bounds
        self.transport = Transport(self.base, bounds, http=http, sleep=sleep, watchdog=watchdog, wall=clock, aio=aio)
        self.configurations = configurations if configurations is not None else ExpiringCache(clock)
        self._token_endpoint: str | None = None
        self._scopes_for = scopes or (lambda configuration: SCOPES)
        self.scopes: tuple[str, ...] = SCOPES  # what the last grant asked for
        self.granted: frozenset[str] | None = None  # the types the current token grants (None: not asked yet)
        self.recorder = None  # the disclosure audit's (connectors.connector_for): one call per FHIR read

    # -- SMART Backend Services -------------------------------------------------------------
    def smart_configuration(self) -> dict:
        status, body, _ = self._send("GET", f"{self.base}/.well-known/smart-configuration")
        if status != 200 or not isinstance(body, dict) or not body.get("token_endpoint"):
            raise ConnectorError(f"The EHR at {self.base} publishes no SMART configuration "
                                 f"(.well-known/smart-configuration answered {status}); check the FHIR base URL.")
        return body

    def discover(self) -> dict:
        """The SMART configuration, fetched anew (and remembered for the process, an hour)."""
        configuration = self.smart_configuration()
        self.configurations.put(self.base, configuration, CAPABILITIES_SECONDS)
        return configuration

    def token_endpoint(self, fresh: bool = False) -> str:
        if self._token_endpoint is None or fresh:
            configuration = None if fresh else self.configurations.get(self.base)
            if configuration is None:
                configuration = self.discover()
            self.scopes = tuple(self._scopes_for(configuration))
            self._token_endpoint = configuration["token_endpoint"]
        return self._token_endpoint

    def access_token(self) -> str | None:
        """A bearer token for this EHR (None for an open server), from the cache or a new grant."""
        if self.auth == "none":
            return None
        endpoint = self.token_endpoint()
        key = (endpoint, self.client_id)
        cached = self.tokens.get(key)
        if cached:
            token, self.granted = cached
            return token
        # The newest key signs. During a key rotation's overlap (`ehr rotate-key`) an EHR whose cached
        # copy of svc-auth's JWKS predates the new key refuses it (invalid_client): the previous key,
        # still published, is tried then, until the EHR fetches the JWKS again.
        signing = self.keys.signing_keys()
        for attempt, (kid, pem) in enumerate(signing):
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
            refused_client = status in (400, 401) and isinstance(body, dict) and body.get("error") == "invalid_client"
            if not refused_client or attempt == len(signing) - 1:
                break
            log.info("the EHR at %s refused svc-auth's newest EHR client key %s; trying the previous one, still "
                     "published (the EHR's copy of /ehr/jwks.json predates the rotation)", self.base, kid)
        if status != 200 or not isinstance(body, dict) or not body.get("access_token"):
            error = body.get("error") if isinstance(body, dict) else None
            raise ConnectorError(
                f"The EHR's token endpoint refused svc-auth ({error or f'HTTP {status}'}): check that svc-auth is "
                f"registered there with client id {self.client_id!r} and its JWKS URL (/ehr/jwks.json), and that "
                f"the registration is active.")
        self.granted = granted_types(body, self.scopes)
        if isinstance(body.get("scope"), str) and set(body["scope"].split()) != set(self.scopes):
            log.info("the EHR at %s granted svc-auth %d of the %d types asked", self.base, len(self.granted),
                     len(self.scopes))
        self.tokens.put(key, (body["access_token"], self.granted), float(body.get("expires_in") or 300))
        return body["access_token"]

    def grants(self, resource_type: str) -> bool:
        """Whether svc-auth's token at this EHR reaches `resource_type` (always, on an open server);
        asks for a token when there is none yet."""
        if self.auth == "none":
            return True
        self.access_token()
        return self.granted is None or resource_type in self.granted

    def granted_types(self) -> frozenset[str] | None:
        """The types svc-auth's token grants (a token asked for first), None on an open server."""
        if self.auth == "none":
            return None
        self.access_token()
        return self.granted

    # -- FHIR reads ---------------------------------------------------------------------------
    def url(self, path_or_url: str, params: dict | None = None) -> str:
        """The absolute URL of a path (or an absolute URL) with `params` (not yet confined to the base)."""
        url = path_or_url if "://" in path_or_url else f"{self.base}/{path_or_url}"
        if params:
            url += ("&" if "?" in url else "?") + urlencode(params, doseq=True)
        return url

    def type_of(self, url: str) -> str:
        """The first path segment of `url` under the base (a resource type, `metadata`...)."""
        return urlsplit(url).path[len(self._base_path):].strip("/").split("/")[0]

    def get(self, path_or_url: str, params: dict | None = None) -> dict:
        """GET a FHIR JSON resource (a relative path or an absolute `next` link of this server; a URL
        outside the base is refused before any request). An OperationOutcome of severity error or
        fatal, whatever the status, is `EhrReportedError`."""
        url = self.url(path_or_url, params)
        self.transport.confine(url)
        return self._recorded(url, lambda: self._get(url))

    def get_later(self, path_or_url: str):
        """`get` with its exchange left to the running IOLoop (`Transport.send_async`): prepared
        here, blocking (the URL confined, the token; `NotGranted` raised) -> `fetched(offload)`, a
        coroutine function giving what `get` gives. `offload(fn)` awaits blocking work elsewhere: a
        token renewed after a 401 (then that one request is sent from there, as `get` sends it)."""
        url = self.url(path_or_url)
        self.transport.confine(url)
        headers, token = self._headers(self._kind(url))

        async def fetched(offload):
            try:
                status, body, _ = await self.transport.send_async("GET", url, headers=headers)
            except ConnectorError:
                self._record("failure", url, None)
                raise
            if status == 401 and token:
                self._renew()
                return await offload(lambda: self._recorded(url, lambda: self._get(url, renewed=True)))
            return self._recorded(url, lambda: self._answer(url, status, body))
        return fetched

    def _recorded(self, url: str, fetch) -> dict:
        """`fetch()`, its outcome recorded (`_record`): a request refused before it was made, none."""
        try:
            body = fetch()
        except NotGranted:
            raise  # no request was made: nothing disclosed
        except (ConnectorError, LookupError):
            self._record("failure", url, None)
            raise
        self._record("success", url, body)
        return body

    def _record(self, outcome: str, url: str, body) -> None:
        """One `ehr.fetch` disclosure record per read, through the recorder given to the connector:
        the patients of what it returned, or (a failure) those its URL asked for."""
        if self.recorder is None:
            return
        parts = urlsplit(url)
        path = parts.path[len(self._base_path):].strip("/")
        if path == "metadata":  # the CapabilityStatement is no patient data
            return
        if isinstance(body, dict) and body.get("resourceType") == "Bundle":
            entries = body.get("entry") if isinstance(body.get("entry"), list) else []
            resources = [e["resource"] for e in entries if isinstance(e, dict) and isinstance(e.get("resource"), dict)]
        else:
            resources = [body] if isinstance(body, dict) else []
        if body is None:
            patients = asked(path, parts.query)
        else:
            patients = [p for resource in resources for p in patients_of(resource, self.base)]
        self.recorder(outcome, path.split("/")[0], [r.get("id") for r in resources], patients, parts.query)

    def _get(self, url: str, renewed: bool = False) -> dict:
        """One GET and its answer (`_answer`); on a 401, once more with a new token (`renewed`: it is one)."""
        kind = self._kind(url)
        while True:
            headers, token = self._headers(kind)
            status, body, _ = self._send("GET", url, headers=headers)
            if status == 401 and token and not renewed:
                self._renew()
                renewed = True
                continue
            return self._answer(url, status, body)

    def _kind(self, url: str) -> str | None:
        kind = self.type_of(url)
        return kind if is_resource_type(kind) else None

    def _headers(self, kind: str | None) -> tuple[dict, str | None]:
        """(a GET's headers, its token): `NotGranted` when the token (maybe just asked for) lacks `kind`'s scope."""
        headers = {"Accept": "application/fhir+json"}
        token = self.access_token()
        if kind and token and self.granted is not None and kind not in self.granted:
            raise NotGranted(kind)  # never asked of the EHR: the token (maybe just renewed) lacks its scope
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers, token

    def _renew(self) -> None:
        """The EHR refused the token (expired or revoked): the next request asks for a new one."""
        self.tokens.drop((self.token_endpoint(), self.client_id))

    def _answer(self, url: str, status: int, body) -> dict:
        """A GET's answer as data, or the error it is (in svc-auth's words, `issue_text`; what the
        EHR wrote is only the error's `ehr_said`)."""
        what = issue_text(body)
        if status in (401, 403) or _issue_code(body) in PERMANENT_ISSUES:
            raise _saying(AccessRefused(f"The EHR refused svc-auth's access (HTTP {status}: {what}); check the "
                                        f"client registration and its scopes ({' '.join(self.scopes)}).",
                                        status=status, detail=what), body)
        if status in (404, 410):  # unknown, or deleted
            raise _saying(LookupError(f"HTTP {status}: {what}"), body)
        if status != 200 or not isinstance(body, dict):
            raise _saying(RequestRefused(f"The EHR answered HTTP {status} to {urlsplit(url).path}: {what}"), body)
        if body.get("resourceType") == "OperationOutcome" and _failed(body):
            raise _saying(EhrReportedError(f"The EHR answered an error to {urlsplit(url).path}: {what}"), body)
        return body

    def search(self, resource_type: str, params: dict) -> dict:
        """A search's first page, a Bundle checked as `pages` checks each (no `next` followed)."""
        bundle = self._search_page(resource_type, self.url(resource_type, params))
        _searchset(bundle, resource_type)
        return bundle

    def _search_page(self, resource_type: str, url: str) -> dict:
        """`get` of a search's page. A 404 or 410 there says the EHR serves no such search (or
        forgot the page), not that a resource is missing: `RequestRefused` (502 in the FHIR API,
        a failed export), never a `LookupError` that callers of a search do not expect."""
        try:
            return self.get(url)
        except LookupError as exc:
            raise RequestRefused(f"The EHR answered a search of {resource_type} at {urlsplit(url).path} with "
                                 f"{exc}") from None

    def pages(self, resource_type: str, params: dict):
        """A search's Bundles, one page at a time, along their `next` links: at most the bounds'
        `max_pages`, each `next` inside the base and never one already followed. A page that is not
        a Bundle, or that carries an `outcome` entry of severity error or fatal, is `EhrReportedError`."""
        for _, bundle, _ in self.linked_pages(resource_type, self.url(resource_type, params)):
            yield bundle

    def linked_pages(self, resource_type: str, url: str):
        """`pages` from the page at `url` (the search's first, or a `next` link the EHR sent earlier):
        (that page's URL, its Bundle, its `next` link or None), a page at a time."""
        bundle, seen = self._search_page(resource_type, url), {url}
        for number in range(1, self.bounds.max_pages + 1):
            _searchset(bundle, resource_type)
            following = next((link.get("url") for link in bundle.get("link") or ()
                              if isinstance(link, dict) and link.get("relation") == "next"), None)
            following = following if isinstance(following, str) and following else None
            yield url, bundle, following
            if not following:
                return
            if number == self.bounds.max_pages:
                raise BoundExceeded("max_pages", f"A search of {resource_type} at {self.base} went past the "
                                                 f"{self.bounds.name} limit of {self.bounds.max_pages} pages.")
            if not isinstance(following, str) or following in seen:
                raise BoundExceeded("repeated_next", f"The EHR at {self.base} sent the same next link twice in a "
                                                     f"search of {resource_type}; not followed.")
            seen.add(following)
            url, bundle = following, self._search_page(resource_type, following)

    def offers_everything(self) -> bool:
        """Whether the EHR's CapabilityStatement offers `Patient/{id}/$everything` (cached per base)."""
        offered = self.capabilities.get(self.base)
        if offered is None:
            try:
                offered = offers_patient_everything(self.get("metadata"))
            except (ConnectorUnavailable, DeadlineExceeded):
                raise
            except (ConnectorError, LookupError) as exc:
                log.warning("the EHR at %s serves no CapabilityStatement (%s): charts use searches", self.base, exc)
                offered = False
            self.capabilities.put(self.base, offered, CAPABILITIES_SECONDS)
        return offered

    def _send(self, method: str, url: str, body: bytes | None = None, headers: dict | None = None):
        """(status, parsed JSON or None, headers): `Transport.send`, under the bounds (retries included)."""
        return self.transport.send(method, url, body=body, headers=headers)


def asked(path: str, query: str) -> list[str]:
    """The patients a request to the EHR asked for (its failure's record): a Patient's id in the
    path (`Patient/{id}`, `Patient/{id}/$everything`), and the search's compartment parameters
    (`connectors.compartment.asked_patients`: `patient=X`, `patient=Patient/X`, `subject=...`)."""
    segments = path.split("/")
    found = [segments[1]] if segments[0] == "Patient" and len(segments) > 1 and segments[1] else []
    args = parse_qs(query, keep_blank_values=False)
    return found + [p for p in asked_patients(segments[0], args) if p not in found]


def _failed(outcome: dict) -> bool:
    """Whether an OperationOutcome reports a failure (an issue of severity error or fatal)."""
    return any(i.get("severity") in FAILED_SEVERITIES for i in _issues(outcome))


def _searchset(bundle: dict, resource_type: str) -> None:
    """A search page must be a Bundle whose `entry` and `link` are lists when present (a number
    there failed every caller's loop with a TypeError), without a failed `outcome` entry (warnings
    and information entries are fine)."""
    if bundle.get("resourceType") != "Bundle":
        kind = bundle.get("resourceType") if is_resource_type(bundle.get("resourceType")) else "non-resource"
        raise EhrReportedError(f"The EHR answered a {kind} where a searchset of {resource_type} belongs.")
    for member in ("entry", "link"):
        if bundle.get(member) is not None and not isinstance(bundle[member], list):
            raise EhrReportedError(f"The EHR answered a searchset of {resource_type} whose {member} is "
                                   f"{_json_kind(bundle[member])}, not a list.")
    for entry in bundle.get("entry") or ():
        resource = entry.get("resource") if isinstance(entry, dict) else None
        if isinstance(resource, dict) and resource.get("resourceType") == "OperationOutcome" and _failed(resource):
            raise _saying(EhrReportedError(f"The EHR's search of {resource_type} reported an error: "
                                           f"{issue_text(resource)}"), resource)


def _json_kind(value) -> str:
    """What a parsed JSON value is, in JSON's words (`true` is a boolean, not an int)."""
    if isinstance(value, bool):
        return "a boolean"
    return {int: "a number", float: "a number", str: "a string", dict: "an object"}.get(type(value), "not JSON")


def _issue_code(body) -> str | None:
    if isinstance(body, dict) and body.get("resourceType") == "OperationOutcome":
        return next((issue.get("code") for issue in _issues(body)), None)
    return None


def issue_text(body) -> str:
    """What the EHR answered, in svc-auth's words: an OperationOutcome's first issue as its code
    and severity (R4's, `ISSUE_TYPES`; any other is "unlisted"), else the kind of body. Never the
    EHR's own words (`details.text`, `diagnostics`, a JSON error's message): an EHR may quote the
    request's search values there (a name, an identifier: patient data), and a connector's
    message reaches log lines, a chart request's error, a chart's `omitted`, an export's error."""
    if isinstance(body, dict) and body.get("resourceType") == "OperationOutcome":
        issue = next(iter(_issues(body)), None)
        if issue is None:
            return "an OperationOutcome without an issue"
        code = issue.get("code") if issue.get("code") in ISSUE_TYPES else "unlisted"
        severity = issue.get("severity") if issue.get("severity") in ISSUE_SEVERITIES else "unlisted"
        return f"OperationOutcome issue {code} ({severity})"
    if body is None:
        return "no JSON body"
    return f"{_json_kind(body)} that is no OperationOutcome"


def _said(body) -> str:
    """The EHR's own words in `body`, a bounded printable excerpt (`ehr_said`): an OperationOutcome's
    first issue's text or diagnostics, else any other JSON body (e.g. `{"error": ...}`)."""
    if isinstance(body, dict) and body.get("resourceType") == "OperationOutcome":
        issue = next(iter(_issues(body)), {})
        text = (issue.get("details") or {}).get("text") if isinstance(issue.get("details"), dict) else None
        return _excerpt(text or issue.get("diagnostics") or issue.get("code") or "no details")
    if body is None:
        return "no details"
    return _excerpt(json.dumps(body, ensure_ascii=True))


def _saying(exc: BaseException, body) -> BaseException:
    """`exc` carrying what the EHR wrote in `body` (`_said`) as `ehr_said`, apart from its message."""
    exc.ehr_said = _said(body)
    return exc


def _excerpt(text, limit: int = ERROR_EXCERPT_CHARS) -> str:
    """`text` as one printable ASCII line of at most `limit` characters."""
    flat = " ".join("".join(c if c.isprintable() and ord(c) < 128 else " " for c in str(text)).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def ehr_said(exc: BaseException | None) -> str | None:
    """What the EHR wrote in the answer that raised `exc` (or the error it was raised while handling,
    `raise ... from None` included), for `svc-auth ehr check` only: the operator's own diagnosis,
    printed on its stdout, never logged nor stored. None when the EHR wrote nothing known."""
    seen = 0
    while exc is not None and seen < 8:
        said = getattr(exc, "ehr_said", None)
        if said is not None:
            return said
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _issues(outcome: dict) -> list[dict]:
    issues = outcome.get("issue")
    return [i for i in issues if isinstance(i, dict)] if isinstance(issues, list) else []
