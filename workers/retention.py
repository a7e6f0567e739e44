"""Retention: the short-lived rows of sign-in and authorization are deleted once nothing can need them.

Once a day (the first scheduler tick of each UTC day claims it, like the nightly sync: one scheduler
runs it however many there are; `serve` runs it too when it embeds the scheduler), `sweep_retention`
deletes, in batches:

- refresh tokens of a grant that ended (revoked, or expired) more than `margin` ago (a day plus the
  access-token lifetime), except one whose access token a disclosure record names (docs/audit.md:
  the record's `jti` leads to its grant and launch while the record is kept); then the grant, once
  no token of it is left. A live grant keeps every token, spent ones included: presenting a spent
  one is a replay and revokes the grant (`oauth.smart_grants.rotate`);
- an authorization code expired more than `margin` ago that was never exchanged, or was exchanged
  more than `margin` ago and started no grant that still has tokens (a replayed code revokes its
  grant through that grant's first token: `oauth.authorization_code`), unless a disclosure record
  names the access token it issued;
- a launch spent or expired more than `margin` ago that no kept code came from, unless it is the
  newest launch of its app and user (the partner API's `last_launch_at`);
- sign-in links, invitations and console invitations expired more than `LINKS_KEPT` ago (until
  then a late click is told "expired" or "used", not "unknown");
- chart requests that ended: `expired` (their archive deleted by the recovery sweep) more than
  `LINKS_KEPT` ago, or `failed` more than `LINKS_KEPT` ago (until then the partner API still says
  which, and after it the request is unknown: 404);
- the schedulers' claims of a day (`ScheduledRun`: the night, the sweep, a clinic's failed sync)
  for a day more than `LINKS_KEPT` ago (the recovery sweep reads yesterday's and today's only);
- hub sessions expired more than `margin` plus SVC_SANDBOX_TOKEN_TTL ago (a sandbox token made in a
  session outlives it, and an online grant started with it must find it ended: `_hub_session`),
  and console sessions over (idle past SVC_CONSOLE_IDLE_TIMEOUT, or past SVC_CONSOLE_SESSION_LIFETIME
  since their sign-in: `ConsoleSession.live_at`) more than `margin` ago.

Disclosure records and configuration audit events are never deleted here (`svc-auth audit prune`
alone removes disclosure records, past their retention). See docs/operations.md, "Retention".
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import socket
from dataclasses import dataclass

import peewee

from models.charts import ChartRequest
from models.developers import ConsoleSession, DeveloperInvite
from models.disclosures import DisclosureRecord
from models.grants import AuthorizationCode, Launch
from models.invitations import Invitation
from models.refresh import RefreshToken, SmartGrant
from models.sandbox import SandboxSession, SandboxSigninLink
from models.schedule import ScheduledRun

log = logging.getLogger("svc_auth.retention")

JOB = "retention"
MARGIN = dt.timedelta(days=1)  # past any replay window, the hosts' clock skew and a retried request
LINKS_KEPT = dt.timedelta(days=30)
BATCH = 2000  # rows per DELETE: a short transaction, so requests never wait long on the table


def margin(settings) -> dt.timedelta:
    return MARGIN + dt.timedelta(seconds=settings.access_token_ttl)


def _named_by_a_record(jti_column):
    return peewee.fn.EXISTS(DisclosureRecord.select(DisclosureRecord.seq).where(DisclosureRecord.jti == jti_column))


def _refresh_tokens(settings, now):
    cut = now - margin(settings)
    ended = SmartGrant.select(SmartGrant.id).where((SmartGrant.revoked_at < cut) | (SmartGrant.expires_at < cut))
    return RefreshToken.grant.in_(ended) & ~_named_by_a_record(RefreshToken.access_jti)


def _grants(settings, now):
    cut = now - margin(settings)
    tokens = RefreshToken.select(RefreshToken.token_hash).where(RefreshToken.grant == SmartGrant.id)
    return ((SmartGrant.revoked_at < cut) | (SmartGrant.expires_at < cut)) & ~peewee.fn.EXISTS(tokens)


def _codes(settings, now):
    cut = now - margin(settings)
    # The exchange notes the one jti it issued (`AuthorizationCode.redeem`); the grant it started
    # has it as its first token's `access_jti` (`oauth.smart_grants.start_grant`).
    grant_tokens = RefreshToken.select(RefreshToken.token_hash).where(
        RefreshToken.access_jti == AuthorizationCode.issued_jtis)
    spent = ((AuthorizationCode.used_at < cut) & ~peewee.fn.EXISTS(grant_tokens)
             & ~_named_by_a_record(AuthorizationCode.issued_jtis))
    return (AuthorizationCode.expires_at < cut) & (AuthorizationCode.used_at.is_null() | spent)


def _launches(settings, now):
    cut = now - margin(settings)
    codes = AuthorizationCode.select(AuthorizationCode.code_hash).where(AuthorizationCode.launch == Launch.id)
    newer = Launch.alias("newer")
    later = newer.select(newer.id).where((newer.application == Launch.application) & (newer.user == Launch.user)
                                         & (newer.created_at > Launch.created_at))
    return (((Launch.used_at < cut) | (Launch.expires_at < cut))
            & ~peewee.fn.EXISTS(codes) & peewee.fn.EXISTS(later))


def _expired_links(model):
    return lambda settings, now: model.expires_at < now - LINKS_KEPT


def _ended_charts(settings, now):
    """Ended requests past the cut, but never one that still names its archive (its delete is the
    recovery sweep's: `workers.recovery.discard_archives`)."""
    cut = now - LINKS_KEPT
    expired = (ChartRequest.status == "expired") & (ChartRequest.ready_at < cut - dt.timedelta(seconds=settings.chart_ttl))
    return (expired | ((ChartRequest.status == "failed") & (ChartRequest.created_at < cut))) \
        & ChartRequest.object_key.is_null()


def _old_claims(settings, now):
    return ScheduledRun.run_date < (now - LINKS_KEPT).date()


def _hub_sessions(settings, now):
    return SandboxSession.expires_at < now - margin(settings) - dt.timedelta(seconds=settings.sandbox_token_ttl)


def _console_sessions(settings, now):
    return ~ConsoleSession.live_at(settings, now - margin(settings))


@dataclass(frozen=True)
class Rule:
    """One kind of row: its table, and which of its rows can no longer matter at `now`."""

    name: str
    model: type
    condition: object  # (settings, now) -> a Peewee expression on `model`


# In this order: a grant's tokens before the grant, the grants' before the codes, the codes before their launches.
RULES = (
    Rule("refresh_tokens", RefreshToken, _refresh_tokens),
    Rule("grants", SmartGrant, _grants),
    Rule("authorization_codes", AuthorizationCode, _codes),
    Rule("launches", Launch, _launches),
    Rule("sandbox_signin_links", SandboxSigninLink, _expired_links(SandboxSigninLink)),
    Rule("invitations", Invitation, _expired_links(Invitation)),
    Rule("developer_invites", DeveloperInvite, _expired_links(DeveloperInvite)),
    Rule("chart_requests", ChartRequest, _ended_charts),
    Rule("scheduled_runs", ScheduledRun, _old_claims),
    Rule("sandbox_sessions", SandboxSession, _hub_sessions),
    Rule("console_sessions", ConsoleSession, _console_sessions),
)


def _delete(runtime, rule: Rule, now: dt.datetime) -> int:
    """Delete the rule's rows, `BATCH` at a time (each batch its own statement)."""
    key = rule.model._meta.primary_key
    removed = 0
    while True:
        keys = [k for (k,) in rule.model.select(key).where(rule.condition(runtime.settings, now)).limit(BATCH).tuples()]
        if keys:
            removed += rule.model.delete().where(key.in_(keys)).execute()
        if len(keys) < BATCH:
            return removed


def sweep_retention(runtime) -> dict:
    """Delete what no flow, replay detection or audit can need any more; {rule name: rows removed}."""
    now = runtime.clock.now()
    removed = {rule.name: _delete(runtime, rule, now) for rule in RULES}
    if any(removed.values()):
        log.info("retention: removed %s", ", ".join(f"{n} {name}" for name, n in removed.items() if n))
    return removed


def retention_due(runtime) -> dict | None:
    """Sweep if no scheduler did yet today (UTC); returns what was removed, or None."""
    today = runtime.clock.now().date()
    if not ScheduledRun.claim(JOB, today, f"{socket.gethostname()}:{os.getpid()}", runtime.clock.now()):
        return None
    try:
        return sweep_retention(runtime)
    except Exception:
        # Give the day back so this or another scheduler sweeps on its next tick.
        ScheduledRun.delete().where((ScheduledRun.job == JOB) & (ScheduledRun.run_date == today)).execute()
        raise
