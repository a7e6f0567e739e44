"""Who holds a listener's connections: SVC_HL7_MAX_CONNECTIONS in all, SVC_HL7_MAX_CONNECTIONS_PER_PEER
per peer (`ops.addresses.counted_as`: an IPv4 address, an IPv6 /64), and half of them for senders never proven.

A connection is *proven* once a message on it passed the sender checks (`store.Outcome.sender_passed`:
its MSH-4 names a clinic whose address list and client certificates accept it), whatever its ACK;
its peer is then remembered (the `PROVEN_PEERS` most recent). Connections neither proven nor from
a remembered peer, PROXY headers still being read included, hold at most half the slots, so
connections that never send a clinic's message, from however many addresses, cannot take the
slots of the clinics' interfaces. One `Slots` per listener; IOLoop only (no lock).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


PROVEN_PEERS = 4096
"""How many proven peers a listener remembers (the most recently proven; the oldest is forgotten)."""


@dataclass
class Slot:
    """One connection counted: its peer's key, and whether a message on it passed the sender checks."""
    key: str
    proven: bool = False


class Slots:
    """One listener's connections counted, and the peers it remembers as proven."""

    def __init__(self, total: int, per_peer: int, remembered: int = PROVEN_PEERS):
        self.total = total
        self.per_peer = per_peer
        self.unproven_cap = max(1, total // 2)
        self.remembered = remembered
        self.unknown = 0  # connections whose peer is not known yet (reading their PROXY header)
        self.held: dict[str, int] = {}  # peer key -> its connections
        self.unproven: dict[str, int] = {}  # peer key -> those of its connections not proven
        self.proven: OrderedDict[str, None] = OrderedDict()  # proven peer keys, least recent first

    def open(self) -> int:
        return self.unknown + sum(self.held.values())

    def open_unproven(self) -> int:
        """Connections neither proven nor from a remembered peer (PROXY headers being read included)."""
        return self.unknown + sum(n for key, n in self.unproven.items() if key not in self.proven)

    def refusal(self, key: str | None) -> str | None:
        """Why one more connection from `key` (None: not known yet, only the whole cap applies) is
        closed at once; None: it may be taken."""
        if self.open() >= self.total:
            return f"{self.open()} connections open (SVC_HL7_MAX_CONNECTIONS)"
        if key is None:
            return None
        if self.held.get(key, 0) >= self.per_peer:
            return f"{key} already has {self.held[key]} connections open (SVC_HL7_MAX_CONNECTIONS_PER_PEER)"
        if key not in self.proven and self.open_unproven() >= self.unproven_cap:
            return (f"{self.open_unproven()} connections of senders never proven open (half of "
                    "SVC_HL7_MAX_CONNECTIONS)")
        return None

    def take(self, key: str) -> Slot:
        """Count a connection of `key` (admitted by `refusal`) until `release`."""
        _add(self.held, key, 1)
        _add(self.unproven, key, 1)
        return Slot(key)

    def prove(self, slot: Slot) -> None:
        """A message on `slot` passed the sender checks: it and its peer are proven."""
        if not slot.proven:
            slot.proven = True
            _add(self.unproven, slot.key, -1)
        self.proven[slot.key] = None
        self.proven.move_to_end(slot.key)
        while len(self.proven) > self.remembered:
            self.proven.popitem(last=False)

    def release(self, slot: Slot) -> None:
        _add(self.held, slot.key, -1)
        if not slot.proven:
            _add(self.unproven, slot.key, -1)


def _add(counts: dict[str, int], key: str, n: int) -> None:
    left = counts.get(key, 0) + n
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
