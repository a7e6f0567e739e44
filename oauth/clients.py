"""Client authentication (RFC 6749 2.3.1): HTTP Basic, or client_id/client_secret in the body."""
from __future__ import annotations

import base64
import binascii
from urllib.parse import unquote

from models.application import Application
from oauth.errors import invalid_client, invalid_request


def _basic_credentials(authorization: str) -> tuple[str, str] | None:
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise invalid_client("The Basic authorization header is malformed.", basic=True) from None
    client_id, sep, secret = decoded.partition(":")
    if not sep:
        raise invalid_client("The Basic authorization header is malformed.", basic=True)
    return unquote(client_id), unquote(secret)


def authenticate_client(runtime, params: dict, authorization: str | None) -> Application:
    """The application whose credentials the request carries, or 401 `invalid_client`."""
    basic = _basic_credentials(authorization or "")
    body_id, body_secret = params.get("client_id"), params.get("client_secret")
    if basic and body_secret is not None:
        raise invalid_request("Use one client authentication method, not both Basic and client_secret.")
    if basic:
        client_id, secret = basic
        if body_id is not None and body_id != client_id:
            raise invalid_request("client_id in the body does not match the Basic credentials.")
    else:
        client_id, secret = body_id, body_secret
    if client_id is None or secret is None:
        raise invalid_client("Client credentials are missing: send client_id and client_secret.", basic=bool(basic))
    if not isinstance(client_id, str) or not isinstance(secret, str):
        raise invalid_request("client_id and client_secret must be strings.")
    app = runtime.applications.by_client_id(client_id)
    if app is None or not app.has_secret(secret, runtime.hasher):
        raise invalid_client("Unknown client or wrong client secret.", basic=bool(basic))
    return app
