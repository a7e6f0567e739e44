"""An Epic clinic's schedule from Epic's `GetProviderAppointments` web service (CONTRACTS.md, "Epic
clinics' schedules"): Epic's FHIR R4 has no search of a practitioner's appointments (its
Appointment.Search requires `patient`), so a clinic with `--fhir-profile epic --epic-user-id ID`
reads each physician's appointments from this web service instead, with the same backend-services
token. Shapes as Ronin's production client shows them (research/epic_schedules.md, source E6).

- One `POST {Interconnect base}/api/epic/2013/Scheduling/Provider/GetProviderAppointments/
  Scheduling/Provider/Appointments` per physician, where the Interconnect base is the FHIR base
  without its trailing `/api/FHIR/R4`; body `{"UserID", "UserIDType", "StartDate", "EndDate"
  (MM/dd/yyyy, the clinic's local dates covering the window), "Providers": [{"ID", "IDType"}],
  "IncludeAllStatuses": "true"}`. The provider is the Practitioner's identifier whose `type.text`
  is `EXTERNAL` (or whose system is `epic_provider_id_system`), or the NPI.
- The answer `{"Error", "Appointments"}`: an HTTP status other than 200, or `Appointments` null,
  fails the clinic's night naming `Error` (the previous snapshot stays).
- Each appointment: its id is the `CSN` of `ContactIDs`; its start `Date` + `AppointmentStartTime`
  in the clinic's time zone, its end start + `AppointmentDuration` minutes; its status mapped to
  FHIR (`STATUSES`; any other is skipped and named); its patient the EHR's FHIR Patient (the
  `FHIR` entry of `PatientIDs`, else a search by `{epic_patient_id_system}|{Internal ID}`), whose
  name, birth date and sex are the snapshot's.
- A restricted patient (break-the-glass, confidential, VIP, a department the Epic user cannot see)
  whose `Patient/{id}` read Epic refuses (HTTP 403) while others read fine: that appointment is left
  out and counted (`RESTRICTED`). But when no Patient read succeeded all night and one was refused,
  the refusal is the token's or the Epic user's, not a patient's: `finish_night` fails the night
  naming it (never an all-skipped snapshot published as if fine).
- Every request to the EHR is one `ehr.fetch` disclosure record (the web service's names the
  FHIR Patients of its answer); all go through the connector's `Transport`, under its `Bounds`.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import re
from types import MappingProxyType
from urllib.parse import urlencode, urlsplit

from connectors.base import Appointment, ConnectorError, EhrReportedError
from connectors.fhir.client import AccessRefused, RequestRefused
from connectors.fhir.mapping import Unlisted, listed_patient
from models.ids import is_id
from models.npi import NPI_SYSTEM, is_npi
from models.timezones import local_to_utc, zone_named

FHIR_SUFFIX = "/api/FHIR/R4"
SERVICE_PATH = "/api/epic/2013/Scheduling/Provider/GetProviderAppointments/Scheduling/Provider/Appointments"
SERVICE = "GetProviderAppointments"
PROVIDER_ID_TYPES = ("External", "NPI")
DEFAULT_USER_ID_TYPE = "External"
STATUSES = MappingProxyType({
    "scheduled": "booked", "phoned patient": "booked", "arrived": "arrived", "present": "arrived",
    "proposed": "proposed", "completed": "fulfilled", "canceled": "cancelled", "hh incomplete": "cancelled",
    "hsp incomplete": "cancelled", "hh/hsp incomplete": "cancelled", "no show": "noshow",
    "left without seen": "noshow"})
"""Epic's `AppointmentStatus` (lower case) as a FHIR AppointmentStatus code (Ronin's map, E6)."""
LISTED = frozenset(("proposed", "pending", "booked", "arrived", "checked-in"))
MAX_DURATION_MINUTES = 7 * 24 * 60
KNOWN_PATIENTS = 5000            # Patients kept for one night (by Epic id), then forgotten
RESTRICTED = "patient restricted by Epic (Patient read refused, HTTP 403)"
"""The skipped reason of an appointment whose patient Epic refuses to show (break-the-glass)."""
REFUSED = object()               # `_read`'s answer for a Patient whose read Epic refused
USER_ID_TEXT = re.compile(r"[!-~](?:[ -~]{0,198}[!-~])?")   # printable ASCII, no edge spaces
USER_ID_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9 _-]{0,63}")
SYSTEM = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[!-~]{1,490}")
MINUTES = re.compile(r"[0-9]{1,6}")      # AppointmentDuration, ASCII digits (at most MAX_DURATION_MINUTES)

log = logging.getLogger("svc_auth.connectors.fhir")


def check_settings(user_id: str | None = None, user_id_type: str | None = None,
                   provider_id_type: str | None = None, provider_id_system: str | None = None,
                   patient_id_system: str | None = None) -> dict:
    """The given settings (None: not given) as stored columns; ValueError naming the flag otherwise."""
    found = {}
    if user_id is not None:
        user_id = user_id.strip()
        if user_id and not USER_ID_TEXT.fullmatch(user_id):
            raise ValueError("--epic-user-id must be 1-200 printable ASCII characters (the Epic user's id)")
        found["epic_user_id"] = user_id
    if user_id_type is not None:
        if not USER_ID_TYPE.fullmatch(user_id_type.strip()):
            raise ValueError("--epic-user-id-type must be an Epic id type such as External (letters, digits, "
                             "space, _ or -)")
        found["epic_user_id_type"] = user_id_type.strip()
    if provider_id_type is not None:
        if provider_id_type not in PROVIDER_ID_TYPES:
            raise ValueError(f"--epic-provider-id-type must be one of {', '.join(PROVIDER_ID_TYPES)}")
        found["epic_provider_id_type"] = provider_id_type
    for flag, column, value in (("--epic-provider-id-system", "epic_provider_id_system", provider_id_system),
                                ("--epic-patient-id-system", "epic_patient_id_system", patient_id_system)):
        if value is None:
            continue
        value = value.strip()
        if value and (not SYSTEM.fullmatch(value) or "|" in value or "," in value):
            raise ValueError(f"{flag} must be an identifier system URI (e.g. urn:oid:1.2.3 or https://...), "
                             f"without '|' or ','")
        found[column] = value
    return found


def no_schedule_search(label: str, organization_id: str) -> str:
    """Why a night without a FHIR schedule search failed (Epic without `--epic-user-id`), and both ways out."""
    return (f"{label} documents no FHIR R4 search of a practitioner's appointments; take the clinic's schedule "
            f"from Epic's GetProviderAppointments web service (svc-auth orgs update --org {organization_id} "
            f"--epic-user-id ID) or from its HL7v2 SIU feed (--schedule-source siu); see docs/ehr-fhir.md")


def interconnect_base(fhir_base: str) -> str:
    """The Interconnect base: the FHIR base without its trailing `/api/FHIR/R4` (any case);
    ValueError when it has none."""
    base = (fhir_base or "").rstrip("/")
    if not base.lower().endswith(FHIR_SUFFIX.lower()):
        raise ValueError(f"an Epic FHIR base URL ends in {FHIR_SUFFIX} (its Interconnect base before it), "
                         f"got {base[:200]!r}")
    return base[:-len(FHIR_SUFFIX)]


class EpicSchedule:
    """The web service for one clinic's night, over its FHIR connector's client (token, transport,
    bounds, disclosure recorder) and `skipped` counter."""

    def __init__(self, connector, organization):
        self.connector, self.client = connector, connector.client
        self.organization = organization
        self.zone = zone_named(getattr(organization, "time_zone", None))
        try:
            self.url, self.misconfigured = interconnect_base(self.client.base) + SERVICE_PATH, None
        except ValueError as exc:  # `orgs create|update` refuses this; a row edited by hand fails the night
            self.url, self.misconfigured = None, f"Organization {organization.id}: {exc}"
        self.patients: dict[str, dict | None] = {}   # "FHIR:{id}" / "Internal:{id}" -> Patient (None: not found)
        self.reads = 0                                # Patient reads that Epic answered this night
        self.refused: dict[str, str] = {}             # Patient id -> why Epic refused its read (first ones)
        self.refusals = 0                             # Patient reads that Epic refused this night

    def finish_night(self) -> None:
        """After the night's last physician: `AccessRefused` when Epic refused every Patient read it
        was asked (at least one), so the night fails naming the cause instead of publishing a
        snapshot whose patients were all left out."""
        failure = self.all_refused()
        if failure:
            raise AccessRefused(failure)

    def all_refused(self) -> str | None:
        """Why no appointment can be listed when every Patient read was refused (None otherwise)."""
        if self.reads or not self.refusals:
            return None
        first, why = next(iter(self.refused.items()))
        return (f"Epic refused every Patient read ({self.refusals}, none answered; e.g. Patient/{first}: {why}): "
                f"a restricted (break-the-glass) patient is left out, but when no patient can be read the "
                f"backend client {self.client.client_id!r} lacks Patient.Read (R4) or the Epic user "
                f"{self.organization.epic_user_id!r} may see no patient of these departments; nothing was published "
                f"for this clinic")

    # -- one physician ------------------------------------------------------------------------
    def fetch_appointments(self, provider, start: dt.datetime, end: dt.datetime):
        """The physician's listed appointments starting in [start, end) (naive UTC); none when
        `provider_id` finds no way to name them to Epic."""
        if self.misconfigured:
            raise ConnectorError(self.misconfigured)
        provider_id = self.provider_id(provider)
        if provider_id is None:
            return
        yield from self.appointments_of(provider, provider_id, start, end)

    def appointments_of(self, provider, provider_id: str, start: dt.datetime, end: dt.datetime):
        """`fetch_appointments` of the physician Epic knows as `provider_id`: one call to the web service."""
        if self.misconfigured:
            raise ConnectorError(self.misconfigured)
        first, last = self.local_dates(start, end)
        body = {"UserID": self.organization.epic_user_id,
                "UserIDType": self.organization.epic_user_id_type or DEFAULT_USER_ID_TYPE,
                "StartDate": first.strftime("%m/%d/%Y"), "EndDate": last.strftime("%m/%d/%Y"),
                "Providers": [{"ID": provider_id, "IDType": self.organization.epic_provider_id_type or "External"}],
                "IncludeAllStatuses": "true"}
        query = urlencode({"service": SERVICE, "StartDate": body["StartDate"], "EndDate": body["EndDate"],
                           "ProviderID": provider_id, "ProviderIDType": body["Providers"][0]["IDType"]})
        try:
            answer = self.call(body, provider)
        except (ConnectorError, LookupError):
            self.record("failure", [], [], query)
            raise
        found = []
        try:
            found = list(self.appointments(answer["Appointments"], start, end))
        finally:  # the FHIR Patients the answer is known to concern: those listed, and any it named by FHIR id
            named = [_id_of(item.get("PatientIDs"), "FHIR") for item in answer["Appointments"]
                     if isinstance(item, dict)]
            self.record("success", [a.id for a in found],
                        list(dict.fromkeys([a.patient.id for a in found] + [p for p in named if p])), query)
        yield from found

    def provider_id(self, provider) -> str | None:
        """How the request names the physician, once the EHR's Practitioner with that NPI is found
        (None, logged, when there is none: a physician unknown to the EHR has no appointments there):
        the NPI, or that Practitioner's `External` identifier (None, logged and counted, when it has none)."""
        if not is_npi(provider.npi):
            return None
        by_npi = self.connector.search({"identifier": f"{NPI_SYSTEM}|{provider.npi}"})
        bundle = self.client.search("Practitioner", by_npi)
        practitioners = [e["resource"] for e in bundle.get("entry") or () if isinstance(e, dict) and isinstance(
            e.get("resource"), dict) and e["resource"].get("resourceType") == "Practitioner"]
        if not practitioners:
            log.warning("no Practitioner with NPI %s in the EHR of %s: no appointments", provider.npi,
                        self.organization.id)
            return None
        if (self.organization.epic_provider_id_type or "External") == "NPI":
            return provider.npi
        system = self.organization.epic_provider_id_system
        for identifier in _identifiers(practitioners[0]):
            if not isinstance(identifier.get("value"), str):
                continue
            kind = identifier.get("type") if isinstance(identifier.get("type"), dict) else {}
            if (identifier.get("system") == system) if system else \
                    (str(kind.get("text") or "").strip().upper() == "EXTERNAL"):
                value = identifier["value"].strip()
                if value and USER_ID_TEXT.fullmatch(value):
                    return value
        what = self.wanted_provider_id()
        log.warning("Practitioner/%s (NPI %s) of %s has no %s: no appointments (see --epic-provider-id-system)",
                    practitioners[0].get("id"), provider.npi, self.organization.id, what)
        self.connector.skipped.add(f"physician without an Epic provider id ({what})", f"NPI {provider.npi}")
        return None

    def wanted_provider_id(self) -> str:
        """Which identifier of a Practitioner names the physician to Epic (`--epic-provider-id-type External`)."""
        system = self.organization.epic_provider_id_system
        return f"an identifier of system {system}" if system else "an identifier whose type.text is EXTERNAL"

    def local_dates(self, start: dt.datetime, end: dt.datetime) -> tuple[dt.date, dt.date]:
        """The clinic's local dates of the window's first and last instants."""
        def local(moment: dt.datetime) -> dt.date:
            return moment.replace(tzinfo=dt.timezone.utc).astimezone(self.zone).date()
        return local(start), local(max(start, end - dt.timedelta(microseconds=1)))

    def call(self, body: dict, provider) -> dict:
        """POST the request with the backend token (renewed once on a 401); the answer, or the
        failure naming Epic's `Error`."""
        data = json.dumps(body).encode()
        for renewed in (False, True):
            headers = {"Content-Type": "application/json", "Accept": "application/json"}
            token = self.client.access_token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            status, answer, _ = self.client.transport.send("POST", self.url, body=data, headers=headers)
            if status == 401 and token and not renewed:
                self.client.tokens.drop((self.client.token_endpoint(), self.client.client_id))
                continue
            break
        error = answer.get("Error") if isinstance(answer, dict) else None
        if isinstance(error, str) and error.strip():
            said = _excerpt(error)
        else:
            said = "no Error given" if isinstance(answer, dict) else "not a JSON object"
        where = f"Epic's {SERVICE} web service ({urlsplit(self.url).path}) for NPI {provider.npi}"
        if status in (401, 403):
            raise AccessRefused(f"{where} refused svc-auth's access (HTTP {status}; Error: {said}): check that the "
                                f"web service is added to client id {self.client.client_id!r} and that Epic user "
                                f"{self.organization.epic_user_id!r} may use it.")
        if status != 200:
            raise RequestRefused(f"{where} answered HTTP {status} (Error: {said}).")
        if not isinstance(answer, dict) or not isinstance(answer.get("Appointments"), list):
            raise EhrReportedError(f"{where} returned no Appointments (Error: {said}).")
        return answer

    def record(self, outcome: str, ids: list, patients: list, query: str) -> None:
        if self.client.recorder is not None:
            self.client.recorder(outcome, "Appointment", ids, patients, query)

    # -- its answer -----------------------------------------------------------------------------
    def appointments(self, items: list, start: dt.datetime, end: dt.datetime):
        """The answer's listed appointments starting in [start, end), each once; the others that
        should be listed and cannot be are counted in the connector's `skipped`, by reason."""
        seen = set()
        for item in items:
            csn = _id_of(item.get("ContactIDs") if isinstance(item, dict) else None, "CSN")
            try:
                if not isinstance(item, dict):
                    raise Unlisted("malformed appointment")
                raw = item.get("AppointmentStatus")
                status = STATUSES.get(" ".join(raw.split()).lower()) if isinstance(raw, str) else None
                if status is None:
                    raise Unlisted("unknown Epic status")
                if status not in LISTED or csn in seen:
                    continue
                if csn is None:
                    raise Unlisted("no CSN")
                begins = self.start_of(item)
                if not start <= begins < end:
                    continue
                minutes = _minutes(item.get("AppointmentDuration"))
                patient = self.patient_of(item.get("PatientIDs"))
                seen.add(csn)
            except Unlisted as exc:
                self.connector.skipped.add(str(exc), csn or None)
                continue
            yield Appointment(id=csn, start=begins, end=begins + dt.timedelta(minutes=minutes), status=status,
                              appointment_type=_text(item.get("VisitTypeName")), reason="",
                              location=_department(item.get("Providers")), patient=patient)

    def start_of(self, item: dict) -> dt.datetime:
        """`Date` (M/d/yyyy) + `AppointmentStartTime` (h:mm AM/PM), local to the clinic, as naive UTC
        (`Unlisted` when it is not one, or is past year 9999 or before year 1 in UTC)."""
        date, time = item.get("Date"), item.get("AppointmentStartTime")
        if not isinstance(date, str) or not isinstance(time, str):
            raise Unlisted("unparseable start")
        try:
            local = dt.datetime.strptime(f"{date.strip()} {' '.join(time.split()).upper()}", "%m/%d/%Y %I:%M %p")
            return local_to_utc(local, self.zone)
        except (ValueError, OverflowError):
            raise Unlisted("unparseable start") from None

    def patient_of(self, ids):
        """The appointment's patient as the EHR's FHIR Patient; `Unlisted` when it is not found."""
        fhir_id, internal = _id_of(ids, "FHIR"), _id_of(ids, "Internal")
        if fhir_id is not None:
            resource = self._known(f"FHIR:{fhir_id}", lambda: self._read(fhir_id))
        elif internal is not None and self.organization.epic_patient_id_system:
            resource = self._known(f"Internal:{internal}", lambda: self._search(internal))
        else:
            resource = None
        if resource is REFUSED:
            raise Unlisted(RESTRICTED)
        if resource is None:
            raise Unlisted("patient not found in the EHR")
        return listed_patient(resource)

    def _known(self, key: str, lookup):
        if key not in self.patients:
            if len(self.patients) > KNOWN_PATIENTS:
                self.patients.clear()
            self.patients[key] = lookup()
        return self.patients[key]

    def _read(self, patient_id: str):
        """The Patient; None when Epic has none; `REFUSED` when Epic answers 403 for this patient (a
        restricted one, or, if it refuses every read, the token: `finish_night`). A token that lacks
        Patient's scope (`NotGranted`, no request made) or any other refusal fails the night at once."""
        try:
            resource = self.client.get(f"Patient/{patient_id}")
        except LookupError:
            self.reads += 1
            return None
        except AccessRefused as exc:
            if exc.status != 403:   # NotGranted (no request made: None), a 401 after a new token...
                raise
            self.refusals += 1
            if len(self.refused) < 5:
                self.refused[patient_id] = _excerpt(exc.detail or str(exc), 200)
            log.warning("Epic refused Patient/%s of %s (HTTP 403, restricted?): its appointments are left out",
                        patient_id, self.organization.id)
            return REFUSED
        self.reads += 1
        return resource if resource.get("resourceType") == "Patient" and resource.get("id") == patient_id else None

    def _search(self, internal: str) -> dict | None:
        """The one Patient whose identifier is `{system}|{internal}` (None: none, or several)."""
        system = self.organization.epic_patient_id_system
        bundle = self.client.search("Patient", self.connector.search({"identifier": f"{system}|{internal}"}))
        found = [e["resource"] for e in bundle.get("entry") or () if isinstance(e, dict)
                 and isinstance(e.get("resource"), dict) and e["resource"].get("resourceType") == "Patient"
                 and is_id(e["resource"].get("id")) and _has_identifier(e["resource"], system, internal)]
        if len(found) > 1:
            log.warning("%d Patients of %s have identifier %s|%s: none chosen", len(found), self.organization.id,
                        system, internal)
        return found[0] if len(found) == 1 else None


def _id_of(ids, kind: str) -> str | None:
    """The trimmed `ID` of the first `{"ID", "Type"}` entry of this `Type` (any case), when it is an id."""
    if not isinstance(ids, list):
        return None
    for entry in ids:
        if isinstance(entry, dict) and isinstance(entry.get("Type"), str) \
                and entry["Type"].strip().lower() == kind.lower():
            value = entry.get("ID").strip() if isinstance(entry.get("ID"), str) else ""
            return value if is_id(value) else None  # R4 id characters: safe in a URL and a token search
    return None


def _identifiers(resource: dict) -> list[dict]:
    """The resource's `identifier` objects: none when it is not a list (a number, `true`...)."""
    found = resource.get("identifier")
    return [i for i in found if isinstance(i, dict)] if isinstance(found, list) else []


def _has_identifier(resource: dict, system: str, value: str) -> bool:
    return any(i.get("system") == system and str(i.get("value", "")).strip() == value for i in _identifiers(resource))


def _excerpt(text, limit: int = 300) -> str:
    """What Epic said, as one printable ASCII line of at most `limit` characters."""
    flat = " ".join("".join(c if c.isprintable() and ord(c) < 128 else " " for c in str(text)).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def _minutes(value) -> int:
    """`AppointmentDuration`: ASCII digits only (`str.isdigit` takes "²", which `int` refuses)."""
    text = value.strip() if isinstance(value, str) else str(value) if type(value) is int else ""
    if not MINUTES.fullmatch(text) or int(text) > MAX_DURATION_MINUTES:
        raise Unlisted("unparseable duration")
    return int(text)


def _text(value) -> str:
    return " ".join(value.split())[:200] if isinstance(value, str) else ""


def _department(providers) -> str:
    """The first provider entry's `DepartmentName` (where the appointment takes place)."""
    if isinstance(providers, list):
        for entry in providers:
            if isinstance(entry, dict) and isinstance(entry.get("DepartmentName"), str):
                return _text(entry["DepartmentName"])
    return ""
