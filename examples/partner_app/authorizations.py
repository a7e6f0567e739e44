"""The app's side of one authorization request: `state`, `nonce` and a PKCE verifier (RFC 7636).

`/launch` starts one (`start`) and sends state, nonce and the S256 challenge to the authorize
endpoint. The redirect lands on the main page with `code` and `state`: the page handler checks the
state (issued here, unexpired, used once) and ties the code to that request (`redeem`). The app
token endpoint then exchanges the code with its verifier (`take`) and checks the ID token's nonce.
A code that did not come back with one of our states has no verifier, so it is never exchanged."""
from __future__ import annotations

import base64
import hashlib
import secrets
import time


def s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class PendingAuthorizations:
    """In memory, as the example app keeps everything; a real app stores them with its sessions."""

    def __init__(self, ttl: float = 600.0, clock=time.monotonic):
        self.ttl = ttl
        self._clock = clock
        self._by_state: dict[str, tuple[float, str, str]] = {}   # state -> (expires, verifier, nonce)
        self._by_code: dict[str, tuple[float, str, str]] = {}    # code -> (expires, verifier, nonce)

    def _prune(self) -> None:
        now = self._clock()
        for table in (self._by_state, self._by_code):
            for key in [k for k, v in table.items() if v[0] <= now]:
                del table[key]

    def start(self) -> dict:
        """Parameters for the authorize request: state, nonce, code_challenge(_method)."""
        self._prune()
        state, nonce, verifier = (secrets.token_urlsafe(32) for _ in range(3))
        self._by_state[state] = (self._clock() + self.ttl, verifier, nonce)
        return {"state": state, "nonce": nonce, "code_challenge": s256(verifier), "code_challenge_method": "S256"}

    def redeem(self, state: str | None, code: str | None) -> bool:
        """The redirect came back: True when `state` is ours (once); the code then has a verifier."""
        entry = self._by_state.pop(state or "", None)
        if entry is None or entry[0] <= self._clock() or not code:
            return False
        self._by_code[code] = entry
        return True

    def take(self, code: str) -> tuple[str, str] | None:
        """(code_verifier, nonce) of a redeemed code, once."""
        entry = self._by_code.pop(code, None)
        if entry is None or entry[0] <= self._clock():
            return None
        return entry[1], entry[2]
