"""Every stored secret SVC_HMAC_KEY made, by the key that made it: what `keys rekey` counts as
still needing an old key, and what `serve` refuses to lose at start.

Each row of a keyed hash notes the id of the key that made it (`key_id`, `keys.secrets.key_id`);
what cannot be re-made without the secret (a refresh token, a session, an invitation link) is
re-made under the current key on its next use (a refresh token's rotation), or ends. A row with no
key id was made before release 45's migration, under a key nobody noted: while a previous key is
configured it counts as old. Sealed keys and the chain's links say which key made them by which
key opens or verifies them (`keys.rekey`). Signed local URLs are not stored: they expire within
SVC_PRESIGNED_URL_TTL and are re-made on request.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import peewee

from conf import ConfigError
from keys import totp
from models.application import Application
from models.developers import ConsoleSession, DeveloperInvite
from models.grants import AuthorizationCode
from models.invitations import Invitation
from models.refresh import RefreshToken, SmartGrant
from models.sandbox import SandboxSession, SandboxSigninLink


@dataclass(frozen=True)
class Kind:
    """One kind of stored keyed hash: its name in `still_old`, and what stops working without its key."""

    name: str
    stops: str
    rows: object  # (runtime, now) -> a query of its live rows (select of the key id column)


def _refresh_tokens(runtime, now):
    return (RefreshToken.select(RefreshToken.key_id).join(SmartGrant)
            .where(RefreshToken.spent_at.is_null() & SmartGrant.revoked_at.is_null() & (SmartGrant.expires_at > now)))


def _unused(model, now):
    return model.select(model.key_id).where(model.used_at.is_null() & (model.expires_at > now))


def _console_sessions(runtime, now):
    return ConsoleSession.select(ConsoleSession.key_id).where(ConsoleSession.live_at(runtime.settings, now))


def _sandbox_sessions(runtime, now):
    return SandboxSession.select(SandboxSession.key_id).where(
        SandboxSession.ended_at.is_null() & (SandboxSession.expires_at > now))


KINDS = (
    Kind("refresh_tokens", "their apps' refresh tokens (offline and online grants) answer invalid_grant",
         _refresh_tokens),
    Kind("authorization_codes", "codes not yet exchanged answer invalid_grant",
         lambda runtime, now: _unused(AuthorizationCode, now)),
    Kind("invitations", "invitation links not yet opened stop working", lambda runtime, now: _unused(Invitation, now)),
    Kind("developer_invites", "console invitation links not yet opened stop working",
         lambda runtime, now: _unused(DeveloperInvite, now)),
    Kind("console_sessions", "developers signed in to the console are signed out", _console_sessions),
    Kind("sandbox_sessions", "sandbox hub sessions end (and online_access grants with them)", _sandbox_sessions),
    Kind("sandbox_signin_links", "sandbox sign-in links not yet used stop working",
         lambda runtime, now: _unused(SandboxSigninLink, now)),
)


def old_client_secrets(hasher) -> int:
    """Confidential applications whose current or pending secret hash the current key is not known
    to have made (0 when no previous key is configured: nothing else can verify them)."""
    if not hasher.rotating:
        return 0
    return Application.select().where(_secret_not_under(hasher.key_id)).count()


def _secret_not_under(key_id: str):
    current = ((Application.client_secret_hash != "") & (Application.public == False)  # noqa: E712
               & (Application.secret_key_id.is_null() | (Application.secret_key_id != key_id)))
    pending = (Application.fallback_secret_hash.is_null(False)
               & (Application.fallback_key_id.is_null() | (Application.fallback_key_id != key_id)))
    return current | pending


def still_old(runtime) -> dict[str, int]:
    """Live rows of each kind an earlier key made (or no key is noted for), while a previous key is
    configured; every count is 0 otherwise (then nothing but the current key verifies anything)."""
    hasher = runtime.hasher
    counts = {"client_secrets": old_client_secrets(hasher)}
    now = runtime.clock.now()
    for kind in KINDS:
        if not hasher.rotating:
            counts[kind.name] = 0
            continue
        query = kind.rows(runtime, now)
        column = query.model.key_id
        counts[kind.name] = query.where(column.is_null() | (column != hasher.key_id)).count()
    return counts


def orphaned(runtime) -> dict[str, dict[str, int]]:
    """Live rows made under a key this host does not have (its id noted, neither SVC_HMAC_KEY nor one
    of SVC_HMAC_KEY_PREVIOUS, nor let go in SVC_HMAC_KEY_RETIRED): {key id: {kind: count}}."""
    known = set(runtime.hasher.key_ids) | set(runtime.settings.hmac_key_retired)
    now = runtime.clock.now()
    found: dict[str, dict[str, int]] = {}
    for kind in KINDS:
        query = kind.rows(runtime, now)
        column = query.model.key_id
        for (key, count) in (query.select(column, peewee.fn.COUNT(peewee.SQL("*")))
                             .where(column.is_null(False) & column.not_in(list(known))).group_by(column).tuples()):
            found.setdefault(key, {})[kind.name] = count
    for field, hashed in ((Application.secret_key_id, Application.client_secret_hash != ""),
                          (Application.fallback_key_id, Application.fallback_secret_hash.is_null(False))):
        for (key, count) in (Application.select(field, peewee.fn.COUNT(peewee.SQL("*")))
                             .where(hashed & (Application.public == False) & field.is_null(False)  # noqa: E712
                                    & field.not_in(list(known))).group_by(field).tuples()):
            found.setdefault(key, {})
            found[key]["client_secrets"] = found[key].get("client_secrets", 0) + count
    return found


_STOPS = MappingProxyType({kind.name: kind.stops for kind in KINDS} | {
    "client_secrets": "their partners' client secrets answer invalid_client"})


CHAIN = "disclosure-chain"
"""What SVC_HMAC_KEY_RETIRED names to start although the chain's older links need a key not given."""


def unvouched_chain(runtime) -> int | None:
    """The seq of an old record of the disclosure chain that no key of this host verifies and no
    `keys rekey` under this host's SVC_HMAC_KEY vouched for (None: none found). A cheap look (the
    two oldest records, and the configuration audit), not a walk: `audit verify` is the walk."""
    from audit.chain import early_link
    from audit.disclosures import chain_keys
    from models.audit import AuditEvent
    if CHAIN in runtime.settings.hmac_key_retired:
        return None
    found = early_link(runtime.db, chain_keys(runtime))
    if found is None or found[1] is not None:
        return None
    for event in (AuditEvent.select().where((AuditEvent.action == "keys.rekeyed")
                                            & (AuditEvent.subject == runtime.hasher.key_id))):
        old = (event.detail or {}).get("still_old") if isinstance(event.detail, dict) else None
        if isinstance(old, dict) and old.get("audit_records") == 0:
            return None  # its reseal checkpoint vouches for what the old key linked
    return found[0]


def require_every_key(runtime) -> None:
    """At `serve`'s start: refuse (ConfigError, one line) when developers' sealed TOTP secrets open
    under no key of this host; when live secrets were made under a key this host was not given,
    naming the key id, the counts and what would stop working; or when the disclosure chain's
    older links need a key not given and no rekey vouched for them."""
    lost = 0 if totp.RETIRED in runtime.settings.hmac_key_retired else totp.unopened_totp_secrets(runtime)
    if lost:
        raise ConfigError(
            f"{lost} console TOTP secret(s) open under neither SVC_HMAC_KEY nor SVC_HMAC_KEY_PREVIOUS: those developers' "
            "sign-ins with a code would fail. Put the key that sealed them in SVC_HMAC_KEY_PREVIOUS (every host must use "
            f"the same SVC_HMAC_KEY), or set SVC_HMAC_KEY_RETIRED={totp.RETIRED} to start anyway")
    found = orphaned(runtime)
    if not found:
        seq = unvouched_chain(runtime)
        if seq is not None:
            raise ConfigError(
                f"SVC_HMAC_KEY_PREVIOUS lacks the key that linked the disclosure chain from seq {seq}, and no "
                "`svc-auth keys rekey` under this SVC_HMAC_KEY vouched for those records: without it `audit verify` "
                "fails from there. Put the old key back in SVC_HMAC_KEY_PREVIOUS and run `svc-auth keys rekey`, or "
                f"set SVC_HMAC_KEY_RETIRED={CHAIN} to start anyway")
        return
    key, counts = sorted(found.items())[0]
    what = "; ".join(f"{count} {name.replace('_', ' ')} ({_STOPS[name]})" for name, count in sorted(counts.items()))
    raise ConfigError(
        f"SVC_HMAC_KEY_PREVIOUS lacks the key with id {key}, which made live secrets: {what}. Put that key back in "
        "SVC_HMAC_KEY_PREVIOUS until `svc-auth keys rekey --json` reports nothing still_old, or set "
        f"SVC_HMAC_KEY_RETIRED={key} to let them stop working")
