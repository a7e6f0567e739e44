"""Every process that links disclosure records says, in the database, which SVC_HMAC_KEY it links
under (`models.key_holders.KeyHolder`), so `keys rekey` never closes a key a live host still uses.

A reseal checkpoint (`keys rekey`) closes the previous keys: a record a host still on the old key
links after it fails `audit verify`. The newest record says nothing of a host on the old key that
has not linked one since the new key did; its row here does. `serve` (each forked process),
`worker` and `snapshot run` write their row before they serve or work (`KeyHeartbeat.start`),
refresh `seen_at` every quarter of SVC_KEY_HOLDER_WINDOW on a thread of their own (never per
request or per record), and delete it on a clean shutdown. A row not seen within the window (a
host killed, its row left behind) holds nothing up.

The other way round, a process started at an earlier step after the rekey (SVC_HMAC_KEY the old
key, the new one only previous) would link under the key the reseal closed: it refuses to start
(`require_open_key`). Its first row and that look are one transaction under the chain's lock, so
a rekey either sees the row (and waits) or is seen (and the process refuses).
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
import socket
import threading

from conf import ConfigError
from models.db import DATABASE_ERRORS
from models.key_holders import KeyHolder

log = logging.getLogger("svc_auth.keys")


def holder_name() -> str:
    """This process, as its row names it: `<host>:<pid>:<random>` (a pid is reused after a restart)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class KeyHeartbeat:
    """One process's row in `key_holder`: `start()` writes it and keeps it fresh, `stop()` deletes it."""

    def __init__(self, runtime, role: str):
        self.runtime, self.role = runtime, role
        self.name = holder_name()
        self.interval = runtime.settings.key_holder_window / 4
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = runtime.clock.now()

    def beat(self, runtime=None) -> None:
        """Write this process's row, or refresh its `seen_at` and keys (one statement)."""
        hasher = self.runtime.hasher
        now = self.runtime.clock.now()
        values = {"key_id": hasher.key_id, "previous_key_ids": list(hasher.key_ids[1:]), "seen_at": now}
        (KeyHolder.insert(holder=self.name, host=socket.gethostname(), pid=os.getpid(), role=self.role,
                          started_at=self._started, **values)
         .on_conflict(conflict_target=[KeyHolder.holder], update=values).execute())

    def _first(self) -> None:
        self.beat()
        require_open_key(self.runtime)  # raised: the row is rolled back with the transaction

    def start(self, run_every) -> "KeyHeartbeat":
        """The first beat now (before this process links anything; ConfigError when its key was
        closed by a rekey, `require_open_key`), then one every quarter of the window, on a thread
        running the process's loop `run_every` (`workers.loops.run_every`, passed in: keys sits
        below workers)."""
        from audit.chain import under_lock
        try:
            self.runtime.connections.run(under_lock, self.runtime.db, self._first)
        except DATABASE_ERRORS:
            log.warning("could not note this process's SVC_HMAC_KEY in key_holder yet; the heartbeat retries")
        self._thread = threading.Thread(target=run_every, name="svc-key-heartbeat", daemon=True,
                                        args=(self.runtime, self._stop, self.interval, self.beat,
                                              "key heartbeat", log), kwargs={"at_once": False})
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the heartbeat and delete this process's row (a clean shutdown)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 5)
        try:
            self.runtime.connections.run(
                lambda: KeyHolder.delete().where(KeyHolder.holder == self.name).execute())
        except DATABASE_ERRORS:
            log.warning("could not delete this process's key_holder row; it lapses after SVC_KEY_HOLDER_WINDOW")


def live_holders(runtime) -> list[KeyHolder]:
    """The rows seen within SVC_KEY_HOLDER_WINDOW, oldest holder first."""
    since = runtime.clock.now() - dt.timedelta(seconds=runtime.settings.key_holder_window)
    return list(KeyHolder.select().where(KeyHolder.seen_at >= since).order_by(KeyHolder.started_at, KeyHolder.holder))


def hosts_on_old_key(runtime) -> dict | None:
    """`keys rekey`'s refusal (`{"cause": "hosts_on_old_key", "reason", "hosts"}`) while a live
    process links under a key other than this SVC_HMAC_KEY; None when none does."""
    current = runtime.hasher.key_id
    others = [h for h in live_holders(runtime) if h.key_id != current]
    if not others:
        return None
    hosts = [{"holder": h.holder, "host": h.host, "pid": h.pid, "role": h.role, "key_id": h.key_id,
              "seen_at": h.seen_at.isoformat(timespec="seconds") + "Z"} for h in others]
    named = ", ".join(f"{h['holder']} ({h['role']}, key {h['key_id']})" for h in hosts)
    return {"cause": "hosts_on_old_key",
            "reason": f"{len(hosts)} process(es) seen within SVC_KEY_HOLDER_WINDOW "
                      f"({runtime.settings.key_holder_window}s) still link disclosure records under a key other "
                      f"than SVC_HMAC_KEY (id {current}): {named}; a reseal now would close the key they link under. "
                      "Restart them with the new SVC_HMAC_KEY (or wait until they stop), then run keys rekey",
            "hosts": hosts}


def require_open_key(runtime) -> None:
    """Refuse (ConfigError, one line) a process whose SVC_HMAC_KEY a `keys rekey` closed: a
    checkpoint of the chain names its key as closed (`audit.chain.closed_by`, also after an `audit
    prune` removed the reseal checkpoint), or, for one of an earlier release, the newest reseal
    checkpoint is linked under one of its SVC_HMAC_KEY_PREVIOUS (it runs an earlier step of the
    rotation than the rekey did); its links would fail `audit verify`."""
    from audit.chain import closed_by, resealed_by
    from audit.disclosures import chain_keys
    keys = chain_keys(runtime)
    found = closed_by(runtime.db, keys)  # what the checkpoint says it closed survives an `audit prune`
    if found is None:
        found = resealed_by(runtime.db, keys)  # a reseal checkpoint of an earlier release names no key
        if found is None or found[1] == 0:
            return
    seq, by = found
    hasher = runtime.hasher
    under = f"the key this host has as SVC_HMAC_KEY_PREVIOUS (id {hasher.key_ids[by]})" if by else "another key"
    raise ConfigError(
        f"`svc-auth keys rekey` resealed the disclosure chain (checkpoint seq {seq}) under {under}, closing its "
        f"SVC_HMAC_KEY (id {hasher.key_id}): records it linked would fail `audit verify`. Set SVC_HMAC_KEY to the "
        "key the other hosts use and SVC_HMAC_KEY_PREVIOUS to this one (step 2 of the rotation, docs/operations.md)")
