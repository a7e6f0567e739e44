"""An `audit prune` after a `keys rekey` must not reopen the key the rekey closed: the reseal
checkpoint (or what it vouched for) going with the retention must not let a host at step 1 of
the rotation start again and link under the old key, nor let `audit verify` accept a record a
leaked old key links after it."""
from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from audit.chain import append, prune, verify
from audit.disclosures import Disclosure, chain_key, chain_keys, record
from conf import ConfigError
from helpers.chain import a_record_the_old_key_links_is_refused
from keys.holders import require_open_key
from keys.rekey import rekey
from keys.secrets import SecretHasher
from models.disclosures import DisclosureRecord
from runtime import Runtime

pytestmark = pytest.mark.svc_settings(own_keys=True)

OLD, NEW = "k" * 32, "n" * 40  # the session's SVC_HMAC_KEY (conftest) and the one it rotates to
NEW_ONLY = SecretHasher(NEW.encode()).derive_all(b"svc-auth disclosure chain v1")


def step1_is_refused(rotated) -> None:
    """A process configured as at step 1 (SVC_HMAC_KEY=OLD, SVC_HMAC_KEY_PREVIOUS=NEW) refuses to start.
    (Its keys on the same database: another Runtime would bind the models to its own.)"""
    step1 = SimpleNamespace(db=rotated.db, hasher=SecretHasher(OLD.encode(), (NEW.encode(),)))
    with pytest.raises(ConfigError, match="keys rekey"):
        require_open_key(step1)


def disclose(runtime, n: int) -> None:
    for i in range(n):
        record(runtime, Disclosure("read", organization_id="org_p", user_id=f"usr_{i}", resource_type="Patient",
                                   resource_ids=(f"pat_{i}",), patients=(f"pat_{i}",)), "success", 200)


@pytest.mark.parametrize("prune_to", ["the_old_records", "everything"])
def test_a_prune_after_a_rekey_keeps_the_old_key_closed(settings, runtime, prune_to):
    earlier = Runtime(settings.replace(clock_offset=-3600))
    try:
        disclose(earlier, 3)  # an hour ago, under OLD
    finally:
        earlier.close()
    rotated = Runtime(settings.replace(hmac_key=NEW, hmac_key_previous=(OLD,)))
    try:
        assert rekey(rotated)["still_old"]["audit_records"] == 0  # the reseal checkpoint, now
        disclose(rotated, 2)
        step1_is_refused(rotated)
        now = rotated.clock.now()
        before = now - dt.timedelta(minutes=30) if prune_to == "the_old_records" else now + dt.timedelta(minutes=1)
        result = prune(rotated.db, chain_key(rotated), before, rotated.clock.now, {"actor": "test"})
        assert result["removed"] >= 3
        assert verify(NEW_ONLY)["ok"] and verify(chain_keys(rotated))["ok"]
        # A host (or `audit prune`) started at step 1 after the prune is still refused.
        step1_is_refused(rotated)
        a_record_the_old_key_links_is_refused(runtime, rotated)  # refused by a verify that knows OLD too
    finally:
        rotated.close()



def test_after_a_prune_the_next_rotation_runs_as_the_first(settings, runtime):
    """What a prune carries on closes only the keys closed before what it removed: the next rotation
    (NEW to NEWER) links under both keys side by side until its own rekey, which closes NEW."""
    newer = "w" * 48
    for keys in ({}, {"hmac_key": NEW, "hmac_key_previous": (OLD,)}):
        earlier = Runtime(settings.replace(clock_offset=-3600, **keys))
        try:  # an hour ago: records under OLD, then the first rotation's rekey
            disclose(earlier, 2) if not keys else rekey(earlier)
        finally:
            earlier.close()
    second = Runtime(settings.replace(hmac_key=newer, hmac_key_previous=(NEW,)))
    step1 = SimpleNamespace(db=second.db, hasher=SecretHasher(NEW.encode(), (newer.encode(),)))
    try:
        # step 1 of the next rotation under NEW, then step 2 under NEWER
        append(second.db, chain_keys(step1)[0], [{"action": "read", "outcome": "success"}], second.clock.now)
        disclose(second, 2)
        require_open_key(step1)
        prune(second.db, chain_key(second), second.clock.now() - dt.timedelta(minutes=30), second.clock.now,
              {"actor": "test"})  # the first rotation's records and its reseal checkpoint
        assert DisclosureRecord.select().where(DisclosureRecord.seq == 1).count() == 0
        assert verify(chain_keys(second))["ok"], verify(chain_keys(second))
        require_open_key(step1)  # NEW is not closed before the next rekey
        result = rekey(second)
        assert result["still_old"]["audit_records"] == 0 and "refused" not in result, result
        prune(second.db, chain_key(second), second.clock.now() + dt.timedelta(minutes=1), second.clock.now,
              {"actor": "test"})
        newer_only = SecretHasher(newer.encode()).derive_all(b"svc-auth disclosure chain v1")
        assert verify(newer_only)["ok"] and verify(chain_keys(second))["ok"]
        with pytest.raises(ConfigError, match="keys rekey"):
            require_open_key(step1)  # NEW is closed now, and stays closed after the prune
    finally:
        second.close()
