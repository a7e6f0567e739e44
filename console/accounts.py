"""Console accounts: operator invitations, passwords (Argon2id), optional TOTP, server-side
sessions with idle and absolute expiry, their CSRF tokens, and which applications a developer may
manage.

Tokens (invitation links, session cookies) carry 256 random bits and are stored only as keyed
hashes (`runtime.hasher`), like client secrets; passwords, which people choose, get Argon2id.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
from typing import NamedTuple

import argon2
import pyotp

from console.devices import issue_device_cookie, trusted_device
from keys.totp import open_totp, seal_totp
from lifecycle.applications import find_application
from lifecycle.users import clean_email, normal_email
from models.application import Application
from models.audit import AuditEvent
from models.developers import ConsoleSession, Developer, DeveloperAccess, DeveloperInvite
from models.ids import is_id, new_secret
from errors import ApiError
from ratelimit.limiter import RateLimiterUnavailable
from ratelimit.lockout import throttle_attempt, throttle_failed, throttle_failure, throttle_withdraw

CSRF_LABEL = "console-csrf\x00"  # sets the session's CSRF MACs apart from the key's other MACs
PASSWORD_MIN = 12
PASSWORD_MAX = 1024
_HASHER = argon2.PasswordHasher()
# Verified when the e-mail is unknown, so an unknown account costs the same time as a wrong password.
_DUMMY_HASH = _HASHER.hash("not a password of anyone")


class FieldErrors(ApiError):
    """400 with a message per form field (shown beside the field)."""

    def __init__(self, fields: dict[str, str]):
        super().__init__(400, "invalid_request", " ".join(fields.values()))
        self.fields = fields


def actor_of(developer: Developer) -> str:
    """How the audit trail names a developer."""
    return f"developer:{developer.email}"


# -- invitations --------------------------------------------------------------------------------

def invite_developer(runtime, application_id: str, email: str, actor: str = "operator") -> tuple[Developer, str, dt.datetime]:
    """Grant `email` access to the application; returns (developer, one-time URL, expiry)."""
    app = find_application(application_id)
    email = clean_email(email)
    now = runtime.clock.now()
    with runtime.db.atomic():
        developer = Developer.get_or_none(Developer.email == email)
        if developer is None:
            developer = Developer.create(email=email, created_at=now)
        DeveloperAccess.insert(developer=developer.id, application=app.id, granted_at=now).on_conflict_ignore().execute()
        token = new_secret()
        expires_at = now + dt.timedelta(seconds=runtime.settings.invitation_ttl)
        DeveloperInvite.create(token_hash=runtime.hasher.digest(token), key_id=runtime.hasher.key_id, developer=developer.id, application=app.id,
                               created_at=now, expires_at=expires_at)
        AuditEvent.record(actor, "developer.invited", app.id, developer=email)
    return developer, f"{runtime.settings.public_url}/console/invite/{token}", expires_at


def open_invite(runtime, token: str) -> DeveloperInvite:
    """The unused, unexpired invitation of `token`, with a TOTP secret to offer; else 404."""
    invite = DeveloperInvite.get_or_none(DeveloperInvite.token_hash.in_(runtime.hasher.digests(token or "")))
    if invite is None or invite.used_at is not None or invite.expires_at <= runtime.clock.now():
        raise ApiError(404, "invitation_not_found", "This invitation link is unknown, used or expired. "
                                                     "Ask your operator for a new one.")
    if open_totp(runtime, invite.developer_id, invite.totp_secret) is None:  # none yet, or sealed under a dropped key
        stored = invite.totp_secret
        same = DeveloperInvite.totp_secret.is_null() if stored is None else DeveloperInvite.totp_secret == stored
        DeveloperInvite.update(totp_secret=seal_totp(runtime, invite.developer_id, pyotp.random_base32())).where(
            (DeveloperInvite.token_hash == invite.token_hash) & same).execute()
        invite = DeveloperInvite.get_by_id(invite.token_hash)
    invite.developer  # noqa: B018  (loaded here, off the IOLoop, for the page)
    return invite


def invite_totp_secret(runtime, invite: DeveloperInvite) -> str | None:
    """The TOTP secret the invitation page offers (`open_invite` made one)."""
    return open_totp(runtime, invite.developer_id, invite.totp_secret)


def totp_step(runtime, secret: str | None, code: str | None) -> int | None:
    """The time step whose authenticator code (spaces ignored) for `secret` is `code`: now, or one
    step either side (clock drift); None when it matches none of them. Compared as UTF-8 bytes:
    `compare_digest` raises on non-ASCII text, and a form may carry any."""
    if not secret:
        return None
    presented = (code or "").replace(" ", "").encode("utf-8", "surrogatepass")
    totp = pyotp.TOTP(secret)
    now = runtime.clock.time()
    for offset in (0, -1, 1):
        at = now + offset * totp.interval
        if hmac.compare_digest(totp.at(at).encode("ascii"), presented):
            return totp.timecode(dt.datetime.fromtimestamp(at, dt.timezone.utc))
    return None


def totp_uri(secret: str, email: str) -> str:
    return pyotp.TOTP(secret).provisioning_uri(name=email, issuer_name="svc-auth console")


def accept_invite(runtime, token: str, password: str, confirm: str, totp_code: str = "") -> Developer:
    """Set the password (and the TOTP factor when a code is given); the link then stops working."""
    invite = open_invite(runtime, token)
    if invite.developer.password_hash:
        # A later invitation only grants another application; it never resets a password.
        raise ApiError(409, "account_exists", "You already have a password: sign in with it.")
    errors = {}
    password = password or ""
    if len(password) < PASSWORD_MIN:
        errors["password"] = f"The password must have at least {PASSWORD_MIN} characters."
    elif len(password) > PASSWORD_MAX:
        errors["password"] = f"The password must have at most {PASSWORD_MAX} characters."
    elif password != (confirm or ""):
        errors["confirm"] = "The two passwords differ."
    totp_code = (totp_code or "").replace(" ", "")
    totp_accepted = totp_step(runtime, invite_totp_secret(runtime, invite), totp_code) if totp_code else None
    if totp_code and totp_accepted is None:
        errors["totp_code"] = "This code does not match the authenticator key; check the device's clock."
    if errors:
        raise FieldErrors(errors)
    now = runtime.clock.now()
    with runtime.db.atomic():
        used = (DeveloperInvite.update(used_at=now)
                .where((DeveloperInvite.token_hash == invite.token_hash) & DeveloperInvite.used_at.is_null()).execute())
        if not used:  # another request used the link first
            raise ApiError(404, "invitation_not_found", "This invitation link has already been used.")
        fields = {"password_hash": _HASHER.hash(password), "activated_at": now}
        if totp_code:
            fields["totp_secret"] = invite.totp_secret  # sealed for this developer already
            fields["totp_last_step"] = totp_accepted  # the code that set up the factor is spent
        Developer.update(**fields).where(Developer.id == invite.developer_id).execute()
        AuditEvent.record(f"developer:{invite.developer.email}", "developer.password_set", invite.application_id,
                          totp=bool(totp_code))
    return Developer.get_by_id(invite.developer_id)


# -- sign-in and sessions -------------------------------------------------------------------

def check_credentials(runtime, email: str, password: str, totp_code: str = "") -> Developer | None:
    """The developer when email, password (and TOTP code, if they set one) are right, else None."""
    developer = Developer.get_or_none(Developer.email == normal_email(email))
    stored = developer.password_hash if developer is not None and developer.password_hash else None
    try:
        _HASHER.verify(stored or _DUMMY_HASH, password or "")
    except (argon2.exceptions.VerificationError, argon2.exceptions.InvalidHashError):
        return None
    if stored is None:
        return None
    if developer.totp_secret:
        step = totp_step(runtime, open_totp(runtime, developer.id, developer.totp_secret), totp_code)
        if step is None:
            return None
        # Each code is good once, also across processes: only a newer step than the last one
        # accepted moves the mark (RFC 6238 5.2: a verifier must not accept a code twice).
        accepted = (Developer.update(totp_last_step=step)
                    .where((Developer.id == developer.id)
                           & (Developer.totp_last_step.is_null() | (Developer.totp_last_step < step))).execute())
        if not accepted:
            return None
    if _HASHER.check_needs_rehash(stored):
        Developer.update(password_hash=_HASHER.hash(password)).where(Developer.id == developer.id).execute()
    return developer


def start_console_session(runtime, developer: Developer) -> str:
    """A new session; returns the cookie value (stored only hashed)."""
    token = new_secret()
    now = runtime.clock.now()
    ConsoleSession.create(token_hash=runtime.hasher.digest(token), key_id=runtime.hasher.key_id, developer=developer.id, created_at=now,
                          last_seen_at=now)
    return token


def session_developer(runtime, token: str | None) -> Developer | None:
    """The developer of a live session, touching it; None (the session deleted) when unknown, idle
    too long, or signed in longer ago than SVC_CONSOLE_SESSION_LIFETIME, however recently used."""
    if not token:
        return None
    now = runtime.clock.now()
    session = (ConsoleSession.select(ConsoleSession, Developer).join(Developer)
               .where(ConsoleSession.token_hash.in_(runtime.hasher.digests(token))).first())
    if session is None:
        return None
    digest = session.token_hash  # made under the current SVC_HMAC_KEY or a previous one
    if session.ended(runtime.settings, now):
        ConsoleSession.delete().where(ConsoleSession.token_hash == digest).execute()
        return None
    ConsoleSession.update(last_seen_at=now).where(ConsoleSession.token_hash == digest).execute()
    return session.developer


def session_csrf_token(runtime, token: str) -> str:
    """The CSRF token of the session whose cookie value is `token` (the synchronizer-token
    pattern): a MAC of it under SVC_HMAC_KEY. Only the server and the pages it serves that session
    know it; no cookie anyone else can set, and no other session, makes it."""
    return runtime.hasher.sign(CSRF_LABEL + token)


def session_csrf_valid(runtime, token: str, presented: str | None) -> bool:
    """True when `presented` is the CSRF token of session `token` under the current or a previous
    SVC_HMAC_KEY (a page served before a rotation still posts). Compared in constant time."""
    return bool(token) and bool(presented) and runtime.hasher.verify(CSRF_LABEL + token, presented)


def end_console_session(runtime, token: str | None) -> None:
    if token:
        ConsoleSession.delete().where(ConsoleSession.token_hash.in_(runtime.hasher.digests(token))).execute()


# -- access ---------------------------------------------------------------------------------------

def applications_of(developer: Developer) -> list[Application]:
    return list(Application.select().join(DeveloperAccess, on=(DeveloperAccess.application == Application.id))
                .where(DeveloperAccess.developer == developer.id).order_by(Application.name, Application.id))


def developer_application(developer: Developer, application_id: str) -> Application:
    """The application if this developer was invited to it; any other id is 404 (never 403, so
    the console does not reveal which ids exist)."""
    app = (Application.select().join(DeveloperAccess, on=(DeveloperAccess.application == Application.id))
           .where((DeveloperAccess.developer == developer.id) & (Application.id == application_id)).first()
           if is_id(application_id) else None)
    if app is None:
        raise ApiError(404, "application_not_found", "No application of yours has this id.")
    return app


__all__ = ("FieldErrors", "accept_invite", "actor_of", "applications_of", "check_credentials",
           "developer_application", "end_console_session", "invite_developer", "open_invite", "session_csrf_token",
           "session_csrf_valid", "session_developer", "SignedIn", "sign_in", "start_console_session", "totp_uri")


class SignedIn(NamedTuple):
    """A successful sign-in: the session cookie's value and the browser's new device cookie's."""
    session: str
    device: str


def signin_subject(email: str) -> tuple:
    """The throttle subject of an account: hashed, so no e-mail address is written to Redis."""
    return ("account", hashlib.sha256(normal_email(email).encode()).hexdigest()[:32])


def sign_in(runtime, email: str, password: str, totp_code: str, address: str,
            device_cookies: tuple[str, ...] = ()) -> SignedIn:
    """A session for right credentials, and a new device cookie for the browser (`console.devices`;
    `device_cookies`: every value of it the browser sent). Failures go to
    `runtime.console_signin_throttle` through `ratelimit.lockout`, checked before the password. From
    a trusted device (a valid device cookie of this account) only that device's own count refuses
    it: past the limit it gets 429, whatever the account's and the address's counts (its failures
    count there too, so untrusted browsers are refused as if it had none). Otherwise, past the limit
    per account, per source address or per pair: 429 with Retry-After, the password unchecked (a
    locked account refuses even the right one to untrusted browsers)."""
    throttle = runtime.console_signin_throttle
    device = trusted_device(runtime, email, device_cookies)
    subject = device or signin_subject(email)
    # Counted as a failure as it is admitted, taken back if the password is right: sign-ins whose
    # password hashes overlap (one process or several) cannot pass the limit together.
    attempt = throttle_attempt(throttle, subject, None if device else address, too_many="Too many failed sign-ins")
    try:
        developer = check_credentials(runtime, email, password, totp_code)
    except BaseException:
        with contextlib.suppress(RateLimiterUnavailable):
            throttle_withdraw(throttle, attempt)  # not answered: no failure
        raise
    if developer is None:
        throttle_failed(throttle, attempt, subject, address)  # a device's: its own, which alone can refuse it ...
        if device:
            # ... and the account's and address's, which refuse untrusted browsers (CONTRACTS.md: 5
            # failures of one account lock it, per account and per source address, wherever they came from)
            throttle_failure(throttle, signin_subject(email), address)
        raise ApiError(401, "invalid_credentials", "The e-mail address, password or authentication code is wrong.")
    throttle_withdraw(throttle, attempt)
    return SignedIn(start_console_session(runtime, developer), issue_device_cookie(runtime, developer.email))
