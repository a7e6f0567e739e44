"""Clinics (organizations) and their users, as the host platform knows them."""
from __future__ import annotations

import peewee

from models.db import BaseModel, db_default, wall_now
from models.ids import new_id
from models.prepared import PreparedQuery


class Organization(BaseModel):
    """A clinic. `id` is the `svc_organization_id` partners see."""

    id = peewee.CharField(primary_key=True, max_length=64, default=lambda: new_id("org"))
    name = peewee.CharField(max_length=200)
    ehr = peewee.CharField(max_length=64, default="sandbox")
    ehr_url = peewee.CharField(max_length=500, default="")  # the FHIR base URL when `ehr` is `fhir`
    # Columns added by migrations carry their default in the database too (db_default): a release
    # that does not know them yet still inserts rows.
    fhir_client_id = peewee.CharField(max_length=200, default="", constraints=db_default(""))  # our id at that EHR
    # `smart-backend`, or `none`: an open test server
    fhir_auth = peewee.CharField(max_length=32, default="smart-backend", constraints=db_default("smart-backend"))
    # connectors.fhir.profiles: the vendor's rules
    fhir_profile = peewee.CharField(max_length=32, default="generic", constraints=db_default("generic"))
    # SMART scope syntax: auto (discovered), v1, v2
    fhir_scopes = peewee.CharField(max_length=8, default="auto", constraints=db_default("auto"))
    # JSON [[name, value]]: appended to every search
    fhir_search_params = peewee.TextField(default="[]", constraints=db_default("[]"))
    # IANA zone of the times an HL7 feed or Epic's web service sends without an offset (issue 47)
    time_zone = peewee.CharField(max_length=64, default="UTC", constraints=db_default("UTC"))
    # Epic's GetProviderAppointments web service (issue 47; connectors.fhir.epic_schedule): the Epic
    # user svc-auth calls it as ("" : not configured, the night tries FHIR), how physicians and
    # patients are identified to and by it.
    epic_user_id = peewee.CharField(max_length=200, default="", constraints=db_default(""))
    epic_user_id_type = peewee.CharField(max_length=64, default="External", constraints=db_default("External"))
    epic_provider_id_type = peewee.CharField(max_length=16, default="External", constraints=db_default("External"))
    epic_provider_id_system = peewee.CharField(max_length=500, default="", constraints=db_default(""))
    epic_patient_id_system = peewee.CharField(max_length=500, default="", constraints=db_default(""))
    created_at = peewee.DateTimeField(default=wall_now)
    # Where the night reads the clinic's schedule: `ehr` (its connector's pull) or `siu` (the
    # HL7v2 SIU feed it pushes, docs/hl7-feed.md). The feed's messages name the clinic by MSH-4
    # (`hl7_facility`, unique) and may come only from `hl7_allow` (JSON [CIDR], empty: anywhere)
    # and only over a connection whose client certificate's subject CN is one of
    # `hl7_client_subjects` (JSON [CN], empty: any certificate, or none).
    schedule_source = peewee.CharField(max_length=8, default="ehr", constraints=db_default("ehr"))
    hl7_facility = peewee.CharField(max_length=200, null=True)
    hl7_allow = peewee.TextField(default="[]", constraints=db_default("[]"))
    hl7_client_subjects = peewee.TextField(default="[]", constraints=db_default("[]"))


ONE_FACILITY = Organization.index(Organization.hl7_facility, unique=True, name="organization_hl7_facility")
"""One clinic per HL7 sending facility (NULLs, clinics without a feed, are not compared). Created by
migration 4701 only, after its column: `create_tables` runs before the migrations on an existing
table, where SQLite would read the missing column's quoted name as a string and index a constant."""


class User(BaseModel):
    """A clinician or staff member. `id` is the `sub` of every token issued for them."""

    id = peewee.CharField(primary_key=True, max_length=64, default=lambda: new_id("usr"))
    organization = peewee.ForeignKeyField(Organization, backref="users", on_delete="CASCADE")
    email = peewee.CharField(max_length=254, unique=True)
    given_name = peewee.CharField(max_length=200, null=True)
    family_name = peewee.CharField(max_length=200, null=True)
    ehr_username = peewee.CharField(max_length=200, null=True)
    npi = peewee.CharField(max_length=10, null=True)
    invited_at = peewee.DateTimeField(null=True)
    activated_at = peewee.DateTimeField(null=True)
    created_at = peewee.DateTimeField(default=wall_now)

    @classmethod
    def with_organization(cls, user_id: str | None) -> "User | None":
        """The user with this id and its `organization` read in the same query, or None."""
        return _USER_WITH_ORGANIZATION.first(user_id) if isinstance(user_id, str) else None

    @property
    def display_name(self) -> str:
        return " ".join(p for p in (self.given_name, self.family_name) if p) or self.email


_USER_WITH_ORGANIZATION = PreparedQuery(
    lambda user_id: User.select(User, Organization).join(Organization).where(User.id == user_id).limit(1),
    User.id, attach={Organization: "organization"})
