"""A backend app's system token on the FHIR API (SMART Backend Services): who it is, which clinics
it reaches, and what it may do there.

A system token (audience `fhir-system`, `oauth.system_credentials`) names an application and its
granted system scopes, no user and no clinic. It reaches the FHIR API of every clinic where the app
is installed and `Enabled` (an explicit Enabled: an installation with no status yet, or Disabled,
is 403 `application_disabled`); a clinic where the app is not installed answers 404, as an unknown
FHIR base does, so the token learns nothing of other clinics. Within a clinic it reads and searches
as far as both its token's scopes and the app's registered system scopes (as registered now: a
narrowed registration applies at once) allow (`fhir_api.access.grant_for`).

`SystemCaller` is the FHIR API's caller for such a token, shaped as `oauth.bearer.Caller` (claims,
app, installation, organization_id; no user, no patient) plus what a backend export needs:
`system_scopes` (granted), `registered_scopes`, and `allowed_clinics()`.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses

import orjson

from errors import ApiError
from models.application import ENABLED, Installation
from oauth.bearer import BearerGate, bearer_value
from oauth.tokens import SYSTEM_AUDIENCE


@dataclasses.dataclass(frozen=True)
class SystemCaller:
    """A live system token on one clinic where its app is installed and Enabled."""

    claims: dict
    app: object
    organization_id: str
    installation: object
    user = None
    patient = None
    is_system = True

    @property
    def user_id(self) -> None:
        return None

    @property
    def system_scopes(self) -> str:
        """The scopes the token was granted (`system/Patient.rs ...`)."""
        value = self.claims.get("scope")
        return value if isinstance(value, str) else ""

    @property
    def registered_scopes(self) -> str:
        """What the app may ask now (`apps ... --system-scopes`); access needs both."""
        return self.app.system_scopes or ""

    @property
    def declared_scopes(self) -> str:
        return self.registered_scopes

    def allowed_clinics(self) -> list[str]:
        """Every clinic this token reaches: where its app is installed and Enabled."""
        return allowed_clinics(self.app.id)


def allowed_clinics(application_id: str) -> list[str]:
    """The organization ids where the application is installed and Enabled, in id order."""
    return [row.organization_id for row in Installation.select(Installation.organization)
            .where((Installation.application == application_id) & (Installation.activation_status == ENABLED))
            .order_by(Installation.organization)]


def presents_system_token(authorization: str | None) -> bool:
    """Does the request present a system token? A routing hint read from the token's unverified
    payload (`aud`): the gate it picks verifies the token in full, audience included."""
    token = bearer_value(authorization)
    if not token or token.count(".") != 2 or len(token) > 8192:
        return False
    payload = token.split(".")[1]
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        return False
    return isinstance(claims, dict) and claims.get("aud") == SYSTEM_AUDIENCE


def enabled_installation(gate: BearerGate, runtime, caller, context: dict) -> SystemCaller:
    """The gate's requirement: the path's clinic is one where the token's app is installed (else
    404, as an unknown FHIR base) and Enabled (else 403 `application_disabled`)."""
    organization_id = context.get("organization_id")
    installation = Installation.find(caller.app.id, organization_id) if isinstance(organization_id, str) else None
    if installation is None:
        raise ApiError(404, "not_found", "No such FHIR base.")
    if installation.activation_status != ENABLED:
        raise ApiError(403, "application_disabled", "The application is not Enabled in this organization: the "
                                                    "partner enables it (PUT .../activation-status).")
    return SystemCaller(claims=caller.claims, app=caller.app, organization_id=organization_id,
                        installation=installation)


SYSTEM_FHIR_API = BearerGate(SYSTEM_AUDIENCE, requirements=(enabled_installation,))
"""The FHIR API's gate for system tokens: a live token of an existing app, on an Enabled clinic."""
