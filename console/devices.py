"""Console device cookies (OWASP, "Slow Down Online Guessing Attacks with Device Cookies").

Each successful console sign-in gives the browser a new device cookie bound to that account. At a
later sign-in to the same account it makes the browser a trusted device: the lockouts of the
account and of the address (which anyone who knows the e-mail can set off by spraying wrong
passwords) do not hold it: only its cookie's own count, in the same failure throttle with the same
limit, refuses it. Its failures count for the account and the address as well, so those still lock
out untrusted browsers (`console.accounts.sign_in`). Without one (no cookie, another account's, forged,
tampered or expired) sign-in is throttled per account, address and pair as before. The cookie
signs nobody in: the password (and TOTP code) are checked all the same. Every value of the cookie
the browser sends is tried: a host under the same parent domain can set one of the same name for
that domain, which must not hide the genuine one (nor can it make a browser trusted: it has no MAC).

Value: `v1.<issued, Unix seconds>.<nonce, 256 random bits>.<MAC>`, the MAC an HMAC under
SVC_HMAC_KEY (any previous key accepted, compared in constant time) of the account's e-mail, the
time and the nonce. The e-mail is not in the cookie, and nothing is stored server-side.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from lifecycle.users import normal_email
from models.ids import new_secret

DEVICE_LABEL = "console-device\x00"  # sets the device cookies' MACs apart from the key's other MACs
_VALUE = re.compile(r"v1\.([0-9]{1,12})\.([A-Za-z0-9_-]{43})\.([A-Za-z0-9_-]{43})")


def _account(email: str | None) -> str:
    """The account an e-mail names, as sign-in looks it up."""
    return normal_email(email)


def _message(email: str, issued: str, nonce: str) -> str:
    # The e-mail is free text, but the time and the nonce have fixed alphabets without NUL: unambiguous.
    return f"{DEVICE_LABEL}{_account(email)}\x00{issued}\x00{nonce}"


def issue_device_cookie(runtime, email: str) -> str:
    """A new device cookie value for the account `email`, issued now."""
    issued, nonce = str(int(runtime.clock.time())), new_secret()
    return f"v1.{issued}.{nonce}.{runtime.hasher.sign(_message(email, issued, nonce))}"


def trusted_device(runtime, email: str, values: Iterable[str]) -> tuple | None:
    """The failure-throttle subject of the first valid device cookie of the account `email` among
    `values` (each one the browser sent): `("device", hash of its nonce)`, so neither the nonce nor
    the e-mail is written to a store or the audit trail. None (the untrusted path) when none is
    valid: no cookie, malformed, forged or tampered ones, another account's, or ones older than
    SVC_CONSOLE_DEVICE_COOKIE_LIFETIME. Only well-formed values cost an HMAC (per key)."""
    for value in dict.fromkeys(values):
        device = _device(runtime, email, value)
        if device is not None:
            return device
    return None


def _device(runtime, email: str, value: str) -> tuple | None:
    found = _VALUE.fullmatch(value)
    if found is None:
        return None
    issued, nonce, mac = found.groups()
    if runtime.clock.time() - int(issued) >= runtime.settings.console_device_cookie_lifetime:
        return None
    if not runtime.hasher.verify(_message(email, issued, nonce), mac):
        return None
    return ("device", hashlib.sha256(nonce.encode("ascii")).hexdigest()[:32])
