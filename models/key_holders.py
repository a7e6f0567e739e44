"""Which SVC_HMAC_KEY each process that links disclosure records links under (`keys.holders`).

One row per running `serve` process (each forked one), `worker` and `snapshot run`: written at its
start, its `seen_at` refreshed by a heartbeat, deleted on a clean shutdown. `keys rekey` refuses
while a row seen within SVC_KEY_HOLDER_WINDOW names a key other than its SVC_HMAC_KEY.
"""
from __future__ import annotations

import peewee

from models.db import BaseModel, JSONText


class KeyHolder(BaseModel):
    holder = peewee.CharField(primary_key=True, max_length=200)  # "<host>:<pid>:<random>": one process
    host = peewee.CharField(max_length=255)
    pid = peewee.IntegerField()
    role = peewee.CharField(max_length=32)  # serve | worker | snapshot
    key_id = peewee.CharField(max_length=16)  # the SVC_HMAC_KEY it links under (keys.secrets.key_id)
    previous_key_ids = JSONText(default=list)  # its SVC_HMAC_KEY_PREVIOUS, in order
    started_at = peewee.DateTimeField()
    seen_at = peewee.DateTimeField(index=True)  # naive UTC, the holder's clock

    class Meta:
        table_name = "key_holder"
