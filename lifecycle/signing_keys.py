"""Signing-key rotation as a state change: the keyring rotates, the audit trail records it, every
process and host hears of it.

Every rotation path (the CLI today, anything else tomorrow) goes through `rotate_signing_key`, so
none can rotate without an audit record and a change announcement.
"""
from __future__ import annotations

from keys.signing import TOPIC
from models.audit import AuditEvent


def rotate_signing_key(runtime, actor: str = "operator"):
    """Add a signing key, published at once, signing after SVC_KEY_PREPUBLISH_SECONDS; old keys stay
    published until their tokens expire. Returns the new key."""
    previous = runtime.keyring.active.kid
    key = runtime.keyring.rotate()
    AuditEvent.record(actor, "keys.rotated", key.kid, previous_kid=previous, signs_from=key.not_before)
    runtime.changes.announce(TOPIC)
    return key
