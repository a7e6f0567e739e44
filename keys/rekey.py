"""`svc-auth keys rekey`: move what can be moved from SVC_HMAC_KEY_PREVIOUS to SVC_HMAC_KEY.

Re-sealed under the current key: the signing keys and the EHR client keys (their private halves),
the console's TOTP secrets (an earlier release's clear ones sealed too),
and the disclosure chain (a reseal checkpoint lets the current key vouch for the records an earlier
key linked, `audit.chain.reseal`). A client secret's hash cannot be re-made without the secret: it
is re-hashed on the application's next successful authentication (`oauth.secret_rotation`), and
counted here until then; so is every other keyed hash an earlier key made and still live
(`keys.inventory`: refresh tokens, re-made under the current key on their next use; codes,
invitations, sessions, sign-in links). Before anything changes, the chain is checked against the
keys: keys the wrong way round are refused (they would close the key the other hosts link under),
and so is a rekey while a live host still links under another key (`keys.holders`: each process
that links records notes its key with a heartbeat). When every count of `still_old` is 0, no host needs SVC_HMAC_KEY_PREVIOUS.
"""
from __future__ import annotations


from audit.chain import check_keys, reseal
from audit.disclosures import chain_keys
from keys.ehr_client import AAD_PREFIX
from keys.holders import hosts_on_old_key
from keys.inventory import still_old
from keys.totp import old_totp_secrets, reseal_totp_secrets
from keys.signing import TOPIC as SIGNING_KEYS
from models.audit import AuditEvent
from models.ehr import EhrClientKey
from models.keys import SigningKeyRecord


def _reseal_rows(cipher, model, prefix: str) -> int:
    """Re-seal under the current key every row of `model` an earlier key sealed; how many.
    (A row no configured key opens stops the command: KeyDecryptionError names SVC_HMAC_KEY.)"""
    count = 0
    for row in model.select(model.kid, model.private_key):
        pem, by = cipher.open_with(prefix + row.kid, row.private_key)
        if by:
            count += (model.update(private_key=cipher.seal(prefix + row.kid, pem))
                      .where((model.kid == row.kid) & (model.private_key == row.private_key)).execute())
    return count


def _old_rows(cipher, model, prefix: str) -> int:
    return sum(1 for row in model.select(model.kid, model.private_key)
               if cipher.open_with(prefix + row.kid, row.private_key)[1])


def rekey(runtime, actor: str = "operator") -> dict:
    """Re-seal what can be re-sealed; `{"resealed": N, "still_old": {kind: count}}`, plus
    `audit_error` when the disclosure chain does not verify (it is then left as it is), or
    `refused` (`{"cause", "reason"}`, nothing changed) when the keys contradict what the chain
    holds: SVC_HMAC_KEY and SVC_HMAC_KEY_PREVIOUS the wrong way round, or a host still linking
    under the old key (`audit.chain._Walk.contradiction`), or while a live process links under
    another key (`keys.holders.hosts_on_old_key`: cause `hosts_on_old_key`)."""
    cipher = runtime.keyring.cipher
    keys = chain_keys(runtime)
    checked = check_keys(runtime.db, keys)
    if checked.get("refused"):
        return _refused(runtime, actor, checked["refused"], checked["still_old"])
    waiting = hosts_on_old_key(runtime)
    if waiting:
        return _refused(runtime, actor, waiting, checked["still_old"])
    chain = reseal(runtime.db, keys, runtime.clock.now, {"actor": actor, "reason": "keys rekey"},
                   guard=lambda: hosts_on_old_key(runtime))
    if chain.get("refused"):  # a record linked, or a host on the old key started, between the check and the lock
        return _refused(runtime, actor, chain["refused"], chain["still_old"])
    # The keys only once the chain's guard let the rekey through: a refusal changes nothing (a host
    # still on the old key could not open signing keys sealed under the new one)
    resealed_keys = _reseal_rows(cipher, SigningKeyRecord, "")
    ehr = _reseal_rows(cipher, EhrClientKey, AAD_PREFIX)
    totp = reseal_totp_secrets(runtime)
    result = {"resealed": resealed_keys + ehr + totp + chain["resealed"],
              "still_old": {"signing_keys": _old_rows(cipher, SigningKeyRecord, ""),
                            "ehr_client_keys": _old_rows(cipher, EhrClientKey, AAD_PREFIX),
                            "totp_secrets": old_totp_secrets(runtime),
                            **still_old(runtime), "audit_records": chain["still_old"]}}
    if not chain["ok"]:
        result["audit_error"] = {"first_bad": chain["first_bad"], "reason": chain["reason"]}
    AuditEvent.record(actor, "keys.rekeyed", runtime.hasher.key_id, signing_keys=resealed_keys, ehr_client_keys=ehr,
                      totp_secrets=totp,
                      audit_records=chain["resealed"], still_old=result["still_old"])
    if resealed_keys:
        runtime.changes.announce(SIGNING_KEYS)
    return result


def _refused(runtime, actor: str, refused: dict, chain_old: int) -> dict:
    cipher = runtime.keyring.cipher
    result = {"resealed": 0,
              "still_old": {"signing_keys": _old_rows(cipher, SigningKeyRecord, ""),
                            "ehr_client_keys": _old_rows(cipher, EhrClientKey, AAD_PREFIX),
                            "totp_secrets": old_totp_secrets(runtime),
                            **still_old(runtime), "audit_records": chain_old},
              "refused": refused}
    AuditEvent.record(actor, "keys.rekey_refused", runtime.hasher.key_id, **refused)
    return result
