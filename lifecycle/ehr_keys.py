"""Rotation of svc-auth's EHR client key (SMART Backend Services) as a state change: the key set
changes and the audit trail records it. Every path goes through here (the CLI today).

`rotate_ehr_key` adds a key that signs from now on; the previous keys stay in `/ehr/jwks.json` for
SVC_EHR_KEY_OVERLAP_SECONDS, then are deleted (keys.ehr_client). `finish_ehr_key_rotation` deletes
them at once (after a leak, or once every EHR has fetched the new JWKS). No process caches the key
(`EhrClientKeys.current` reads it per token), so there is nothing to announce.
"""
from __future__ import annotations

import datetime as dt

from models.audit import AuditEvent


def _when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def ehr_key_state(runtime) -> dict:
    keys = runtime.ehr_keys
    published = [k["kid"] for k in keys.jwks()["keys"]]
    return {"signing_kid": published[0], "published": published, "overlap_seconds": keys.overlap_seconds}


def rotate_ehr_key(runtime, actor: str = "operator") -> dict:
    """Add an EHR client key that signs from now on; older keys stay published for the overlap."""
    keys = runtime.ehr_keys
    dropped = keys.prune(keys.expired(), reason="overlap over")   # before `current` prunes them unsaid
    previous = keys.current()[0]
    kid = keys.add()
    until = _when(keys.created(kid) + keys.overlap_seconds)       # as `/ehr/jwks.json` keeps `previous`
    AuditEvent.record(actor, "ehr.key_rotated", kid, previous_kid=previous, previous_published_until=until,
                      dropped=dropped)
    return {"kid": kid, "previous_kid": previous, "previous_published_until": until, "dropped": dropped,
            **ehr_key_state(runtime)}


def finish_ehr_key_rotation(runtime, actor: str = "operator") -> dict:
    """Delete every EHR client key but the newest now: only the newest stays in /ehr/jwks.json."""
    keys = runtime.ehr_keys
    keys.current()  # the first key, when there is none yet
    dropped = keys.drop_all_but_newest(actor)
    AuditEvent.record(actor, "ehr.key_rotation_finished", keys.current()[0], dropped=dropped)
    return {"dropped": dropped, **ehr_key_state(runtime)}
