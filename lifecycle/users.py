"""Users (clinicians) of an organization: create and update, with their e-mail and NPI rules."""
from __future__ import annotations

import re
import unicodedata

import peewee

from lifecycle.organizations import find_organization, invalid
from models.audit import AuditEvent
from models.directory import User
from models.npi import is_npi
from errors import ApiError

EMAIL = re.compile(r"^[^@\s]{1,64}@[^@\s]+\.[^@\s]+$")


_LABEL_SEPARATORS = str.maketrans({"\u3002": ".", "\uff61": "."})  # IDNA reads these full stops as dots
_INVISIBLE = ("Cc", "Cf")  # control and format characters (a zero-width space, a direction mark)


def normal_email(email: str | None) -> str:
    """An address as svc-auth stores and looks it up: NFKC (a fullwidth or decomposed spelling is
    the same address), trimmed, lower-cased, its domain's ideographic full stops read as dots."""
    email = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", email or "").strip().lower())
    local, at, domain = email.rpartition("@")
    return local + at + domain.translate(_LABEL_SEPARATORS)


def clean_email(email: str | None) -> str:
    """`normal_email`; 400 when it is not a plausible e-mail address: no `local@domain.tld`, an
    empty domain label (`a@.b.c`, `a@b..c`, `a@b.c.`), or an invisible character."""
    email = normal_email(email)
    if (not EMAIL.fullmatch(email) or len(email) > 254 or "" in email.rpartition("@")[2].split(".")
            or any(unicodedata.category(char) in _INVISIBLE for char in email)):
        raise invalid(f"{email!r} is not a valid e-mail address.")
    return email


def clean_npi(npi: str | None) -> str | None:
    """A National Provider Identifier (`models.npi`: 10 ASCII digits, whole), or None when empty;
    400 otherwise."""
    if npi and not is_npi(npi):
        raise invalid("npi must be 10 digits.")
    return npi or None


def clean_name_field(field: str, value: str | None) -> str | None:
    """A given name, family name or EHR username (None or "": none); 400 past the column's width (200
    characters), which PostgreSQL refuses and SQLite would store."""
    width = getattr(User, field).max_length
    if value and len(value) > width:
        raise invalid(f"{field} (--{field.replace('_', '-')}) must be at most {width} characters.")
    return value or None


def create_user(organization_id: str, email: str, given_name: str | None = None, family_name: str | None = None,
                ehr_username: str | None = None, npi: str | None = None, user_id: str | None = None) -> User:
    org = find_organization(organization_id)
    email = clean_email(email)
    fields = dict(organization=org.id, email=email, given_name=clean_name_field("given_name", given_name),
                  family_name=clean_name_field("family_name", family_name),
                  ehr_username=clean_name_field("ehr_username", ehr_username), npi=clean_npi(npi))
    if user_id:
        fields["id"] = user_id
    try:
        return User.create(**fields)
    except peewee.IntegrityError:
        raise ApiError(409, "email_taken", f"A user with e-mail {email} already exists.") from None


def update_user(user_id: str, email: str | None = None, given_name: str | None = None,
                family_name: str | None = None, ehr_username: str | None = None, npi: str | None = None,
                actor: str = "operator") -> User:
    """Change a user's fields (None: unchanged; "" clears an optional field); audited."""
    user = User.get_or_none(User.id == user_id)
    if user is None:
        raise ApiError(404, "user_not_found", f"No user has id {user_id!r}.")
    changes: dict = {}
    if email is not None:
        changes["email"] = email = clean_email(email)
    for field, value in (("given_name", given_name), ("family_name", family_name), ("ehr_username", ehr_username)):
        if value is not None:
            changes[field] = clean_name_field(field, value.strip())
    if npi is not None:
        changes["npi"] = clean_npi(npi)
    if changes:
        try:
            with User._meta.database.atomic():
                User.update(**changes).where(User.id == user.id).execute()
        except peewee.IntegrityError:
            raise ApiError(409, "email_taken", f"A user with e-mail {email} already exists.") from None
        AuditEvent.record(actor, "user.updated", user.id, fields=sorted(changes))
    return User.get_by_id(user.id)
