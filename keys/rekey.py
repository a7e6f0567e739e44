"""`svc-auth keys rekey`: move what can be moved from SVC_HMAC_KEY_PREVIOUS to SVC_HMAC_KEY.

Re-sealed under the current key: the signing keys and the EHR client keys (their private halves),
and the disclosure chain (a reseal checkpoint lets the current key vouch for the records an earlier
key linked, `audit.chain.reseal`). A client secret's hash cannot be re-made without the secret: it
is re-hashed on the application's next successful authentication (`oauth.secret_rotation`), and
counted here until then. When every count of `still_old` is 0, no host needs SVC_HMAC_KEY_PREVIOUS.
"""
from __future__ import annotations


from audit.chain import reseal
from audit.disclosures import chain_keys
from keys.ehr_client import AAD_PREFIX
from keys.signing import TOPIC as SIGNING_KEYS
from models.application import Application
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


def old_client_secrets(hasher) -> int:
    """Confidential applications whose current or pending secret hash the current key is not known
    to have made (0 when no previous key is configured: nothing else can verify them)."""
    if not hasher.rotating:
        return 0
    current = ((Application.client_secret_hash != "") & (Application.public == False)  # noqa: E712
               & (Application.secret_key_id.is_null() | (Application.secret_key_id != hasher.key_id)))
    pending = (Application.fallback_secret_hash.is_null(False)
               & (Application.fallback_key_id.is_null() | (Application.fallback_key_id != hasher.key_id)))
    return Application.select().where(current | pending).count()


def rekey(runtime, actor: str = "operator") -> dict:
    """Re-seal what can be re-sealed; `{"resealed": N, "still_old": {kind: count}}`, plus
    `audit_error` when the disclosure chain does not verify (it is then left as it is)."""
    cipher = runtime.keyring.cipher
    keys = _reseal_rows(cipher, SigningKeyRecord, "")
    ehr = _reseal_rows(cipher, EhrClientKey, AAD_PREFIX)
    chain = reseal(runtime.db, chain_keys(runtime), runtime.clock.now, {"actor": actor, "reason": "keys rekey"})
    result = {"resealed": keys + ehr + chain["resealed"],
              "still_old": {"signing_keys": _old_rows(cipher, SigningKeyRecord, ""),
                            "ehr_client_keys": _old_rows(cipher, EhrClientKey, AAD_PREFIX),
                            "client_secrets": old_client_secrets(runtime.hasher),
                            "audit_records": chain["still_old"]}}
    if not chain["ok"]:
        result["audit_error"] = {"first_bad": chain["first_bad"], "reason": chain["reason"]}
    AuditEvent.record(actor, "keys.rekeyed", runtime.hasher.key_id, signing_keys=keys, ehr_client_keys=ehr,
                      audit_records=chain["resealed"], still_old=result["still_old"])
    if keys:
        runtime.changes.announce(SIGNING_KEYS)
    return result



