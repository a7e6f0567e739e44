"""The signing ceiling: RS256 signatures per second of one core, raw `cryptography`, our key type."""
from __future__ import annotations

import time

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

# A typical JWS signing input of our access tokens (header.claims, base64url), same length class.
SIGNING_INPUT = (b"eyJhbGciOiJSUzI1NiIsImtpZCI6IkZxSGhBTUlDSEpzZzRqVHY1Ulh4aFduTUM0RkFreDA1bjl0R1hYbVRVLVEiLCJ0eXAi"
                 b"OiJhdCtqd3QifQ.eyJpc3MiOiJodHRwOi8vMTI3LjAuMC4xOjg4ODgvIiwic3ViIjoiYXBwXzEyMyIsImF1ZCI6InBhcnRuZ"
                 b"XItYXBpIiwiaWF0IjoxNzAwMDAwMDAwLCJleHAiOjE3MDAwMDAzMDAsImp0aSI6ImFiY2RlZmdoaWprbG1ub3AiLCJjbGllb"
                 b"nRfaWQiOiJjbGllbnQtMTIzIiwic2NvcGUiOiJwYXJ0bmVyX2FwaSJ9")


def signing_ceiling(private_key: rsa.RSAPrivateKey, seconds: float) -> dict:
    """Sign for `seconds` on this thread; signatures per second (PKCS#1 v1.5, SHA-256)."""
    sign, pad, algo = private_key.sign, padding.PKCS1v15(), hashes.SHA256()
    for _ in range(20):
        sign(SIGNING_INPUT, pad, algo)
    count, started, cpu_started = 0, time.perf_counter(), time.thread_time()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            sign(SIGNING_INPUT, pad, algo)
        count += 50
    elapsed = time.perf_counter() - started
    cpu = time.thread_time() - cpu_started
    # per_cpu_second: what one core signs when it is ours alone (the machine may be shared, so
    # wall-clock signatures/s can understate the ceiling).
    return {"signatures": count, "seconds": round(elapsed, 2), "per_second": round(count / elapsed, 1),
            "cpu_seconds": round(cpu, 2), "per_cpu_second": round(count / max(cpu, 1e-9), 1),
            "key": f"RSA-{private_key.key_size}", "algorithm": "RS256 (PKCS#1 v1.5 + SHA-256)"}
