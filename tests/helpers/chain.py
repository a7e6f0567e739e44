"""The disclosure chain as a thief of a retired key would use it."""
from __future__ import annotations


def a_record_the_old_key_links_is_refused(old, rotated) -> None:
    """Whoever holds the leaked old key (`old`'s) appends a record linked under it after the
    rotation: `audit verify` with `rotated`'s keys finds it, first."""
    from audit.chain import append, verify  # (imported here: the rotation tests run on older code too)
    from audit.disclosures import chain_keys
    from models.disclosures import DisclosureRecord
    append(rotated.db, chain_keys(old)[0], [{"action": "read", "outcome": "success", "patients": ["pat_x"]}],
           rotated.clock.now)
    forged = DisclosureRecord.select().order_by(DisclosureRecord.seq.desc()).first().seq
    result = verify(chain_keys(rotated))
    assert not result["ok"] and result["first_bad"] == forged, result
