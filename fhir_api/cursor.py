"""The FHIR API's paging position on a FHIR clinic: a signed cursor holding the EHR's own position.

A page of a search through a FHIR clinic ends somewhere in one of the EHR's pages. Its `next` link
carries `_cursor`: the URL of that EHR page relative to the clinic's FHIR base (the search's first,
or a `next` link the EHR sent; never the EHR's host),
how many of its matches were already served, and how many the search served before it, under an
HMAC (`keys.secrets.SecretHasher.sign`, as the project's other signed values; checked against every
configured key) bound to the token's clinic and patient, the type and the search's parameters, and
expiring after `CURSOR_SECONDS`. The next page starts there: no page restarts the EHR's search.
"""
from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from urllib.parse import urlencode

from fhir_api.outcome import invalid

CURSOR_PARAM = "_cursor"
CURSOR_SECONDS = 3600
"""How long a `next` link of a FHIR clinic's search may be followed."""
MAX_CURSOR_CHARS = 64 * 1024
"""What a request carries (a request line, or a POST `_search` form, is at most 64 KiB): the cursor holds
an EHR page's URL whose search values are percent-encoded, so values within the search limits (512
characters each, a non-ASCII one 6 to 12 characters once encoded) make cursors of many KiB."""
LABEL = "svc-auth fhir cursor v1"
UNBOUND = frozenset(("_count", "_offset", "_format", CURSOR_PARAM))
"""Parameters a cursor does not bind (a page's size may change from one page to the next)."""


@dataclass(frozen=True)
class Position:
    """Where the next page starts: the EHR page at `link` (None: the search's first page), after its
    first `skip` matches; `served` matches came before it (for `total`)."""

    link: str | None = None
    skip: int = 0
    served: int = 0


def binding(organization_id: str, patient: str | None, resource_type: str, applied: dict) -> str:
    """What a cursor is bound to: the clinic, the token's patient, the type and the search's parameters."""
    pairs = sorted((name, value) for name, values in applied.items() if name not in UNBOUND for value in values)
    return "|".join((organization_id, patient or "", resource_type, urlencode(pairs)))


def seal(hasher, position: Position, bound: str, now: float) -> str:
    """The cursor of `position`: base64url(JSON) "." MAC."""
    payload = json.dumps({"l": position.link, "k": position.skip, "n": position.served, "e": int(now) + CURSOR_SECONDS},
                         separators=(",", ":"))
    text = base64.urlsafe_b64encode(payload.encode()).rstrip(b"=").decode()
    return f"{text}.{hasher.sign(f'{LABEL}|{bound}|{text}')}"


def unseal(hasher, cursor: str, bound: str, now: float) -> Position:
    """The position a cursor holds, or 400 when it was not made for this search (another clinic,
    patient, type or parameters), was altered, or expired."""
    text, _, mac = cursor.partition(".")
    if len(cursor) > MAX_CURSOR_CHARS or not text or not hasher.verify(f"{LABEL}|{bound}|{text}", mac):
        raise invalid(f"{CURSOR_PARAM} is not a paging position of this search; follow the Bundle's next link as given.")
    try:
        fields = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        link, skip, served, expires = fields["l"], int(fields["k"]), int(fields["n"]), int(fields["e"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise invalid(f"{CURSOR_PARAM} is not a paging position of this search.") from None
    if expires <= now:
        raise invalid(f"{CURSOR_PARAM} expired: search again from the first page.")
    if (link is not None and not isinstance(link, str)) or skip < 0 or served < 0:
        raise invalid(f"{CURSOR_PARAM} is not a paging position of this search.")
    return Position(link, skip, served)
