"""One-time artefacts of the launch flow: launches and authorization codes."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import peewee

from models.application import Application, Installation
from models.db import BaseModel, wall_now
from models.directory import Organization, User
from models.prepared import PreparedQuery


class Launch(BaseModel):
    """A launch identifier the host platform minted for one user opening one app."""

    id = peewee.CharField(primary_key=True, max_length=64)
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    user = peewee.ForeignKeyField(User, on_delete="CASCADE")
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    created_at = peewee.DateTimeField(default=wall_now)
    expires_at = peewee.DateTimeField()
    used_at = peewee.DateTimeField(null=True)
    # When the user authenticated with the platform (epoch seconds): the ID token's auth_time.
    auth_time = peewee.BigIntegerField(null=True)
    # SMART launch context: the patient the app was launched for (a FHIR Patient id), if any.
    patient_id = peewee.CharField(max_length=64, null=True)

    class Meta:
        # Each app's and user's newest launch (`last_launch_at`), which retention keeps (workers.retention).
        indexes = ((("application", "user", "created_at"), False),)

    @classmethod
    def of_application(cls, launch_id: str, application_id: str) -> "Launch | None":
        """The launch `launch_id` issued for `application_id`, with `launch.installation` (that app's
        installation in the launch's clinic, or None) read in the same query."""
        return _LAUNCH_WITH_INSTALLATION.first(launch_id, application_id)

    def consume(self, now: dt.datetime) -> bool:
        """Mark the launch used at `now`; True for exactly one caller (the database decides)."""
        claimed = (Launch.update(used_at=now)
                   .where((Launch.id == self.id) & Launch.used_at.is_null() & (Launch.expires_at > now))
                   .execute())
        return claimed == 1


_LAUNCH_WITH_INSTALLATION = PreparedQuery(
    lambda launch_id, application_id: Launch.select(Launch, Installation).join(
        Installation, peewee.JOIN.LEFT_OUTER, on=((Installation.application == Launch.application)
                                                  & (Installation.organization == Launch.organization)))
    .where((Launch.id == launch_id) & (Launch.application == application_id)).limit(1),
    Launch.id, Launch.application, attach={Installation: "installation"})


class AuthorizationCode(BaseModel):
    """An authorization code, stored by hash; bound to client, redirect_uri, user and launch."""

    code_hash = peewee.CharField(primary_key=True, max_length=128)
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    user = peewee.ForeignKeyField(User, on_delete="CASCADE")
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    launch = peewee.ForeignKeyField(Launch, null=True, on_delete="SET NULL")
    redirect_uri = peewee.CharField(max_length=1000)
    nonce = peewee.CharField(max_length=500, null=True)
    code_challenge = peewee.CharField(max_length=64, null=True)  # PKCE S256 (oauth/pkce.py)
    created_at = peewee.DateTimeField(default=wall_now)
    expires_at = peewee.DateTimeField()
    used_at = peewee.DateTimeField(null=True)
    # The jtis of the access tokens the code's exchange issued (space-separated): a replay of the
    # code puts them on the deny-list (oauth.denylist). Written by the consuming statement.
    issued_jtis = peewee.CharField(max_length=500, null=True)
    auth_time = peewee.BigIntegerField(null=True)  # copied from the launch
    scope = peewee.TextField(null=True)  # granted scope (oauth.scopes; SMART scopes can be long)
    patient_id = peewee.CharField(max_length=64, null=True)  # copied from the launch (SMART context)
    key_id = peewee.CharField(max_length=16, null=True)  # which SVC_HMAC_KEY made code_hash
    # When the code was first presented again (a replay), by the consuming statement: the first use's
    # refresh grant is started only while this is NULL, under the code row's lock
    # (`oauth.smart_grants.start_grant`), so a replay either sees that grant to revoke it or stops it.
    replayed_at = peewee.DateTimeField(null=True)

    @classmethod
    def redeem(cls, db: peewee.Database, code_hash: str, application_id: str, now: dt.datetime,
               jtis: str) -> "Redemption | None":
        """Consume the code in ONE statement and read what the exchange needs with it.

        The UPDATE sets `used_at` and `issued_jtis` only if the code is unused (COALESCE keeps
        the first use's values), `replayed_at` only if it was used, and returns the row with the user's and the installation's
        columns (scalar subqueries, which SQLite >= 3.35 and PostgreSQL both allow in RETURNING).
        The row lock (PostgreSQL) or the write lock (SQLite) serialises concurrent exchanges:
        the caller whose `jtis` came back consumed the code; anyone else sees the first use's
        jtis, to revoke them. None: no such code for this application."""
        p = db.param
        row = db.execute_sql(_REDEEM_SQL.format(p=p), (
            AuthorizationCode.used_at.db_value(now), jtis, AuthorizationCode.replayed_at.db_value(now), code_hash,
            application_id)).fetchone()
        if row is None:
            return None
        (used_at, issued, expires_at, redirect_uri, nonce, code_challenge, auth_time, scope, patient_id, launch_id,
         user_id, organization_id, email, given_name, family_name, installation_id, activation_status, trial_started_at) = row
        user = User(id=user_id, organization=organization_id, email=email, given_name=given_name,
                    family_name=family_name)
        installation = None
        if installation_id is not None:
            installation = Installation(id=installation_id, application=application_id, organization=organization_id,
                                        activation_status=activation_status,
                                        trial_started_at=Installation.trial_started_at.python_value(trial_started_at))
        return Redemption(first_use=issued == jtis, issued_jtis=(issued or "").split(), code_hash=code_hash,
                          expires_at=AuthorizationCode.expires_at.python_value(expires_at),
                          used_at=AuthorizationCode.used_at.python_value(used_at),
                          redirect_uri=redirect_uri, nonce=nonce, user=user, organization_id=organization_id,
                          installation=installation, code_challenge=code_challenge, auth_time=auth_time,
                          scope=scope, patient_id=patient_id, launch_id=launch_id)


@dataclass(frozen=True)
class Redemption:
    """What `AuthorizationCode.redeem` read: the code, its user and its installation (or None)."""

    first_use: bool
    issued_jtis: list
    code_hash: str
    expires_at: dt.datetime
    used_at: dt.datetime
    redirect_uri: str
    nonce: str | None
    user: User
    organization_id: str
    installation: Installation | None
    code_challenge: str | None = None  # PKCE S256 (oauth/pkce.py)
    auth_time: int | None = None  # when the user authenticated with the platform (from the launch)
    scope: str | None = None      # the granted scope (oauth/scopes.py)
    patient_id: str | None = None  # the launch's patient context (SMART), if any
    launch_id: str | None = None  # the launch the code came from (a SMART grant records it)


_REDEEM_SQL = """UPDATE "authorization_code" SET used_at = COALESCE(used_at, {p}), issued_jtis = COALESCE(issued_jtis, {p}),
 replayed_at = CASE WHEN used_at IS NULL THEN replayed_at ELSE COALESCE(replayed_at, {p}) END
WHERE code_hash = {p} AND application_id = {p}
RETURNING used_at, issued_jtis, expires_at, redirect_uri, nonce, code_challenge, auth_time, scope, patient_id, launch_id,
 user_id,
 organization_id,
 (SELECT u.email FROM "user" u WHERE u.id = "authorization_code".user_id),
 (SELECT u.given_name FROM "user" u WHERE u.id = "authorization_code".user_id),
 (SELECT u.family_name FROM "user" u WHERE u.id = "authorization_code".user_id),
 (SELECT i.id FROM "installation" i WHERE i.application_id = "authorization_code".application_id
   AND i.organization_id = "authorization_code".organization_id),
 (SELECT i.activation_status FROM "installation" i WHERE i.application_id = "authorization_code".application_id
   AND i.organization_id = "authorization_code".organization_id),
 (SELECT i.trial_started_at FROM "installation" i WHERE i.application_id = "authorization_code".application_id
   AND i.organization_id = "authorization_code".organization_id)"""


def expiry(now: dt.datetime, seconds: int) -> dt.datetime:
    return now + dt.timedelta(seconds=seconds)
