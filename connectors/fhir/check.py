"""`svc-auth ehr check`: discovery, the token, the scopes it grants, a Practitioner search per
physician's NPI and an Appointment search, a verdict per step."""
from __future__ import annotations

import datetime as dt

from connectors.base import ConnectorError, Provider
from connectors.fhir.client import ehr_said
from connectors.fhir.epic_schedule import no_schedule_search
from connectors.fhir.grants import NIGHT_TYPES, REQUESTED_TYPES
from connectors.fhir.query import instant
from models.npi import NPI_SYSTEM

MAX_NPIS = 100                   # NPIs looked up by one check (the clinic's first, by user id)


def check(connector, npis, now: dt.datetime) -> list[dict]:
    """`svc-auth ehr check`: discovery, the token, one Practitioner search per NPI of `npis` (in
    the order given) and one Appointment search (of the first NPI the EHR knows); a verdict per
    step, stopping at the first failure. The practitioner step also carries `npis`:
    `{"known": {npi: "Practitioner/{id}"}, "unknown": [npi, ...]}`; it fails when the EHR knows none
    of them. A step failed by the EHR's answer also carries `ehr_said`: what the EHR wrote (its
    OperationOutcome's text), for the operator here alone (every other message leaves it out)."""
    steps = []

    def step(name: str, action):
        try:
            outcome = action()
        except (ConnectorError, LookupError) as exc:
            said = ehr_said(exc)
            steps.append({"step": name, "ok": False, "detail": str(exc), **({"ehr_said": said} if said else {}),
                          **getattr(exc, "extra", {})})
        else:
            detail, extra = outcome if isinstance(outcome, tuple) else (outcome, {})
            steps.append({"step": name, "ok": True, "detail": detail, **extra})
        return steps[-1]["ok"]

    client, known, unknown = connector.client, {}, []
    npis = list(dict.fromkeys(n for n in (npis or ()) if n))
    open_server = client.auth == "none"
    if not step("discovery", lambda: "not used: an open server (--fhir-auth none)" if open_server
                else f"token endpoint {client.token_endpoint(fresh=True)}"):
        return steps
    if not step("token", lambda: "not used: an open server" if open_server
                else f"access token granted to {client.client_id} (scopes {' '.join(client.scopes)})"
                if client.access_token() else "no token"):
        return steps
    if not step("scopes", lambda: scopes_step(client, open_server)):
        return steps

    def practitioner():
        if not npis:
            params = connector.search({"_count": 1})
            entries = connector.client.search("Practitioner", params).get("entry") or ()
            first = next((r.get("id") for e in entries if isinstance(e, dict)
                          and isinstance(r := e.get("resource"), dict)), None)
            if isinstance(first, str) and first:
                known[""] = f"Practitioner/{first}"
            return "no physician (user with an NPI) to look up; the Practitioner search answered"
        for npi in npis[:MAX_NPIS]:
            found = connector.practitioner_id(npi)
            if found:
                known[npi] = f"Practitioner/{found}"
            else:
                unknown.append(npi)
        summary = {"known": dict(known), "unknown": list(unknown)}
        if not known:
            raise _StepFailed(f"the EHR knows none of these NPIs ({NPI_SYSTEM}): {', '.join(npis[:MAX_NPIS])}",
                              {"npis": summary})
        detail = "known: " + ", ".join(f"{n} ({p})" for n, p in known.items())
        if unknown:
            detail += "; unknown (no appointments for them): " + ", ".join(unknown)
        if len(npis) > MAX_NPIS:
            detail += f"; {len(npis) - MAX_NPIS} more not checked"
        return detail, {"npis": summary}
    if not step("practitioner", practitioner):
        return steps

    def appointments():
        if connector.epic_schedule is not None:  # Epic with --epic-user-id: its web service, not FHIR
            return epic_appointments(connector, next((n for n in known if n), None), now)
        practitioner_ref = next(iter(known.values()), None)
        if practitioner_ref:
            params = connector.appointment_search(practitioner_ref.split("/", 1)[1], now, None)
            params["_count"] = 1
            params.pop("_include", None)
        else:
            params = connector.search({connector.profile.appointment_date: f"ge{instant(now)}", "_count": 1})
        try:
            bundle = connector.client.search("Appointment", params)
        except ConnectorError as exc:
            if connector.profile.schedule_search:
                raise
            raise ConnectorError(f"{exc} ({no_schedule_search(connector.profile.label, connector.organization.id)})") \
                from None
        of = f" of {practitioner_ref}" if practitioner_ref else ""
        return f"the search{of} answered ({bundle.get('total', len(bundle.get('entry') or ()))} from now on)"
    step("appointments", appointments)
    return steps


def epic_appointments(connector, npi: str | None, now: dt.datetime) -> str:
    """The `appointments` step of an Epic clinic with `--epic-user-id`: GetProviderAppointments for
    the first physician the EHR knows, over the next day; it fails when that physician's
    Practitioner has no identifier to name them to Epic by (each night would skip them all)."""
    if npi is None:
        return "no physician (user with an NPI the EHR knows) to ask Epic's GetProviderAppointments for"
    schedule, provider = connector.epic_schedule, Provider(user_id="", npi=npi, name="")
    provider_id = schedule.provider_id(provider)
    if provider_id is None:
        wanted = schedule.wanted_provider_id()
        raise ConnectorError(f"the Practitioner with NPI {npi} has no Epic provider id ({wanted}), so Epic's "
                             f"GetProviderAppointments cannot be asked for it and each night skips such "
                             f"physicians: set --epic-provider-id-system URI (the system of their Epic provider id), "
                             f"or --epic-provider-id-type NPI")
    found = list(schedule.appointments_of(provider, provider_id, now, now + dt.timedelta(days=1)))
    schedule.finish_night()   # every Patient read refused: the night would fail the same way
    restricted = (f"; {schedule.refusals} Patient read(s) refused by Epic (restricted, break-the-glass): "
                  f"their appointments are left out" if schedule.refusals else "")
    return f"Epic's GetProviderAppointments answered for NPI {npi} ({len(found)} listed in the next 24 hours{restricted})"


def scopes_step(client, open_server: bool):
    """The types the EHR's token grants svc-auth and those it does not (the step's `granted` and
    `missing`); it fails only when one the night or the charts need is missing."""
    if open_server:
        return "not used: an open server (every type is read without a token)", {
            "granted": list(REQUESTED_TYPES), "missing": []}
    granted = client.granted_types() or frozenset()
    summary = {"granted": [t for t in REQUESTED_TYPES if t in granted],
               "missing": [t for t in REQUESTED_TYPES if t not in granted]}
    detail = (f"granted {len(summary['granted'])} of {len(REQUESTED_TYPES)} types: {', '.join(summary['granted'])}"
              + (f"; missing (the FHIR API answers 403 for them): {', '.join(summary['missing'])}"
                 if summary["missing"] else ""))
    needed = [t for t in NIGHT_TYPES if t not in granted]
    if not granted:
        raise _StepFailed(f"the EHR granted none of the scopes asked ({' '.join(client.scopes[:3])} ...): check "
                          f"svc-auth's registration there, and whether the EHR takes the other SMART scope "
                          f"syntax (svc-auth orgs update --fhir-scopes v1|v2)", summary)
    if needed:
        raise _StepFailed(f"{detail}; the schedule and charts need {', '.join(needed)}: grant svc-auth's "
                          f"registration those system/ scopes", summary)
    return detail, summary


class _StepFailed(ConnectorError):
    """A failed step with more to report than its detail (`extra`: keys added to the step)."""

    def __init__(self, message: str, extra: dict):
        super().__init__(message)
        self.extra = extra
