"""Signing-key rotation as a state change: the keyring rotates, the audit trail records it.

Every rotation path (the CLI today, anything else tomorrow) goes through `rotate_signing_key`, so
none can rotate without an audit record.
"""
from __future__ import annotations

from models.audit import AuditEvent


def rotate_signing_key(runtime, actor: str = "operator"):
    """Add a new active signing key; old keys stay published until their tokens expire."""
    previous = runtime.keyring.active.kid
    key = runtime.keyring.rotate()
    AuditEvent.record(actor, "keys.rotated", key.kid, previous_kid=previous)
    return key
