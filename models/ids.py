"""Identifiers and secrets: random, URL-safe, with a readable prefix."""
from __future__ import annotations

import secrets


def new_id(prefix: str, nbytes: int = 12) -> str:
    """A public identifier such as `org_3k9...`: unguessable but not a secret."""
    return f"{prefix}_{secrets.token_hex(nbytes)}"


def new_secret(nbytes: int = 32) -> str:
    """A bearer secret with `8 * nbytes` bits of randomness (256 by default)."""
    return secrets.token_urlsafe(nbytes)
