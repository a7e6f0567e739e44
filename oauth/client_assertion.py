"""Client authentication with a JWT (RFC 7523 2.2 and 3, `private_key_jwt`; SMART Backend
Services): the client signs an assertion with its private key; svc-auth verifies it with the
public key the app registered (`apps ... --jwks-url | --jwks-file`; `oauth.client_jwks`).

The request carries `client_assertion_type=urn:ietf:params:oauth:client-assertion-type:jwt-bearer`
and `client_assertion`, and no secret (one authentication method per request). The assertion:
- header: `alg` RS384 or ES384 (never `none` or HS*: a key type decides the algorithm), a `kid`
  of a key in the app's JWKS, no `crit`; a `jku`, if present, equal to the registered JWKS URL
  (keys are never fetched from anywhere else);
- claims: `iss` = `sub` = the client_id (and `client_id` in the body, if sent, the same); `aud` the
  token endpoint as the discovery documents list it (`/v1/oauth/token`; `/os-api/v2`'s too), or a
  list holding it;
  `exp` (a NumericDate: an integer or not) in the future and at most 5 minutes ahead; `nbf`, if present, not in the future; a `jti`
  (1 to 255 characters) not spent before.
Every refusal is 401 `invalid_client` saying why. A `kid` the cached keys lack while the app's
JWKS URL is being fetched is no refusal: 503 `temporarily_unavailable` with Retry-After.

A `jti` is spent (`spend`) by the `client_credentials` grant just before it issues a token, so an
assertion refused for its scope (`invalid_scope`) may be sent again; with `authorization_code` or
`refresh_token` (and at revocation and introspection) it is spent first, before the code or token
is looked at, so that a replayed assertion can never use up a code or a refresh token. Spent
jtis are rows of `spent_assertion` (the database: every process and host sees them)
until an hour past their assertion's `exp` (`SPENT_RETENTION`): each host drops them by its own
clock, so a host whose clock runs ahead must not drop a jti that a host running behind would still
take as unexpired.

Throttling (`ratelimit.failures`, the client secrets' throttle): the signature is the secret here.
An assertion that verifies under the app's key is never refused by the throttle, from any address,
so failures sprayed at a client_id cannot lock its owner out. A failure before that (an unknown
client, a bad algorithm, kid or signature) is a guess: it consults the throttle (429 while locked)
and is counted per client_id, address and pair. A malformed assertion counts for the address.
A signed assertion refused for its claims (aud, exp, jti) is the client's own mistake or a replay,
not a guess: refused, not counted.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from types import MappingProxyType

import peewee
from jose import jwt
from jose.exceptions import JOSEError

from models.application import Application
from models.assertions import SpentAssertion
from oauth.client_jwks import RETRY_AFTER, JwksBeingFetched, JwksUnavailable
from oauth.client_keys import ALGORITHMS
from oauth.clients import CLIENT_ID_SYNTAX
from oauth.discovery import endpoints
from oauth.errors import invalid_client, invalid_request, temporarily_unavailable
from oauth.variants import V1, VARIANTS
from ratelimit.lockout import throttle_check, throttle_failure

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
MAX_LIFETIME = 300      # seconds: exp at most this far ahead (SMART Backend Services)
LEEWAY = 5              # seconds of clock skew tolerated on exp's upper bound and nbf
SPENT_RETENTION = 3600  # seconds a spent jti is kept past its exp: the hosts' clock skew it covers
MAX_ASSERTION_LENGTH = 16 * 1024
MAX_JTI_LENGTH = 255
_SIGNATURE_ONLY = MappingProxyType({"verify_signature": True, "verify_aud": False, "verify_iat": False, "verify_exp": False,
               "verify_nbf": False, "verify_iss": False, "verify_sub": False, "verify_jti": False,
               "verify_at_hash": False})
"""python-jose checks the signature; the claims are checked here, on the runtime's clock."""


@dataclasses.dataclass(frozen=True)
class AssertedClient:
    """An application authenticated by a verified assertion, whose `jti` is not spent yet."""

    app: Application
    jti: str
    exp: int


def presents_assertion(params: dict) -> bool:
    """Does the request authenticate with a client assertion (RFC 7521 4.2)?"""
    return params.get("client_assertion") is not None or params.get("client_assertion_type") is not None


def token_endpoint_url(settings) -> str:
    """The assertion's audience: the token endpoint as smart-configuration and the discovery documents list it."""
    return endpoints(settings, V1)["token_endpoint"]


def token_endpoint_urls(settings) -> tuple[str, ...]:
    """Every audience an assertion may name: the token endpoint of each prefix (`/v1` first, as
    smart-configuration lists it; `/os-api/v2`'s as its discovery document does)."""
    return tuple(endpoints(settings, variant)["token_endpoint"] for variant in VARIANTS)


def _refused(description: str, counted: bool = True):
    error = invalid_client(description)
    error.counted = counted
    return error


def authenticate_assertion(runtime, params: dict, authorization: str | None,
                           address: str | None = None) -> AssertedClient:
    """The application whose assertion the request carries, verified, or 401 `invalid_client`
    (429 while its client_id or the address is locked by failures)."""
    throttle = runtime.client_auth_throttle
    if authorization or params.get("client_secret") is not None:
        raise invalid_request("Use one client authentication method: a client assertion, or a client secret.")
    assertion_type, assertion = params.get("client_assertion_type"), params.get("client_assertion")

    def malformed(description: str):
        throttle_check(throttle, None, address)
        throttle_failure(throttle, None, address)
        return _refused(description)

    if assertion_type != ASSERTION_TYPE:
        raise malformed(f"client_assertion_type must be {ASSERTION_TYPE}.")
    if not isinstance(assertion, str) or not assertion or len(assertion) > MAX_ASSERTION_LENGTH \
            or assertion.count(".") != 2:
        raise malformed("client_assertion must be a signed JWT (compact JWS).")
    try:
        header = jwt.get_unverified_header(assertion)
        unverified = jwt.get_unverified_claims(assertion)
    except (JOSEError, ValueError, TypeError, RecursionError):  # RecursionError: JSON nested thousands deep
        raise malformed("client_assertion is not a readable JWT.") from None
    client_id = unverified.get("iss") if isinstance(unverified, dict) else None
    if not isinstance(client_id, str) or not CLIENT_ID_SYNTAX.fullmatch(client_id):
        raise malformed("The assertion's iss must be the client_id.")
    subject = ("client", client_id)

    def guess(description: str):
        throttle_check(throttle, subject, address)
        throttle_failure(throttle, subject, address)
        return _refused(description)

    body_client_id = params.get("client_id")
    if body_client_id not in (None, "") and body_client_id != client_id:
        raise guess("client_id does not match the assertion's iss.")
    app = runtime.applications.by_client_id(client_id)
    if app is None or not app.is_backend:
        raise guess("Unknown client, or no public keys are registered for it (apps update --jwks-url/--jwks-file).")
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in ALGORITHMS:  # a list or object is no algorithm (nor hashable)
        raise guess("The assertion must be signed RS384 or ES384.")
    if "crit" in header:
        raise guess("The assertion's header names critical extensions svc-auth does not support (crit).")
    jku = header.get("jku")
    if jku is not None and (not app.jwks_url or jku != app.jwks_url):
        raise guess("The assertion's jku is not the application's registered JWKS URL.")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise guess("The assertion's header must name its key (kid).")
    try:
        key = runtime.client_jwks.key(app, kid, alg)
    except JwksBeingFetched as exc:  # nothing is known of this kid yet: not a refusal, nor a guess
        raise temporarily_unavailable(str(exc), RETRY_AFTER) from None
    except JwksUnavailable as exc:
        raise _refused(str(exc), counted=True) from None  # its host is down: nobody guessed
    if key is None:
        raise guess(f"No single {alg} key with that kid is in the application's JWKS.")
    try:
        claims = jwt.decode(assertion, key, algorithms=[alg], options=dict(_SIGNATURE_ONLY))
    except (JOSEError, ValueError, TypeError, RecursionError):
        raise guess("The assertion's signature does not verify with the application's key.") from None
    # Signed with the app's key: whatever is refused from here was not a guess.
    _check_claims(runtime, app, claims)
    return AssertedClient(app=app, jti=claims["jti"], exp=math.ceil(claims["exp"]))


def _numeric_date(value) -> bool:
    """A JWT NumericDate (RFC 7519 2): seconds since the epoch, an integer or not (`time.time() + 300`
    signed as is), finite; never `true`."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or isinstance(value, float) and math.isfinite(value)


def _check_claims(runtime, app: Application, claims: dict) -> None:
    def refuse(description: str):
        return _refused(description)
    if claims.get("iss") != app.client_id or claims.get("sub") != app.client_id:
        raise refuse("The assertion's iss and sub must both be the client_id.")
    audience, expected = claims.get("aud"), token_endpoint_urls(runtime.settings)
    if not (audience in expected or (isinstance(audience, list) and any(a in expected for a in audience))):
        raise refuse(f"The assertion's aud must be the token endpoint, {expected[0]}.")
    now = runtime.clock.time()
    exp = claims.get("exp")
    if not _numeric_date(exp):
        raise refuse("The assertion must carry exp (seconds since the epoch).")
    if exp <= now:
        raise refuse("The assertion has expired.")
    if exp > now + MAX_LIFETIME + LEEWAY:
        raise refuse(f"The assertion's exp is more than {MAX_LIFETIME // 60} minutes ahead.")
    nbf = claims.get("nbf")
    if nbf is not None and (not _numeric_date(nbf) or nbf > now + LEEWAY):
        raise refuse("The assertion is not valid yet (nbf).")
    jti = claims.get("jti")
    if not isinstance(jti, str) or not 1 <= len(jti) <= MAX_JTI_LENGTH:
        raise refuse(f"The assertion must carry a jti of 1 to {MAX_JTI_LENGTH} characters.")


def _spent_key(client_id: str, jti: str) -> str:
    return hashlib.sha256(f"{client_id}\x00{jti}".encode("utf-8", "surrogatepass")).hexdigest()


def spend(runtime, client: AssertedClient) -> None:
    """Mark the assertion's jti spent, or 401 `invalid_client` when it already was (a replay; two
    racing requests with one assertion: one wins). Spent jtis an hour past their exp are dropped."""
    now = int(runtime.clock.time())
    SpentAssertion.delete().where(SpentAssertion.expires_at < now - SPENT_RETENTION).execute()
    try:
        with runtime.db.atomic():
            SpentAssertion.insert(key=_spent_key(client.app.client_id, client.jti), expires_at=client.exp).execute()
    except peewee.IntegrityError:
        raise _refused("This assertion was already used (its jti is spent): sign a new one.") from None
