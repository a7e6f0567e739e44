"""SMART refresh-token grants (SMART App Launch 2.2 "Refresh access token", RFC 9700 4.14.2): start
one at the code exchange, rotate its refresh token on every use, revoke it, list it.

- A grant is started when the code's granted scope has `offline_access` or `online_access`
  (`oauth.scopes.refresh_access`). Its lifetime is absolute from the code exchange, not sliding:
  `offline` = the app's `offline_access_ttl`, else SVC_OFFLINE_ACCESS_TTL (90 days); `online` =
  SVC_ONLINE_ACCESS_TTL, and never longer than the hub session the launch came from (the session
  whose sign-in is the launch's `auth_time`): when that session ends (sign-out) or expires, so
  does the grant, and a launch made after it ended (its sandbox token lives on) starts a grant
  already over. A launch made without a hub session (a script's sandbox token) is bounded by
  SVC_ONLINE_ACCESS_TTL alone.
- A refresh token is 256 random bits, stored only as its keyed hash (`runtime.hasher`), found by
  that hash and confirmed with a constant-time compare. Each use spends it (one conditional UPDATE:
  exactly one of two racing uses wins) and issues the next. Presenting a spent one is a replay:
  the whole grant is revoked.
- A refresh is answered only while the app still declares the grant's `offline_access` or
  `online_access` (`--smart-scopes`): once it no longer does, the next refresh ends the grant
  (`invalid_grant`; declaring it again revives nothing).
- Revoking a grant (replay, RFC 7009, `svc-auth grants revoke`, the installation `Disabled`, its
  refresh scope no longer declared) marks it revoked and puts the jtis of its access tokens that
  may still be live (issued within the access-token lifetime) on the deny-list, so they stop at
  once everywhere (FHIR API included) at no cost to the bearer path. Deleting the app, the user or
  the installation deletes the grant (foreign keys); their access tokens are already refused by the
  bearer gate.
"""
from __future__ import annotations

import datetime as dt

import peewee

from models.clock import utc_iso
from models.directory import User
from models.grants import AuthorizationCode
from models.ids import new_secret
from models.refresh import RefreshToken, SmartGrant
from models.sandbox import SandboxSession
from oauth.errors import invalid_grant
from oauth.scopes import OFFLINE_ACCESS, ONLINE_ACCESS, InvalidScope
from oauth import smart_scopes

REPLAYED = "The refresh token was already used; every token of its grant is revoked (RFC 9700 4.14.2)."
INVALID = "The refresh token is invalid, expired or revoked."
CODE_REPLAYED = "The authorization code was already used; tokens issued from it are revoked."


def _seconds_after(moment: dt.datetime, seconds: int) -> dt.datetime:
    return moment + dt.timedelta(seconds=seconds)


def _hub_session(runtime, user_id: str, auth_time: int | None) -> SandboxSession | None:
    """The hub session the launch came from: the user's, signed in at `auth_time` (the sandbox token
    of a hub session carries its sign-in time, truncated to the second); a live one first, else one
    that has ended or expired (its sandbox token outlives it: the grant is then over at once)."""
    if auth_time is None:
        return None
    start = dt.datetime.fromtimestamp(auth_time, dt.timezone.utc).replace(tzinfo=None)
    now = runtime.clock.now()
    sessions = SandboxSession.select().where(
        (SandboxSession.user == user_id) & (SandboxSession.signed_in_at >= start)
        & (SandboxSession.signed_in_at < _seconds_after(start, 1))).order_by(SandboxSession.expires_at.desc())
    return max(sessions, key=lambda s: s.ended_at is None and s.expires_at > now, default=None)


def _new_token(runtime, grant_id: str, access_jti: str, now: dt.datetime) -> str:
    token = new_secret(32)
    RefreshToken.create(token_hash=runtime.hasher.digest(token), key_id=runtime.hasher.key_id, grant=grant_id, access_jti=access_jti, created_at=now)
    return token


def start_grant(runtime, app, redemption, access: str, context: dict, fhir_user: str | None, jti: str) -> str:
    """A new grant for a redeemed code whose scope has `offline_access` or `online_access` (`access`);
    returns its first refresh token (the access token `jti` was issued with it)."""
    now = runtime.clock.now()
    settings = runtime.settings
    session = None
    if access == "offline":
        expires_at = _seconds_after(now, app.offline_access_ttl or settings.offline_access_ttl)
    else:
        expires_at = _seconds_after(now, settings.online_access_ttl)
        session = _hub_session(runtime, redemption.user.id, redemption.auth_time)
        if session is not None:
            expires_at = min(expires_at, session.expires_at)
    stored_context = dict(context, **({"fhirUser": fhir_user} if fhir_user else {}))
    with runtime.db.atomic():
        # The code's row, locked: a replay of the code (`AuthorizationCode.redeem`) either came first
        # and marked it (no grant then), or waits for this grant to commit and then revokes it.
        code = _locked(runtime, AuthorizationCode.select(AuthorizationCode.replayed_at).where(
            AuthorizationCode.code_hash == redemption.code_hash)).first()
        if code is None or code.replayed_at is not None:
            raise invalid_grant(CODE_REPLAYED)
        grant = SmartGrant.create(
            application=app.id, client_id=app.client_id, user=redemption.user.id,
            organization=redemption.organization_id,
            installation=redemption.installation.id if redemption.installation else None,
            launch_id=redemption.launch_id, scope=redemption.scope, access=access, context=stored_context,
            auth_time=redemption.auth_time, session_hash=session.session_hash if session else None,
            created_at=now, expires_at=expires_at)
        return _new_token(runtime, grant.id, jti, now)


def _token_row(runtime, token: str) -> RefreshToken | None:
    """The refresh token row (with its grant) of this token value, or None."""
    if not isinstance(token, str) or not token or "." in token:
        return None
    row = (RefreshToken.select(RefreshToken, SmartGrant).join(SmartGrant)  # under SVC_HMAC_KEY or a previous key
           .where(RefreshToken.token_hash.in_(runtime.hasher.digests(token))).first())
    return row if row is not None and runtime.hasher.matches(token, row.token_hash) else None


def _live(runtime, grant: SmartGrant) -> bool:
    """Not revoked, not expired and, for an online grant, its hub session still live."""
    now = runtime.clock.now()
    if grant.revoked_at is not None or grant.expires_at <= now:
        return False
    if grant.access == "online" and grant.session_hash is not None:
        session = SandboxSession.get_or_none(SandboxSession.session_hash == grant.session_hash)
        return session is not None and session.ended_at is None and session.expires_at > now
    return True


def narrowed_scope(requested: str | None, granted: str) -> str:
    """The scope of a refreshed access token: the grant's, or `requested` when it is the same or
    narrower (every name granted, or a resource scope a granted one covers); else InvalidScope."""
    if requested is None:
        return granted
    granted_names = granted.split()
    covering = smart_scopes.resource_scopes(granted)
    kept = []
    for name in requested.split():
        if name not in granted_names:
            asked = smart_scopes.parse_or_none(name)
            if asked is None or str(asked) not in {str(s) for s in smart_scopes.grant([asked], covering)}:
                raise InvalidScope(f"{name!r} was not granted: a refresh may narrow the scope, never widen it.")
        kept.append(name)
    if not kept:
        raise InvalidScope("The scope parameter names no scope.")
    return " ".join(dict.fromkeys(kept))


def refresh_scope_name(grant: SmartGrant) -> str:
    """The scope the grant's refresh tokens rest on: `offline_access` or `online_access`, which the
    app must still declare (`Application.smart_scopes`) for a refresh to be answered."""
    return OFFLINE_ACCESS if grant.access == "offline" else ONLINE_ACCESS


def still_declared(app, grant: SmartGrant) -> bool:
    """Does `app` still declare the scope `grant` rests on (`refresh_scope_name`)?"""
    return refresh_scope_name(grant) in (app.smart_scopes or "").split()


def _locked(runtime, query):
    """`query` (a SELECT) holding the rows it reads until the transaction ends: FOR UPDATE on
    PostgreSQL; on SQLite every transaction already holds the write lock (BEGIN IMMEDIATE)."""
    return query if isinstance(runtime.db, peewee.SqliteDatabase) else query.for_update()


def rotate(runtime, app, token: str, requested_scope: str | None, jti: str) -> tuple[SmartGrant, str, str]:
    """Spend `token` (a refresh token of `app`'s) and issue the next: (grant, new refresh token,
    the access token's scope). invalid_grant for an unknown, another client's, expired or revoked
    token; a spent one revokes its grant first.

    Revocation wins every race: the grant's row is locked, and its liveness read, in the
    transaction that spends the token and records the next access token's jti. A revocation
    (`revoke_grants`) locks the same row first, so it either commits before (this refresh then
    sees the grant revoked) or after (it then denies the jti this refresh issued)."""
    row = _token_row(runtime, token)
    if row is None or row.grant.application_id != app.id:
        raise invalid_grant(INVALID)
    if not _live(runtime, row.grant):
        raise invalid_grant(INVALID)
    if not still_declared(app, row.grant):  # its basis is gone: the grant ends
        revoke_grants(runtime, SmartGrant.id == row.grant_id, "refresh_scope_undeclared")
        raise invalid_grant(f"The grant has ended: the application no longer declares "
                            f"{refresh_scope_name(row.grant)}.")
    scope = narrowed_scope(requested_scope, row.grant.scope)  # before spending: a refused scope keeps the token
    with runtime.db.atomic():
        grant = _locked(runtime, SmartGrant.select().where(SmartGrant.id == row.grant_id)).first()
        if grant is None or not _live(runtime, grant):
            raise invalid_grant(INVALID)
        now = runtime.clock.now()
        spent = (RefreshToken.update(spent_at=now)
                 .where((RefreshToken.token_hash == row.token_hash) & RefreshToken.spent_at.is_null()).execute())
        if spent == 1:
            return grant, _new_token(runtime, grant.id, jti, now), scope
    revoke_grants(runtime, SmartGrant.id == grant.id, "refresh_token_replayed")
    raise invalid_grant(REPLAYED)


def grant_user(grant: SmartGrant) -> User | None:
    return User.get_or_none(User.id == grant.user_id)


def revoke_grants(runtime, condition, reason: str) -> int:
    """Revoke every live grant matching `condition` (a Peewee expression on SmartGrant) and deny
    the access tokens they issued that may still be live; returns how many grants. The grants'
    rows are locked before their tokens are read (`rotate` locks them too): a refresh that
    committed first has its access token's jti read here and denied."""
    ttl = runtime.settings.access_token_ttl
    with runtime.db.atomic():
        ids = [g.id for g in _locked(runtime, SmartGrant.select(SmartGrant.id).where(
            condition & SmartGrant.revoked_at.is_null()).order_by(SmartGrant.id))]
        if not ids:
            return 0
        now = runtime.clock.now()
        jtis = [r.access_jti for r in RefreshToken.select(RefreshToken.access_jti).where(
            RefreshToken.grant.in_(ids) & (RefreshToken.created_at >= _seconds_after(now, -ttl - 1)))]
        # First the deny-list: if it cannot be reached (503), nothing is marked revoked.
        runtime.denylist.deny(jtis, until=runtime.clock.time() + ttl + 1)
        SmartGrant.update(revoked_at=now, revoked_reason=reason).where(SmartGrant.id.in_(ids)).execute()
    return len(ids)


def revoke_by_token(runtime, app, token: str) -> bool:
    """RFC 7009: a refresh token of `app`'s (spent or not) ends its grant; anything else changes nothing."""
    row = _token_row(runtime, token)
    if row is None or row.grant.application_id != app.id:
        return False
    revoke_grants(runtime, SmartGrant.id == row.grant_id, "revoked_by_client")
    return True


def revoke_grants_of_jtis(runtime, jtis, reason: str) -> int:
    """Revoke the grants whose tokens were issued with these access-token jtis (a replayed code)."""
    jtis = [j for j in jtis if j]
    if not jtis:
        return 0
    started = RefreshToken.select(RefreshToken.grant).where(RefreshToken.access_jti.in_(jtis))
    return revoke_grants(runtime, SmartGrant.id.in_(started), reason)


def introspected(runtime, app, token: str) -> dict | None:
    """RFC 7662 for a refresh token of `app`'s: the claims of a live, unspent one, else None."""
    row = _token_row(runtime, token)
    if (row is None or row.grant.application_id != app.id or row.spent_at is not None or not _live(runtime, row.grant)
            or not still_declared(app, row.grant)):  # a refresh would end it
        return None
    grant = row.grant
    return {"active": True, "client_id": grant.client_id, "scope": grant.scope, "sub": grant.user_id,
            "exp": int(grant.expires_at.replace(tzinfo=dt.timezone.utc).timestamp()),
            "iat": int(row.created_at.replace(tzinfo=dt.timezone.utc).timestamp()),
            "token_type": "refresh_token", "svc_organization_id": grant.organization_id}


def live_condition(runtime):
    """Grants not revoked and not expired (an online grant's ended hub session is seen at use)."""
    return SmartGrant.revoked_at.is_null() & (SmartGrant.expires_at > runtime.clock.now())


def grant_dict(grant: SmartGrant) -> dict:
    """A grant as `svc-auth grants list --json` and the console show it (CONTRACTS)."""
    return {"grant_id": grant.id, "application_id": grant.application_id, "client_id": grant.client_id,
            "user_id": grant.user_id, "organization_id": grant.organization_id, "scope": grant.scope,
            "access": grant.access, "created_at": utc_iso(grant.created_at), "expires_at": utc_iso(grant.expires_at)}


def list_grants(runtime, application_id: str | None = None, user_id: str | None = None,
                organization_id: str | None = None) -> list[SmartGrant]:
    """Live grants, oldest first, optionally of one app, user and/or clinic."""
    condition = live_condition(runtime)
    for field, value in ((SmartGrant.application, application_id), (SmartGrant.user, user_id),
                         (SmartGrant.organization, organization_id)):
        if value is not None:
            condition &= field == value
    return list(SmartGrant.select().where(condition).order_by(SmartGrant.created_at, SmartGrant.id))


