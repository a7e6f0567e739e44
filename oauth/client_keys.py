"""A backend app's public keys (SMART Backend Services): what a registered JWKS may hold, and the
key a client assertion names.

A JWKS (RFC 7517) is at most `MAX_JWKS_BYTES` and `MAX_KEYS` keys. Each key:
- a real public key (cryptography checks it: an RSA exponent odd and at least 3, an EC point on
  the curve), and public only: a member of private key material (`d`, `p`, `q`, `dp`, `dq`, `qi`, `oth`, or a
  symmetric `k`) refuses the whole set (those keys are no longer secret: register new ones);
- `kty` `RSA` with a modulus of at least 2048 bits (for RS384), or `EC` on `P-384` (for ES384);
- a `kid` (an assertion names its key by it, with the key type its `alg` needs), unique in the set
  for its key type: an RSA and an EC key may share one (RFC 7517 4.5: alternatives of different
  `kty`), two keys of one type may not;
- `alg`, if given, `RS384` or `ES384` (matching the key type); `use`, if given, `sig`.
A registered file (`apps create|update --jwks-file`) must pass all of it. A set fetched from the
app's `--jwks-url` (`oauth.client_jwks`) keeps its usable keys and skips the others, but a set
with private key material is refused whole; two keys of one type under one kid are both skipped
(SMART Backend Services: when more than one key matches the kid and type, verification fails).
"""
from __future__ import annotations

import base64
import binascii
import json
from types import MappingProxyType

from cryptography.hazmat.primitives.asymmetric import ec, rsa

MAX_JWKS_BYTES = 100 * 1024
MAX_KEYS = 50
ALGORITHMS = MappingProxyType({"RS384": "RSA", "ES384": "EC"})
"""The assertion algorithms accepted (SMART Backend Services), each with its key type."""
MIN_RSA_BITS = 2048
EC_CURVE = "P-384"
PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth", "k")
PUBLIC_MEMBERS = MappingProxyType({"RSA": ("kty", "kid", "alg", "use", "key_ops", "n", "e"),
                                   "EC": ("kty", "kid", "alg", "use", "key_ops", "crv", "x", "y")})


class JwksError(ValueError):
    """Not a JWKS svc-auth accepts; the message says why."""


def _b64_int(value, what: str) -> int:
    if not isinstance(value, str) or not value or len(value) > 2048:
        raise JwksError(f"{what} must be a base64url string")
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise JwksError(f"{what} is not base64url") from None
    return int.from_bytes(raw, "big")


def _public_key_checks(kid: str, key: dict) -> None:
    """The key is a real public key (cryptography's own checks: an RSA exponent that is odd and
    at least 3, an EC point on P-384), of the size required."""
    try:
        if key["kty"] == "RSA":
            n = _b64_int(key.get("n"), "an RSA key's n")
            if n.bit_length() < MIN_RSA_BITS:
                raise JwksError(f"key {kid!r}: an RSA key must have a modulus of at least {MIN_RSA_BITS} bits")
            rsa.RSAPublicNumbers(_b64_int(key.get("e"), "an RSA key's e"), n).public_key()
        else:
            ec.EllipticCurvePublicNumbers(_b64_int(key.get("x"), "an EC key's x"), _b64_int(key.get("y"), "an EC key's y"),
                                          ec.SECP384R1()).public_key()
    except ValueError as exc:
        if isinstance(exc, JwksError):
            raise
        raise JwksError(f"key {kid!r} is not a valid public key") from None


def _check_key(key) -> dict:
    """The key's public members, or JwksError saying why it cannot verify an assertion."""
    if not isinstance(key, dict):
        raise JwksError("each key must be a JSON object")
    kty, kid, alg = key.get("kty"), key.get("kid"), key.get("alg")
    if not isinstance(kty, str) or kty not in PUBLIC_MEMBERS:  # JSON arrays and objects are not hashable
        raise JwksError(f"key type {str(kty)[:20]!r} is not accepted (RSA or EC P-384)")
    if not isinstance(kid, str) or not 1 <= len(kid) <= 200:
        raise JwksError("each key needs a kid (1 to 200 characters)")
    if alg is not None and (not isinstance(alg, str) or ALGORITHMS.get(alg) != kty):
        raise JwksError(f"key {kid!r}: alg must be RS384 (RSA) or ES384 (EC P-384), got {str(alg)[:20]!r}")
    if key.get("use") not in (None, "sig"):
        raise JwksError(f"key {kid!r}: use must be sig")
    if kty == "EC" and key.get("crv") != EC_CURVE:
        raise JwksError(f"key {kid!r}: an EC key must be on curve {EC_CURVE} (ES384)")
    _public_key_checks(kid, key)
    return {name: key[name] for name in PUBLIC_MEMBERS[kty] if name in key}


def parse_jwks(data: bytes | str, strict: bool = True) -> dict:
    """The public JWKS in `data` ({"keys": [...]}, only public members kept). `strict`: every key
    must be usable (a registered file); else unusable keys are skipped (a fetched set). Private
    key material is refused either way. JwksError says what is wrong."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) > MAX_JWKS_BYTES:
        raise JwksError(f"a JWKS is at most {MAX_JWKS_BYTES} bytes")
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise JwksError("not JSON (or nested too deep)") from None
    keys = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(keys, list):
        raise JwksError('a JWKS is a JSON object with a "keys" array')
    if len(keys) > MAX_KEYS:
        raise JwksError(f"a JWKS holds at most {MAX_KEYS} keys")
    kept, names, ambiguous = [], set(), set()
    for key in keys:
        if isinstance(key, dict) and any(member in key for member in PRIVATE_MEMBERS):
            raise JwksError("the JWKS contains private key material; register the public keys only "
                            "(and replace keys whose private half was exposed)")
        try:
            public = _check_key(key)
        except JwksError:
            if strict:
                raise
            continue
        name = (public["kid"], public["kty"])  # what an assertion's kid and alg select
        if name in names:
            if strict:
                raise JwksError(f"kid {public['kid']!r} names two {public['kty']} keys")
            ambiguous.add(name)
            continue
        names.add(name)
        kept.append(public)
    kept = [key for key in kept if (key["kid"], key["kty"]) not in ambiguous]
    if strict and not kept:
        raise JwksError("the JWKS holds no key")
    return {"keys": kept}


def find_key(jwks: dict | None, kid, alg: str) -> dict | None:
    """The key of `jwks` with this `kid` that can verify `alg` (RS384: RSA, ES384: EC P-384), or None."""
    kty = ALGORITHMS.get(alg)
    for key in (jwks or {}).get("keys", ()):
        if key.get("kid") == kid and key.get("kty") == kty and key.get("alg") in (None, alg):
            return key
    return None


def stored_jwks(text: str | None) -> dict | None:
    """An application's stored JWKS (`Application.jwks`, validated when registered), or None."""
    if not text:
        return None
    try:
        return parse_jwks(text, strict=False)
    except JwksError:
        return None
