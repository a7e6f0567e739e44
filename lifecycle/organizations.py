"""Organizations (clinics): create, update, find. An organization's `ehr` names its connector."""
from __future__ import annotations

import json
import re

from connectors.fhir.epic_schedule import check_settings as check_epic_settings, interconnect_base
from connectors.fhir.profiles import (PROFILE_NAMES, SCOPE_CHOICES, check_search_params, missing_required,
                                      profile_named)
from models.audit import AuditEvent
from models.directory import Organization
from models.timezones import DEFAULT_TIME_ZONE, check_time_zone
from errors import ApiError
from oauth.redirects import redirect_uri_allowed

EHR_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")
FHIR_AUTH_MODES = ("smart-backend", "none")


def invalid(message: str, error: str = "invalid_request") -> ApiError:
    return ApiError(400, error, message)


def find_organization(organization_id: str) -> Organization:
    """The organization with this id, else 404 `organization_not_found`."""
    org = Organization.get_or_none(Organization.id == organization_id)
    if org is None:
        raise ApiError(404, "organization_not_found", f"No organization has id {organization_id!r}.")
    return org


def clean_name(name: str | None) -> str:
    name = (name or "").strip()
    width = Organization.name.max_length
    if not name or len(name) > width:
        raise invalid(f"An organization needs a name of 1 to {width} characters.")
    return name


def clean_ehr(ehr: str | None) -> str:
    if not EHR_NAME.fullmatch(ehr or ""):
        raise invalid("ehr must be a short lower-case EHR name such as 'sandbox'.")
    return ehr


def check_fhir(fields: dict) -> None:
    """An organization on `fhir` needs a FHIR base URL, and a client id unless its server is open."""
    if fields.get("fhir_auth") not in FHIR_AUTH_MODES:
        raise invalid(f"fhir_auth must be one of {', '.join(FHIR_AUTH_MODES)}.")
    if fields.get("ehr") != "fhir":
        return
    if not fields.get("ehr_url"):
        raise invalid("An organization on the fhir EHR needs its FHIR base URL (--fhir-base-url).")
    if fields["fhir_auth"] == "smart-backend" and not fields.get("fhir_client_id"):
        raise invalid("An organization on the fhir EHR needs svc-auth's client id there (--fhir-client-id), "
                      "or --fhir-auth none for an open test server.")
    profile = profile_named(fields.get("fhir_profile"))
    if fields.get("epic_user_id"):
        if profile.name != "epic":
            raise invalid("--epic-user-id is for a clinic on Epic: give --fhir-profile epic too (or clear it with "
                          "--epic-user-id '').")
        try:
            interconnect_base(fields["ehr_url"])
        except ValueError as exc:
            raise invalid(f"Epic's GetProviderAppointments web service is called at the Interconnect base: {exc}.") \
                from None
    missing = missing_required(profile, json.loads(fields.get("fhir_search_params") or "[]"))
    if missing:
        raise invalid(f"The {profile.label} profile needs the search parameter {', '.join(missing)} on every "
                      f"search (--fhir-search-param {missing[0]}=VALUE; see docs/ehr-fhir.md).")


def clean_fhir_profile(fields: dict, profile: str | None, scopes: str | None, search_params) -> None:
    """Validate and add the FHIR profile, scope syntax and extra search parameters given (None: unchanged)."""
    if profile is not None:
        if profile not in PROFILE_NAMES:
            raise invalid(f"fhir_profile must be one of {', '.join(PROFILE_NAMES)}.")
        fields["fhir_profile"] = profile
    if scopes is not None:
        if scopes not in SCOPE_CHOICES:
            raise invalid(f"fhir_scopes must be one of {', '.join(SCOPE_CHOICES)}.")
        fields["fhir_scopes"] = scopes
    if search_params is not None:
        try:
            fields["fhir_search_params"] = json.dumps([list(p) for p in check_search_params(search_params)])
        except ValueError as exc:
            raise invalid(f"Invalid FHIR search parameter: {exc}.") from None


def search_params_of(org: Organization) -> list[tuple[str, str]]:
    """The clinic's extra search parameters, as stored (validated on the way in)."""
    try:
        return [tuple(p) for p in json.loads(org.fhir_search_params or "[]")]
    except ValueError:
        return []


EPIC_FIELDS = ("epic_user_id", "epic_user_id_type", "epic_provider_id_type", "epic_provider_id_system",
               "epic_patient_id_system")


def clean_epic(fields: dict, given: dict) -> None:
    """Validate and add the Epic web service's settings given (None: unchanged)."""
    given = {name: value for name, value in given.items() if value is not None}
    unknown = set(given) - set(EPIC_FIELDS)
    if unknown:
        raise TypeError(f"unknown Epic settings {sorted(unknown)}")
    try:
        fields.update(check_epic_settings(**{name[len("epic_"):]: value for name, value in given.items()}))
    except ValueError as exc:
        raise invalid(f"{exc}.") from None


def clean_time_zone(name: str) -> str:
    """The clinic's IANA time zone, else 400 naming the bad value."""
    try:
        return check_time_zone(name)
    except ValueError as exc:
        raise invalid(f"time_zone: {exc}.") from None


def clean_ehr_url(ehr_url: str) -> str:
    width = Organization.ehr_url.max_length
    if len(ehr_url) > width:  # PostgreSQL refuses more, SQLite would store it
        raise invalid(f"ehr_url (--ehr-url, --fhir-base-url) must be at most {width} characters.")
    if ehr_url and not redirect_uri_allowed(ehr_url, ehr_url):
        raise invalid(f"ehr_url must be an absolute http(s) URL without a fragment, got {ehr_url!r}.")
    return ehr_url


def clean_fhir_client_id(client_id: str) -> str:
    client_id = client_id.strip()
    width = Organization.fhir_client_id.max_length
    if len(client_id) > width:
        raise invalid(f"fhir_client_id (--fhir-client-id) must be at most {width} characters.")
    return client_id


def create_organization(name: str, ehr: str = "sandbox", ehr_url: str = "", org_id: str | None = None,
                        fhir_client_id: str = "", fhir_auth: str = "smart-backend", fhir_profile: str = "generic",
                        fhir_scopes: str = "auto", fhir_search_params=(),
                        time_zone: str = DEFAULT_TIME_ZONE, **epic) -> Organization:
    """A new organization (`epic`: the `EPIC_FIELDS` of Epic's web service, when given)."""
    fields = {"name": clean_name(name), "ehr": clean_ehr(ehr), "ehr_url": clean_ehr_url(ehr_url or ""),
              "fhir_client_id": clean_fhir_client_id(fhir_client_id or ""), "fhir_auth": fhir_auth,
              "time_zone": clean_time_zone(time_zone)}
    clean_fhir_profile(fields, fhir_profile, fhir_scopes, fhir_search_params)
    clean_epic(fields, epic)
    if org_id:
        fields["id"] = org_id
    check_fhir(fields)
    return Organization.create(**fields)


def update_organization(organization_id: str, name: str | None = None, ehr: str | None = None,
                        ehr_url: str | None = None, actor: str = "operator", fhir_client_id: str | None = None,
                        fhir_auth: str | None = None, fhir_profile: str | None = None, fhir_scopes: str | None = None,
                        fhir_search_params=None, time_zone: str | None = None, **epic) -> Organization:
    """Change an organization's name, EHR, EHR URL, FHIR registration, time zone or Epic web service
    settings (`EPIC_FIELDS`; None: unchanged); audited.
    A clinic can move between `sandbox` and `fhir`."""
    org = find_organization(organization_id)
    changes = {}
    if name is not None:
        changes["name"] = clean_name(name)
    if ehr is not None:
        changes["ehr"] = clean_ehr(ehr)
    if ehr_url is not None:
        changes["ehr_url"] = clean_ehr_url(ehr_url)
    if fhir_client_id is not None:
        changes["fhir_client_id"] = clean_fhir_client_id(fhir_client_id)
    if fhir_auth is not None:
        changes["fhir_auth"] = fhir_auth
    clean_fhir_profile(changes, fhir_profile, fhir_scopes, fhir_search_params)
    if time_zone is not None:
        changes["time_zone"] = clean_time_zone(time_zone)
    clean_epic(changes, epic)
    if changes:
        check_fhir({"ehr": org.ehr, "ehr_url": org.ehr_url, "fhir_client_id": org.fhir_client_id,
                    "fhir_auth": org.fhir_auth, "fhir_profile": org.fhir_profile,
                    "fhir_search_params": org.fhir_search_params, "epic_user_id": org.epic_user_id, **changes})
        Organization.update(**changes).where(Organization.id == org.id).execute()
        AuditEvent.record(actor, "organization.updated", org.id, **changes)
    return Organization.get_by_id(org.id)
