"""The client side of an EHR's own Bulk Data export (HL7 FHIR Bulk Data Access IG 2.0.0,
https://hl7.org/fhir/uv/bulkdata/export.html): kick-off, status, manifest, files, DELETE, with
svc-auth's SMART Backend Services token, every request through the connector's `Transport` and
its `Bounds`.

- Kick-off: `POST {base}/Patient/$export` with `Accept: application/fhir+json`,
  `Prefer: respond-async` and a `Parameters` body (`_type`, `_since`, `patient` references); a 202
  names the status URL in `Content-Location`.
- Status: `GET` the status URL: 202 (in progress; `Retry-After` honoured, at most the bounds'
  `max_retry_after` a poll), 200 and the manifest, or an error.
- The status URL and the files: only URLs on the EHR's own origin (scheme, host and port of its
  FHIR base, not necessarily under its path: SMART's reference server answers `/fhir/bulkstatus/..`
  for a base `/{settings}/fhir`) are followed, so svc-auth's token never goes to another host and
  the EHR cannot point the worker at another one (SSRF); each file is streamed a line at a time
  (`Transport.lines`).
- DELETE of the status URL: the EHR's job and files are removed (best effort).
Anything else (a refusal, an error status or manifest, a URL elsewhere) is `EhrExportFailed`.
"""
from __future__ import annotations

import json
import logging
from urllib.parse import urljoin, urlsplit

from connectors.base import ConnectorError
from connectors.fhir.client import issue_text
from connectors.fhir.transport import same_origin

log = logging.getLogger("svc_auth.connectors.fhir")
DEFAULT_POLL_SECONDS = 2.0   # a 202 without Retry-After: poll again after this


class EhrExportFailed(ConnectorError):
    """The EHR's own export cannot be used for this job (refused, failed, or went somewhere svc-auth does not follow)."""


class EhrBulkExport:
    """One EHR's Bulk Data export endpoints, through a `connectors.fhir.client.FhirClient`."""

    def __init__(self, client):
        self.client = client
        self.transport = client.transport

    def _headers(self, accept: str = "application/fhir+json", **extra) -> dict:
        headers = {"Accept": accept, **extra}
        token = self.client.access_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def kick_off(self, types, since: str | None, patients) -> str:
        """Start `Patient/$export` of `types` for `patients` (changes since `since`); its status URL."""
        parameters = [{"name": "_type", "valueString": ",".join(types)},
                      {"name": "_outputFormat", "valueString": "application/fhir+ndjson"}]
        if since:
            parameters.append({"name": "_since", "valueInstant": since})
        parameters += [{"name": "patient", "valueReference": {"reference": f"Patient/{p}"}} for p in patients]
        body = json.dumps({"resourceType": "Parameters", "parameter": parameters}).encode()
        url = self.transport.confine(f"{self.client.base}/Patient/$export")
        status, answer, headers = self.transport.send("POST", url, body, self._headers(
            Prefer="respond-async", **{"Content-Type": "application/fhir+json"}))
        if status != 202:
            raise EhrExportFailed(f"The EHR refused its Patient/$export (HTTP {status}: {issue_text(answer)}).")
        location = headers.get("Content-Location") or ""
        location = urljoin(url, location) if location else ""
        if not location or not same_origin(location, self.client.base):
            raise EhrExportFailed(f"The EHR's export status URL {location[:200]!r} is not on its own origin "
                                  f"({_origin(self.client.base)}).")
        return location

    def _on_origin(self, url: str) -> str:
        if not same_origin(url, self.client.base):
            raise EhrExportFailed(f"Not following {url[:200]!r}: not on the EHR's origin ({_origin(self.client.base)}).")
        return url

    def poll(self, status_url: str):
        """("running", seconds to wait) or ("complete", manifest); `EhrExportFailed` otherwise
        (`LookupError` when the EHR no longer knows the job: 404/410)."""
        self._on_origin(status_url)
        status, answer, headers = self.transport.send("GET", status_url, None, self._headers("application/json"))
        if status == 202:
            wait = _seconds(headers.get("Retry-After"))
            return "running", min(max(wait, 0.0), self.transport.bounds.max_retry_after)
        if status in (404, 410):
            raise LookupError(f"The EHR no longer knows its export {status_url[:200]}.")
        if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("output"), list):
            raise EhrExportFailed(f"The EHR's export failed (HTTP {status}: {issue_text(answer)}).")
        if answer.get("error"):
            raise EhrExportFailed(f"The EHR's export manifest lists {len(answer['error'])} error file(s): "
                                  f"some resources were not exported.")
        return "complete", answer

    def files(self, manifest: dict, resource_type: str) -> list[str]:
        """The URLs of the manifest's files of `resource_type`, each on the EHR's own origin."""
        urls = []
        for output in manifest.get("output") or ():
            if not isinstance(output, dict) or output.get("type") != resource_type:
                continue
            url = output.get("url")
            if not isinstance(url, str) or not same_origin(url, self.client.base):
                raise EhrExportFailed(f"The EHR's export lists a file outside its own origin ({str(url)[:200]!r}); "
                                      f"svc-auth follows only {_origin(self.client.base)}.")
            urls.append(url)
        return urls

    def lines(self, url: str, with_token: bool, deadline: float):
        """The lines of one file (bytes), streamed; the token sent only when the manifest requires it."""
        self._on_origin(url)
        headers = self._headers("application/fhir+ndjson") if with_token else {"Accept": "application/fhir+ndjson"}
        return self.transport.lines(url, headers, deadline)

    def delete(self, status_url: str) -> None:
        """DELETE the EHR's job (its files go with it); a failure is logged, never raised."""
        try:
            self._on_origin(status_url)
            status, _, _ = self.transport.send("DELETE", status_url, None, self._headers("application/json"))
            if status not in (200, 202, 204, 404, 410):
                log.warning("the EHR at %s answered HTTP %s to the DELETE of its export", self.client.base, status)
        except (ConnectorError, LookupError) as exc:
            log.warning("the EHR at %s: its export could not be deleted (%s)", self.client.base, exc)


def _origin(base: str) -> str:
    parts = urlsplit(base)
    return f"{parts.scheme}://{parts.netloc}"


def _seconds(value) -> float:
    try:
        return float(str(value).strip())
    except (TypeError, ValueError):
        return DEFAULT_POLL_SECONDS
