"""Console developers' TOTP secrets at rest: sealed under SVC_HMAC_KEY (`SecretHasher.seal`), bound to
the developer, so a database dump does not give anyone's second factor. A secret must be read back
to check a code, so it cannot be hashed. Rows an earlier release wrote in clear still work, and
`keys rekey` seals them (and re-seals what a previous key sealed)."""
from __future__ import annotations

from models.developers import Developer, DeveloperInvite

TOTP_SEALED = "sealed:"
"""The mark of a sealed TOTP secret; a row without it holds one stored in clear by an earlier release."""
RETIRED = "totp-secrets"
"""What SVC_HMAC_KEY_RETIRED names to start although developers' TOTP secrets need a key not given."""


def _totp_context(developer_id: str) -> str:
    return f"console-totp\x00{developer_id}"


def seal_totp(runtime, developer_id: str, secret: str) -> str:
    """A developer's TOTP secret as stored (invitation and account rows alike): sealed under
    SVC_HMAC_KEY and bound to the developer, so a database dump does not give the second factor."""
    return TOTP_SEALED + runtime.hasher.seal(secret, _totp_context(developer_id))


def open_totp(runtime, developer_id: str, stored: str | None) -> str | None:
    """The TOTP secret of a stored value (`seal_totp`'s, or an earlier release's clear one); None
    when there is none, or no configured key opens it."""
    if not stored:
        return None
    if not stored.startswith(TOTP_SEALED):
        return stored
    return runtime.hasher.unseal(stored[len(TOTP_SEALED):], _totp_context(developer_id))


def _totp_rows():
    """(model, query) of every stored TOTP secret: developers' and unused invitations'."""
    return ((Developer, Developer.select(Developer.id, Developer.id.alias("owner"), Developer.totp_secret)
             .where(Developer.totp_secret.is_null(False))),
            (DeveloperInvite, DeveloperInvite.select(DeveloperInvite.token_hash.alias("id"),
                                                     DeveloperInvite.developer.alias("owner"), DeveloperInvite.totp_secret)
             .where(DeveloperInvite.totp_secret.is_null(False) & DeveloperInvite.used_at.is_null())))


def _to_reseal(runtime, owner: str, stored: str) -> str | None:
    """The secret of a stored value that needs sealing under the current key (stored in clear by an
    earlier release, or sealed under a previous key), else None."""
    if not stored.startswith(TOTP_SEALED):
        return stored
    opened = runtime.hasher.unseal_with(stored[len(TOTP_SEALED):], _totp_context(owner))
    return opened[0] if opened is not None and opened[1] > 0 else None


def reseal_totp_secrets(runtime) -> int:
    """`keys rekey`: seal under the current SVC_HMAC_KEY every TOTP secret an earlier key sealed (or
    an earlier release stored in clear); how many."""
    count = 0
    for model, query in _totp_rows():
        key = model._meta.primary_key
        for row in query.dicts():
            secret = _to_reseal(runtime, row["owner"], row["totp_secret"])
            if secret is not None:
                count += (model.update(totp_secret=seal_totp(runtime, row["owner"], secret))
                          .where((key == row["id"]) & (model.totp_secret == row["totp_secret"])).execute())
    return count


def old_totp_secrets(runtime) -> int:
    """TOTP secrets that need a previous key (or are in clear): `keys rekey`'s `still_old`."""
    return sum(1 for _, query in _totp_rows() for row in query.dicts()
               if _to_reseal(runtime, row["owner"], row["totp_secret"]) is not None)


def unopened_totp_secrets(runtime) -> int:
    """Developers whose sealed TOTP secret no configured key opens: their every code sign-in would
    fail (`serve` refuses to start, `keys.inventory.require_every_key`). An invitation's is not
    counted: opening the invitation offers a new one."""
    rows = Developer.select(Developer.id, Developer.totp_secret).where(Developer.totp_secret.is_null(False))
    return sum(1 for developer_id, stored in rows.tuples()
               if stored.startswith(TOTP_SEALED) and open_totp(runtime, developer_id, stored) is None)
