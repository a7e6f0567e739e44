"""Signing keys in the database: RFC 7638 kid, encrypted at rest, pre-publication, retention,
one-time import of the old key files, shared by every process."""
import json
from types import SimpleNamespace

import pytest
from jose import jwt
from jwcrypto import jwk as jwcrypto_jwk, jwt as jwcrypto_jwt

from keys.encryption import KeyCipher, KeyDecryptionError
from keys.signing import KeyRing, generate_key_file
from lifecycle.signing_keys import rotate_signing_key
from models.keys import SigningKeyRecord
from oauth.tokens import InvalidToken, TokenService


def ring_of(runtime, clock=None, legacy_dir=None, secret=b"k" * 32, prepublish=300) -> KeyRing:
    """Another process's view of the same database."""
    return KeyRing(runtime.db, KeyCipher(secret), retain_seconds=3600, prepublish_seconds=prepublish,
                   clock=clock or runtime.clock.time, legacy_dir=legacy_dir)


def test_kid_is_the_rfc7638_thumbprint(runtime):
    published = runtime.keyring.jwks()["keys"][0]
    assert published["kid"] == jwcrypto_jwk.JWK(**{k: published[k] for k in ("kty", "n", "e")}).thumbprint()


def test_private_keys_are_encrypted_at_rest_under_the_hmac_key(runtime):
    kid = runtime.keyring.active.kid
    row = SigningKeyRecord.get_by_id(kid)
    assert "PRIVATE KEY" not in row.private_key and row.private_key.startswith("v1:")
    assert set(json.loads(row.public_jwk)) == {"kty", "use", "alg", "kid", "n", "e"}
    assert b"PRIVATE KEY" in KeyCipher(b"k" * 32).open(kid, row.private_key)
    with pytest.raises(KeyDecryptionError, match="SVC_HMAC_KEY"):
        ring_of(runtime, secret=b"x" * 32).active
    with pytest.raises(KeyDecryptionError):  # bound to its kid: a sealed key moved to another row does not open
        KeyCipher(b"k" * 32).open("another-kid", row.private_key)


def test_existing_key_files_are_imported_once(runtime, tmp_path):
    SigningKeyRecord.delete().execute()
    legacy = tmp_path / "old-keys"
    old = generate_key_file(legacy, created=int(runtime.clock.time()) - 100)
    newer = generate_key_file(legacy, created=int(runtime.clock.time()) - 10)
    first, second = ring_of(runtime, legacy_dir=str(legacy)), ring_of(runtime, legacy_dir=str(legacy))
    assert first.active.kid == second.active.kid == newer.stem.split("-", 2)[2]
    assert {k["kid"] for k in first.jwks()["keys"]} == {old.stem.split("-", 2)[2], newer.stem.split("-", 2)[2]}
    generate_key_file(legacy)  # files written later are not the keys any more: the database is
    assert SigningKeyRecord.select().count() == 2
    assert ring_of(runtime, legacy_dir=str(legacy)).active.kid == first.active.kid


def test_without_files_the_first_start_generates_one_key_for_every_process(runtime, tmp_path):
    SigningKeyRecord.delete().execute()
    first, second = ring_of(runtime, legacy_dir=str(tmp_path / "none")), ring_of(runtime)
    assert first.active.kid == second.active.kid
    assert SigningKeyRecord.select().count() == 1


def test_rotation_prepublishes_then_signs_and_retains_the_old_key(runtime):
    now = [1_000_000.0]
    ring = ring_of(runtime, clock=lambda: now[0])
    tokens = TokenService(ring, "https://issuer/", SimpleNamespace(time=lambda: now[0]))
    old_kid = ring.active.kid
    old_token, _ = tokens.access_token("usr_1", "platform", 10**9)
    new = ring.rotate()
    # Published at once, not signing before the pre-publication time has passed.
    assert [k["kid"] for k in ring.jwks()["keys"]] == [new.kid, old_kid]
    assert ring.active.kid == old_kid and [k.kid for k in ring.upcoming] == [new.kid]
    now[0] += 299
    assert jwt.get_unverified_header(tokens.sign({"a": 1}))["kid"] == old_kid
    now[0] += 1
    assert jwt.get_unverified_header(tokens.sign({"a": 1}))["kid"] == new.kid and ring.upcoming == []
    # The old key stays published until every token it signed has expired (retain_seconds after
    # its successor started signing), then drops out.
    now[0] += 3599
    assert tokens.verify(old_token, "platform")["sub"] == "usr_1"
    assert [k["kid"] for k in ring.jwks()["keys"]] == [new.kid, old_kid]
    now[0] += 1
    assert [k["kid"] for k in ring.jwks()["keys"]] == [new.kid]
    with pytest.raises(InvalidToken):
        tokens.verify(old_token, "platform")
    # The next rotation prunes the rows of keys nobody can need.
    ring.rotate()
    assert old_kid not in {row.kid for row in SigningKeyRecord.select()}


def test_another_process_hears_of_a_rotation(runtime):
    other = ring_of(runtime)
    runtime.changes.subscribe("signing_keys", other.load)  # as its change feed would call it
    before = other.active.kid
    key = rotate_signing_key(runtime)
    assert key.kid in [k["kid"] for k in other.jwks()["keys"]] and other.active.kid == before
    runtime.clock.advance(runtime.settings.key_prepublish_seconds)
    assert other.active.kid == key.kid


def test_key_objects_are_built_once(runtime):
    first = runtime.keyring.active
    runtime.keyring.load()
    assert runtime.keyring.active.signer is first.signer


def test_tokens_are_the_jws_python_jose_makes_and_verify_with_the_published_key(runtime):
    """`TokenService.sign` signs with `cryptography` directly: byte for byte what python-jose's
    `jwt.encode` makes of the same claims and headers (RS256 PKCS#1 v1.5 is deterministic), and
    it verifies against the JWKS with python-jose and jwcrypto."""
    key = runtime.keyring.active
    claims = dict(runtime.tokens.base_claims("user-1", "client-1", 60), nonce="n\u00e9\"\u2028", scope="openid")
    for typ in ("JWT", "at+jwt"):
        token = runtime.tokens.sign(claims, typ=typ)
        assert token == jwt.encode(claims, key.signer, algorithm="RS256", headers={"kid": key.kid, "typ": typ})
        assert jwt.get_unverified_header(token) == {"alg": "RS256", "kid": key.kid, "typ": typ}
    assert runtime.tokens.verify(token, "client-1", typ="at+jwt") == claims
    public = jwcrypto_jwk.JWK(**runtime.keyring.jwks()["keys"][0])
    assert json.loads(jwcrypto_jwt.JWT(jwt=token, key=public).claims) == claims


@pytest.mark.gen_test
async def test_jwks_and_discovery_over_http(api, runtime):
    status, headers, jwks = await api.call("GET", "/.well-known/jwks.json")
    assert status == 200 and jwks["keys"][0]["kid"] == runtime.keyring.active.kid
    assert set(jwks["keys"][0]) == {"kty", "use", "alg", "kid", "n", "e"}  # never private members
    # Cached for at most half the time a new key is pre-published (the rest a margin).
    assert headers["Cache-Control"] == f"public, max-age={min(300, runtime.settings.key_prepublish_seconds // 2)}"
    status, _, config = await api.call("GET", "/.well-known/openid-configuration")
    assert config["issuer"] == "http://127.0.0.1:8888/"
    assert config["id_token_signing_alg_values_supported"] == ["RS256"]
    assert config["token_endpoint"] == "http://127.0.0.1:8888/v1/oauth/token"
    assert config["jwks_uri"] == "http://127.0.0.1:8888/.well-known/jwks.json"
    assert set(config["token_endpoint_auth_methods_supported"]) == {"client_secret_basic", "client_secret_post", "none",
                                                             "private_key_jwt"}


def test_two_hosts_rotating_at_once_keep_both_new_keys(backend, settings, runtime):
    """`keys rotate` on two hosts at once: each read the keys, inserted its own, and pruned what its
    read did not hold, so one could delete the other's new key (whose rotate then failed) and both
    could sign from the same moment. A rotation now holds the keys' lock: the second waits."""
    if backend != "postgresql":
        pytest.skip("holds PostgreSQL's advisory lock from outside (SQLite: the rotation's IMMEDIATE transaction)")
    import subprocess
    import sys
    import time
    import psycopg2
    from helpers.environment import ROOT
    from helpers.processes import settings_env
    from keys.signing import ADVISORY_LOCK
    first = runtime.keyring.active.kid
    holder = psycopg2.connect(settings.database_url)
    holder.autocommit = True
    procs = []
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_LOCK,))
            procs = [subprocess.Popen([sys.executable, "-m", "cli.__main__", "keys", "rotate", "--json"],
                                      env=settings_env(settings), cwd=str(ROOT), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for _ in range(2)]
            deadline = time.monotonic() + 60
            waiting = 0
            while waiting < 2 and time.monotonic() < deadline and all(p.poll() is None for p in procs):
                cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                waiting = cur.fetchone()[0]
            assert waiting == 2, "both rotations wait for the lock"
            assert [row.kid for row in SigningKeyRecord.select()] == [first]  # neither inserted yet
            cur.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK,))
        results = [(p.wait(60), p.stdout.read(), p.stderr.read()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        holder.close()
    assert [code for code, _, _ in results] == [0, 0], results
    kids = [json.loads(out)["kid"] for _, out, _ in results]
    rows = {row.kid: row for row in SigningKeyRecord.select()}
    assert set(kids) | {first} == set(rows)  # nothing pruned: every key is still published
    assert rows[kids[0]].not_before != rows[kids[1]].not_before
    SigningKeyRecord.delete().where(SigningKeyRecord.kid != first).execute()  # (the `cli` fixture truncates nothing)
