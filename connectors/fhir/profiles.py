"""EHR profiles: what each vendor documents about its FHIR R4 API that discovery cannot tell.

A clinic on `fhir` names one (`svc-auth orgs update --fhir-profile`); `generic` is plain FHIR R4 /
US Core. Everything discoverable is discovered instead: SMART v1 or v2 scopes from the EHR's
`.well-known/smart-configuration` (`scope_version`), `$everything` from its CapabilityStatement.
Each entry's source is cited in docs/ehr-fhir.md ("Vendors"). No FHIR search syntax lives here
beyond the vendor's own parameter names (`connectors.fhir.query` builds the searches).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType

from connectors.fhir.grants import requested_scopes

SCOPE_CHOICES = ("auto", "v1", "v2")
SEARCH_PARAM_NAME = re.compile(r"[a-z][a-z0-9\-]{0,63}")
SEARCH_PARAM_VALUE = re.compile(r"[A-Za-z0-9\-._/|:]{1,200}")
MAX_SEARCH_PARAMS = 8
RESERVED_SEARCH_PARAMS = frozenset(("patient", "practitioner", "subject", "date", "status", "identifier",
                                    "category", "code", "onset-date", "authoredon", "date-or-req-period"))
"""Names svc-auth sets itself; a clinic's extra parameters may not replace them."""


@dataclass(frozen=True)
class Profile:
    """One vendor's documented rules (see docs/ehr-fhir.md for each entry's source)."""

    name: str
    label: str
    appointment_include: bool = True
    """Whether the Appointment search takes `_include=Appointment:patient` (else Patients are read
    in batches by `_id`)."""
    appointment_date: str = "date"
    """The Appointment search's date parameter. Oracle: `-date-or-req-period`, which also returns
    `proposed` appointments that `date` hides."""
    id_search_alone: bool = False
    """Oracle: a search by `_id` takes no other parameter (svc-auth then sends no `_count`, nor the
    clinic's extra parameters)."""
    observation_categories: tuple[str, ...] = ()
    """Epic: Observation is searched with `patient` and `category`, one search per category."""
    schedule_search: bool = True
    """False where the vendor documents no FHIR search of a practitioner's appointments (Epic): the
    night still asks, and fails with the EHR's answer and this note."""
    required_search_params: tuple[str, ...] = ()
    """Parameters the vendor requires on every search, to be given per clinic (athena: `ah-practice`)."""
    default_scopes: str = "v2"
    """The scope syntax when the SMART configuration says neither (Oracle documents v1 only)."""


PROFILES = MappingProxyType({p.name: p for p in (
    Profile("generic", "FHIR R4"),
    Profile("epic", "Epic", observation_categories=(
        "vital-signs", "laboratory", "social-history", "exam", "survey", "imaging", "procedure"),
        schedule_search=False),
    Profile("oracle", "Oracle Health (Millennium)", appointment_include=False,
            appointment_date="-date-or-req-period", id_search_alone=True, default_scopes="v1"),
    Profile("athena", "athenahealth", required_search_params=("ah-practice",)),
)})
PROFILE_NAMES = tuple(PROFILES)


def profile_named(name: str | None) -> Profile:
    return PROFILES.get(name or "generic", PROFILES["generic"])


def scope_version(configuration: dict, profile: Profile) -> str:
    """`v1` or `v2` from a SMART configuration: `capabilities` (`permission-v2`/`permission-v1`),
    else the syntax of `scopes_supported` (`.rs` vs `.read`), else the profile's default."""
    capabilities = configuration.get("capabilities") if isinstance(configuration, dict) else None
    capabilities = [c for c in capabilities if isinstance(c, str)] if isinstance(capabilities, list) else []
    if "permission-v2" in capabilities:
        return "v2"
    if "permission-v1" in capabilities:
        return "v1"
    supported = configuration.get("scopes_supported") if isinstance(configuration, dict) else None
    supported = [s for s in supported if isinstance(s, str)] if isinstance(supported, list) else []
    if any(re.fullmatch(r"system/[A-Za-z*]+\.c?r?u?d?s", s) for s in supported):
        return "v2"
    if any(re.fullmatch(r"system/[A-Za-z*]+\.(read|\*)", s) for s in supported):
        return "v1"
    return profile.default_scopes


def scopes(version: str) -> tuple[str, ...]:
    """The `system/` scopes svc-auth asks for, in SMART v1 (`.read`) or v2 (`.rs`) syntax: one per
    type the FHIR API serves (`connectors.fhir.grants`, from the one US Core table)."""
    return requested_scopes(version)


def parse_search_params(pairs) -> tuple[tuple[str, str], ...]:
    """`NAME=VALUE` strings as (name, value) pairs; `ValueError` naming what is wrong."""
    found = []
    for pair in pairs or ():
        name, sep, value = str(pair).partition("=")
        if not sep:
            raise ValueError(f"--fhir-search-param must be NAME=VALUE, got {str(pair)[:80]!r}")
        found.append((name, value))
    return check_search_params(found)


def check_search_params(pairs) -> tuple[tuple[str, str], ...]:
    """Validated (name, value) pairs: a lower-case FHIR parameter name not svc-auth's own, a value
    of letters, digits and `-._/|:` only (no `&`, `,`, spaces), at most `MAX_SEARCH_PARAMS`."""
    pairs = tuple((str(n), str(v)) for n, v in pairs)
    if len(pairs) > MAX_SEARCH_PARAMS:
        raise ValueError(f"at most {MAX_SEARCH_PARAMS} --fhir-search-param")
    for name, value in pairs:
        if not SEARCH_PARAM_NAME.fullmatch(name):
            raise ValueError(f"search parameter name {name[:80]!r} must be lower-case letters, digits and '-' "
                             f"(1-64, starting with a letter), e.g. ah-practice")
        if name in RESERVED_SEARCH_PARAMS:
            raise ValueError(f"search parameter {name!r} is set by svc-auth itself")
        if not SEARCH_PARAM_VALUE.fullmatch(value):
            raise ValueError(f"search parameter {name}'s value must be 1-200 letters, digits or -._/|: "
                             f"(e.g. Organization/a-1.Practice-195900), got {value[:80]!r}")
    if len({n for n, _ in pairs}) != len(pairs):
        raise ValueError("each --fhir-search-param name may be given once")
    return pairs


def missing_required(profile: Profile, pairs) -> list[str]:
    """The vendor's required parameters the clinic has not given."""
    given = {name for name, _ in pairs}
    return [name for name in profile.required_search_params if name not in given]
