"""A partner's backend as SMART Backend Services describes it: key pairs made here, assertions
signed with PyJWT (a library nobody here wrote), and a tiny JWKS host on loopback."""
from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


class KeyPair:
    """A private key with its public JWK (`kid`); `alg` RS384 (RSA 2048) or ES384 (EC P-384)."""

    def __init__(self, alg: str = "RS384", kid: str | None = None, bits: int = 2048):
        self.alg = alg
        self.kid = kid or uuid.uuid4().hex[:12]
        if alg.startswith("ES"):
            self.private = ec.generate_private_key(ec.SECP384R1())
            jwk = json.loads(ECAlgorithm.to_jwk(self.private.public_key()))
        else:
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=bits)
            jwk = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        self.public_jwk = {**jwk, "kid": self.kid, "alg": alg, "use": "sig"}

    def private_jwk(self) -> dict:
        algorithm = ECAlgorithm if self.alg.startswith("ES") else RSAAlgorithm
        return {**json.loads(algorithm.to_jwk(self.private)), "kid": self.kid}


def jwks(*pairs: KeyPair) -> dict:
    return {"keys": [p.public_jwk for p in pairs]}


def assertion(pair: KeyPair, client_id: str, aud: str, *, alg: str | None = None, exp_in: float = 240,
              jti: str | None = None, headers: dict | None = None, key=None, now: float | None = None,
              **claims) -> str:
    """A client assertion signed by `pair` (or `key`): iss = sub = client_id, aud, exp (`exp_in`
    seconds after `now`, default the real time: a test that moves the service's clock passes it), jti."""
    now = time.time() if now is None else now
    body = {"iss": client_id, "sub": client_id, "aud": aud, "exp": int(now + exp_in),
            "jti": jti or uuid.uuid4().hex, **claims}
    header = {"kid": pair.kid, "typ": "JWT", **(headers or {})}
    return jwt.encode(body, key if key is not None else pair.private, algorithm=alg or pair.alg, headers=header)


def unsigned_style(claims: dict, header: dict, alg: str, secret: bytes = b"") -> str:
    """A JWT with `alg` `none` (no signature) or `HS256` under `secret` (e.g. the public key's bytes:
    the algorithm-confusion attack), assembled by hand: JWT libraries rightly refuse to make these."""
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    signing_input = f"{b64(json.dumps({**header, 'alg': alg}).encode())}.{b64(json.dumps(claims).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest() if alg == "HS256" else b""
    return f"{signing_input}.{b64(signature)}"


def token_form(client_assertion: str, scope: str | None = "system/Patient.rs", **extra) -> dict:
    form = {"grant_type": "client_credentials", "client_assertion_type": ASSERTION_TYPE,
            "client_assertion": client_assertion, **extra}
    if scope is not None:
        form["scope"] = scope
    return form


class JwksHost:
    """A JWKS served over HTTP on loopback (`url`), counting its requests (`hits`); `document` may
    be replaced at any time (the backend rotating its keys), and `status` set (the host failing).
    `hold()`: the requests after it are read and left unanswered (`asked` is set) until `release()`."""

    def __init__(self, document: dict):
        self.document = document
        self.status = 200  # set to e.g. 503: the host is down
        self.hits = 0
        self.held = False
        self.asked = threading.Event()
        self._released = threading.Event()
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                host.hits += 1
                if host.held:
                    host.asked.set()
                    host._released.wait(60)
                body = json.dumps(host.document).encode()
                self.send_response(host.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def hold(self):
        self.held = True

    def release(self):
        self.held = False
        self._released.set()

    def close(self):
        self.release()
        self.server.shutdown()
        self.server.server_close()
