"""The sandbox EHR, a testing tool that must not be a backdoor.

- Off unless SVC_SANDBOX=on: `require_sandbox_on` is what every sandbox surface calls first.
- Only users of organizations on the `sandbox` or a `fhir` EHR get sandbox tokens, a hub or a settings page.
- A person enters through a one-time sign-in link (`create_signin_link`, printed by the operator
  CLI and by `serve --demo`), which opens a server-side session (`open_sandbox_session_from_link`); the
  browser holds only the session's random id in an HttpOnly cookie.
- The settings-page token (`issue_sandbox_token`) names who the platform user is for 30 minutes.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import secrets

from lifecycle.applications import find_application
from models.directory import Organization, User
from models.sandbox import SandboxSession, SandboxSigninLink
from errors import ApiError
from oauth.bearer import BearerGate
from ratelimit.lockout import throttle_check, throttle_failure
from oauth.tokens import SANDBOX_AUDIENCE

SANDBOX_EHR = "sandbox"
SANDBOX_EHRS = frozenset({SANDBOX_EHR, "fhir"})
SESSION_COOKIE = "svc_sandbox_session"
LINK_TARGETS = ("hub", "settings")


class SandboxOff(ApiError):
    def __init__(self):
        super().__init__(404, "not_found", "No such resource.")


def require_sandbox_on(settings) -> None:
    """404, as for any unknown path, when the sandbox is off (SVC_SANDBOX)."""
    if not settings.sandbox:
        raise SandboxOff()


def is_sandbox_user(user: User) -> bool:
    """A user of a clinic whose EHR svc-auth has a connector for: the sandbox generator, or a FHIR
    EHR (CONTRACTS: with the sandbox on, its hub serves a FHIR clinic's physicians too, which is
    how they complete the flow in tests and demos). Other EHR names stay outside."""
    org = Organization.get_or_none(Organization.id == user.organization_id)
    return org is not None and org.ehr in SANDBOX_EHRS


def require_sandbox_user(user: User | None, user_id: str = "") -> User:
    if user is None:
        raise ApiError(404, "user_not_found", f"no user has id {user_id!r}.")
    if not is_sandbox_user(user):
        raise ApiError(403, "not_a_sandbox_user",
                       "Only users of organizations on the sandbox or a FHIR EHR can use the sandbox hub.")
    return user


def issue_sandbox_token(runtime, user: User, auth_time: float | None = None) -> str:
    """A 30-minute sandbox token for a sandbox user; `auth_time` = when the person signed in
    (epoch seconds; default now, for operator-issued tokens)."""
    require_sandbox_user(user)
    when = int(runtime.clock.time() if auth_time is None else auth_time)
    token, _ = runtime.tokens.access_token(user.id, SANDBOX_AUDIENCE, runtime.settings.sandbox_token_ttl,
                                           org=user.organization_id, auth_time=when)
    return token


def sandbox_member(gate: BearerGate, runtime, caller, context: dict):
    """The sandbox gate's requirement: the token names a user of a sandbox clinic."""
    user = User.get_or_none(User.id == caller.claims.get("sub"))
    if user is None or not is_sandbox_user(user):
        raise gate.invalid()
    return dataclasses.replace(caller, user=user)


SANDBOX = BearerGate(SANDBOX_AUDIENCE, app_claim=None, requirements=(sandbox_member,),
                     message="Authentication failed")
"""The sandbox API's gate (`POST /v1/sandbox/launches`, the hub's app list, the platform's
verification): a live sandbox token of a sandbox user; every refusal says "Authentication failed"."""


def sandbox_user(runtime, authorization: str | None) -> User:
    """The user the sandbox token of `Authorization: Bearer` names, or 401 "Authentication failed"
    (spec: expired token). With the sandbox off, no sandbox token is accepted anywhere."""
    return sandbox_user_and_auth_time(runtime, authorization)[0]


def sandbox_user_and_auth_time(runtime, authorization: str | None) -> tuple[User, int]:
    """`sandbox_user`, and when that user authenticated with the platform (the token's
    `auth_time`, epoch seconds; its `iat` for a token from before auth_time existed)."""
    if not runtime.settings.sandbox:
        raise SANDBOX.invalid()
    caller = SANDBOX.caller(runtime, authorization)
    auth_time = caller.claims.get("auth_time")
    return caller.user, auth_time if isinstance(auth_time, int) else caller.claims["iat"]


# -- sign-in links and sessions ------------------------------------------------------------------

def create_signin_link(runtime, user_id: str, application_id: str | None = None, target: str = "hub") -> str:
    """A one-time sign-in URL for a sandbox user (absolute); with an app, the hub opens it at once."""
    require_sandbox_on(runtime.settings)
    user = require_sandbox_user(User.get_or_none(User.id == user_id), user_id)
    if application_id is not None:
        find_application(application_id)
    if target not in LINK_TARGETS:
        raise ApiError(400, "invalid_request", f"target must be one of {', '.join(LINK_TARGETS)}.")
    token = secrets.token_urlsafe(32)
    now = runtime.clock.now()
    SandboxSigninLink.create(token_hash=runtime.hasher.digest(token), key_id=runtime.hasher.key_id, user=user.id, application=application_id,
                             target=target, created_at=now,
                             expires_at=now + dt.timedelta(seconds=runtime.settings.sandbox_link_ttl))
    return f"{runtime.settings.public_url}/sandbox/signin/{token}"


def open_sandbox_session_from_link(runtime, token: str, address: str | None = None) -> tuple[str, User, SandboxSigninLink]:
    """Redeem a sign-in link once: (session id for the cookie, the user, the link).
    An unknown, used or expired link is one and the same 401 (nothing to learn by probing). Failed
    links count against `address` in `runtime.sandbox_signin_throttle` (`ratelimit.lockout`, as client
    authentication does): past the limit, 429 with Retry-After before any link is looked up."""
    throttle = runtime.sandbox_signin_throttle
    throttle_check(throttle, None, address)
    now = runtime.clock.now()
    link_hashes = runtime.hasher.digests(token or "")  # under the current SVC_HMAC_KEY, then previous ones
    claimed = (SandboxSigninLink.update(used_at=now)
               .where(SandboxSigninLink.token_hash.in_(link_hashes) & SandboxSigninLink.used_at.is_null()
                      & (SandboxSigninLink.expires_at > now)).execute())
    if claimed != 1:
        throttle_failure(throttle, None, address)
        raise ApiError(401, "invalid_signin_link", "This sign-in link is not valid: it is unknown, was already "
                       "used or has expired. Ask the operator for a new one (svc-auth sandbox signin-link).")
    link = SandboxSigninLink.get(SandboxSigninLink.token_hash.in_(link_hashes))
    user = require_sandbox_user(User.get_or_none(User.id == link.user_id), link.user_id)
    return open_sandbox_session(runtime, user), user, link


def open_app_mark(runtime, session_id: str, application_id: str) -> str:
    """What a sign-in link's redirect adds to `/sandbox/hub?app=` (`open`) so the hub opens that app
    at once: a MAC of this browser's session and the app. Any site can send a browser to
    `/sandbox/hub?app=X` (its Lax cookie goes along on a top-level GET); without the mark the hub
    only lists the app, so nobody else's page can launch an app, and start its installation's
    first verification, for the user."""
    return runtime.hasher.sign(f"hub-open\x00{session_id}\x00{application_id}")


def opens_at_once(runtime, session_id: str, application_id: str | None, mark: str | None) -> bool:
    """Whether `mark` is `open_app_mark` of this session and app (either key of a rotation)."""
    return bool(application_id and mark) and runtime.hasher.verify(
        f"hub-open\x00{session_id}\x00{application_id}", mark)


def open_sandbox_session(runtime, user: User) -> str:
    """Start a browser session for `user` (sign-in link or invitation); returns the cookie value.
    The physician's EHR session is live from now on (the nightly sync may read for them)."""
    from workers.activity import record_activity
    session_id = secrets.token_urlsafe(32)
    now = runtime.clock.now()
    SandboxSession.create(session_hash=runtime.hasher.digest(session_id), key_id=runtime.hasher.key_id, user=user.id, signed_in_at=now,
                          expires_at=now + dt.timedelta(seconds=runtime.settings.sandbox_session_ttl))
    record_activity(runtime, user)
    return session_id


def sandbox_session_of(runtime, session_id: str | None) -> tuple[User, SandboxSession] | None:
    """The signed-in sandbox user of this cookie value, or None (unknown, ended, expired)."""
    if not session_id:
        return None
    session = SandboxSession.get_or_none(SandboxSession.session_hash.in_(runtime.hasher.digests(session_id)))
    if session is None or session.ended_at is not None or session.expires_at <= runtime.clock.now():
        return None
    user = User.get_or_none(User.id == session.user_id)
    if user is None or not is_sandbox_user(user):
        return None
    return user, session


def end_sandbox_session(runtime, session_id: str | None) -> None:
    """Sign out: the session ends, and with it the physician's EHR (connector) session."""
    from workers.activity import end_activity
    found = sandbox_session_of(runtime, session_id)
    if found is None:
        return
    user, session = found
    SandboxSession.update(ended_at=runtime.clock.now()).where(
        SandboxSession.session_hash == session.session_hash).execute()
    end_activity(runtime, user)


def signed_in_at(session: SandboxSession) -> float:
    """Epoch seconds of the sign-in (the `auth_time` of tokens issued in this session)."""
    return session.signed_in_at.replace(tzinfo=dt.timezone.utc).timestamp()
