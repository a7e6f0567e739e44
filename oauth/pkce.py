"""PKCE (RFC 7636): S256 only. A challenge binds the code; the token request proves the verifier.

`plain` and a challenge without a method (which RFC 7636 4.3 reads as `plain`) are refused: plain
protects nothing once the authorization request leaks (RFC 9700 2.1.1)."""
from __future__ import annotations

import base64
import hashlib
import hmac
import re

SUPPORTED_METHODS = ("S256",)
# Matched whole (`fullmatch`): `$` would also match before a final newline, and a challenge
# ending in one binds the code to something no verifier can prove.
_CHALLENGE = re.compile(r"[A-Za-z0-9_-]{43}")           # base64url of a SHA-256, no padding
_VERIFIER = re.compile(r"[A-Za-z0-9\-._~]{43,128}")     # RFC 7636 4.1


class PkceError(ValueError):
    """The request breaks a PKCE rule; the message says which."""


def s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode("ascii")).digest()).rstrip(b"=").decode("ascii")


def challenge_of(params: dict, required: bool) -> str | None:
    """The code_challenge to bind to the code (None without PKCE), or `PkceError`."""
    challenge = params.get("code_challenge") or None
    method = params.get("code_challenge_method") or None
    if challenge is None:
        if method is not None:
            raise PkceError("code_challenge_method was sent without a code_challenge.")
        if required:
            raise PkceError("This application requires PKCE: send code_challenge with code_challenge_method=S256.")
        return None
    if method is None:
        raise PkceError("code_challenge_method is required and must be S256 (a challenge without a method is "
                        "'plain', which is not supported).")
    if method != "S256":
        raise PkceError("code_challenge_method must be S256; 'plain' is not supported.")
    if not isinstance(challenge, str) or not _CHALLENGE.fullmatch(challenge):
        raise PkceError("code_challenge must be the 43-character base64url SHA-256 of the code_verifier.")
    return challenge


def verify(challenge: str | None, verifier) -> None:
    """`PkceError` unless `verifier` proves `challenge` (and no verifier is sent for a code without one)."""
    if challenge is None:
        if verifier is not None:
            raise PkceError("code_verifier was sent, but the authorization request had no code_challenge.")
        return
    if verifier is None:
        raise PkceError("code_verifier is required: the authorization request sent a code_challenge.")
    if not isinstance(verifier, str) or not _VERIFIER.fullmatch(verifier):
        raise PkceError("code_verifier must be 43 to 128 characters of A-Z a-z 0-9 - . _ ~.")
    if not hmac.compare_digest(s256(verifier), challenge):
        raise PkceError("code_verifier does not match the code_challenge.")
