"""Client authentication (RFC 6749 2.3.1): HTTP Basic, or client_id/client_secret in the body.

The one place a client's secret is checked (token, introspect and revoke endpoints). The secret
is checked first: the right secret of a cached application is answered with no network round
trip (one constant-time HMAC compare) and is never refused, from any address, so a spray of wrong
secrets for a public client_id cannot lock its owner out. Only a wrong secret consults the failure
throttle (`ratelimit.failures`, in Redis when configured): every failure is counted per presented
client_id, whether or not it exists, per source address and per pair, from any address; past a
limit a wrong secret gets 429 + Retry-After, and each lockout is audited. An unknown client_id and
a known one with a wrong secret get the same answers in the same order, so the answers never tell
which client_ids exist. Client secrets are 256-bit random values, so their entropy, not the
throttle, is what stops guessing; the throttle bounds the cost of a spray and makes it visible.

The secret the last rotation retired (`oauth.secret_rotation`, within its grace period) is not a
guess: it gets 401 `invalid_client` saying it was retired, and is not counted.

A presented client_id is 1 to 64 visible ASCII characters (what a client_id can be); anything
else (overlong, control characters, non-ASCII, a broken %-encoding in Basic) is refused as
malformed before any lookup, and counted for the address only.

A public client (`Application.public`, token_endpoint_auth_method `none`, e.g. a browser-only
SMART app) has no secret: it names itself with `client_id` in the body alone, and only where the
caller allows it (the token and revocation endpoints, never introspection). A secret presented for a
public client is refused, and a confidential client without its secret stays `invalid_client`."""
from __future__ import annotations

import base64
import binascii
import re
from urllib.parse import unquote

from models.application import Application
from oauth.errors import OAuthError, invalid_client, invalid_request
from oauth.params import check_text
from oauth.secret_rotation import CURRENT, RETIRED, hashed_under_current_key, presented_secret, rehash_secret
from ratelimit.lockout import throttle_check, throttle_failure

CLIENT_ID_SYNTAX = re.compile(r"[\x21-\x7e]{1,64}")  # RFC 6749 VSCHAR without space; the column's length
RETIRED_SECRET = ("This client secret was retired by a secret rotation and no longer authenticates; "
                  "use the current client secret (the fallback secret that was activated).")


def _basic_credentials(authorization: str) -> tuple[str, str] | None:
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid_client("The Basic authorization header is malformed.", basic=True) from None
    client_id, sep, secret = decoded.partition(":")
    if not sep:
        raise invalid_client("The Basic authorization header is malformed.", basic=True)
    client_id, secret = unquote(client_id), unquote(secret)
    try:  # the checks `check_fields` makes of these two values, in its order (the secret first)
        check_text("client_secret", secret)
        check_text("client_id", client_id)
    except OAuthError as exc:
        raise invalid_client(f"The Basic authorization header is malformed: {exc.message}", basic=True) from None
    return client_id, secret


def _presented(params: dict, authorization: str | None) -> tuple | None:
    """(client_id, secret) as the request carries them (HTTP Basic, else the body), either possibly
    missing or not a string; None when the Basic header is malformed."""
    try:
        basic = _basic_credentials(authorization or "")
    except OAuthError:
        return None
    return basic if basic else (params.get("client_id"), params.get("client_secret"))


def presented_credentials(params: dict, authorization: str | None) -> tuple[str, str] | None:
    """(client_id, secret) as the request presents them, or None when they are missing or
    malformed (`authenticate_client` then answers the right error)."""
    found = _presented(params, authorization)
    if found is None or not isinstance(found[0], str) or not isinstance(found[1], str):
        return None
    return found


def claimed_client_id(params: dict, authorization: str | None) -> str | None:
    """The client_id a request names (HTTP Basic or the body), not yet authenticated; for CORS."""
    found = _presented(params, authorization)
    return found[0] if found is not None and isinstance(found[0], str) else None


def authenticate_client(runtime, params: dict, authorization: str | None, address: str | None = None,
                        allow_public: bool = False) -> Application:
    """The application whose credentials the request carries, or 401 `invalid_client`.

    The application comes from the process's cache (`runtime.applications`, no database round trip
    when warm). With the runtime's throttle, failures from `address` are counted and a locked
    attempt gets 429. `allow_public`: a public client may name itself by `client_id` alone."""
    throttle = runtime.client_auth_throttle
    try:
        app = _authenticate(params, authorization, runtime.applications, runtime.hasher, throttle, address,
                            allow_public, runtime.clock)
    except OAuthError as exc:
        if exc.error == "invalid_client" and throttle is not None and not getattr(exc, "counted", False):
            throttle_failure(throttle, None, address)  # malformed or missing credentials: per address
        raise
    if not app.public and not hashed_under_current_key(app, runtime.hasher):
        rehash_secret(runtime, app, presented_credentials(params, authorization)[1])  # SVC_HMAC_KEY rotation
    return app


def _public_client(app: Application, secret, basic, allow_public) -> Application:
    """The public application `app` when the request authenticates as it: `client_id` alone in the
    body, where the endpoint allows it. A public client presenting a secret: invalid_client."""
    if secret is not None or basic:
        error = invalid_client("This is a public client: it has no secret; send client_id alone.", basic=bool(basic))
        error.counted = True  # nothing was guessed: a public client has no secret to guess
        raise error
    if not allow_public:
        error = invalid_client("A public client cannot authenticate at this endpoint.")
        error.counted = True
        raise error
    return app


def _authenticate(params, authorization, applications, hasher, throttle, address, allow_public, clock) -> Application:
    try:
        basic = _basic_credentials(authorization or "")
    except OAuthError:
        throttle_check(throttle, None, address)  # a locked address gets 429 whatever it sends
        raise
    body_id, body_secret = params.get("client_id"), params.get("client_secret")
    if basic and body_secret is not None:
        raise invalid_request("Use one client authentication method, not both Basic and client_secret.")
    if basic:
        client_id, secret = basic
        if body_id is not None and body_id != client_id:
            raise invalid_request("client_id in the body does not match the Basic credentials.")
    else:
        client_id, secret = body_id, body_secret
    if client_id == "":
        client_id = None
    if isinstance(client_id, str) and not CLIENT_ID_SYNTAX.fullmatch(client_id):
        throttle_check(throttle, None, address)
        raise invalid_client("The client_id is malformed: a client_id is 1 to 64 visible ASCII characters.",
                             basic=bool(basic))  # counted for the address (authenticate_client)
    app = applications.by_client_id(client_id)  # None for a missing or non-string client_id
    if app is not None and app.public:
        return _public_client(app, secret, basic, allow_public)
    if client_id is None or secret is None:
        throttle_check(throttle, None, address)
        error = invalid_client("Client credentials are missing: send client_id and client_secret.", basic=bool(basic))
        error.counted = True  # nothing was guessed
        raise error
    if not isinstance(client_id, str) or not isinstance(secret, str):
        raise invalid_request("client_id and client_secret must be strings.")
    found = presented_secret(app, secret, hasher, clock)
    if found == CURRENT:
        return app  # the right secret: never refused, and no throttle round trip
    if found == RETIRED:
        error = invalid_client(RETIRED_SECRET, basic=bool(basic))
        error.counted = True  # the partner's backend trying its old secret first: not a guess
        raise error
    # Known or not, the presented client_id is the subject: the same answers either way.
    subject = ("client", client_id)
    throttle_check(throttle, subject, address)
    throttle_failure(throttle, subject, address)
    error = invalid_client("Unknown client or wrong client secret.", basic=bool(basic))
    error.counted = True
    raise error
