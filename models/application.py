"""Partner applications (OAuth clients), their manifests and their installations in clinics."""
from __future__ import annotations

import peewee

from models.db import BaseModel, JSONText, db_default, wall_now
from models.directory import Organization, User
from models.ids import new_id
from models.prepared import PreparedQuery

USER_FIELDS = ("email", "name", "ehrUsername", "organization")
BILLING_PLANS = ("free_trial", "paid")
DISABLED, ENABLED = "Disabled", "Enabled"
ACTIVATION_STATUSES = (DISABLED, ENABLED)
"""An installation's activation status (`Installation.activation_status`; None until the app's first
SDK initialization in the clinic, which makes it `DISABLED`): the only spelling of these values."""
DEFAULT_SMART_SCOPES = "launch launch/patient openid fhirUser profile patient/*.rs user/*.rs"
"""What an application declares unless it says otherwise (`apps create|update --smart-scopes`): read
and search of the clinic's FHIR resources, never write; authorize grants only what is also asked for."""


class Application(BaseModel):
    """A registered partner app. Secrets are stored only as keyed hashes (see keys.secrets)."""

    id = peewee.CharField(primary_key=True, max_length=64, default=lambda: new_id("app"))
    name = peewee.CharField(max_length=200)
    client_id = peewee.CharField(max_length=64, unique=True, default=lambda: new_id("cli"))
    client_secret_hash = peewee.CharField(max_length=128)
    fallback_secret_hash = peewee.CharField(max_length=128, null=True)
    # The secret the last rotation retired (oauth/secret_rotation.py): recognised, not accepted,
    # until `retired_secret_until` (activation + SVC_RETIRED_SECRET_GRACE).
    retired_secret_hash = peewee.CharField(max_length=128, null=True)
    retired_secret_until = peewee.DateTimeField(null=True)
    # Which SVC_HMAC_KEY made client_secret_hash / fallback_secret_hash (keys.secrets.key_id; NULL:
    # not known, e.g. made before issue 36): what `svc-auth keys rekey` reports as still old.
    secret_key_id = peewee.CharField(max_length=16, null=True)
    fallback_key_id = peewee.CharField(max_length=16, null=True)
    redirect_uri = peewee.CharField(max_length=500)
    launch_url = peewee.CharField(max_length=500)
    token_endpoint = peewee.CharField(max_length=500, null=True)
    allowed_origins = JSONText(default=list)
    user_fields = JSONText(default=lambda: ["email"])
    billing_plan = peewee.CharField(max_length=32, default="paid")
    rest_allowed_networks = JSONText(default=list)
    # redirect_uri matching (oauth.redirects): "prefix" under `redirect_uri` (the manifest base), or
    # "exact": one of `redirect_uris` (OIDC Core 3.1.2.1), compared after normalisation.
    redirect_uri_match = peewee.CharField(max_length=16, default="prefix", constraints=db_default("prefix"))
    redirect_uris = JSONText(default=list, constraints=db_default("[]"))
    # authorize refuses requests without S256 PKCE
    require_pkce = peewee.BooleanField(default=False, constraints=db_default(False))
    # SMART App Launch (oauth/smart_scopes.py): the scopes the app declared (space-separated; SMART
    # resource scopes and launch/fhirUser), of which authorize grants what is also asked for.
    smart_scopes = peewee.TextField(default=DEFAULT_SMART_SCOPES, constraints=db_default(DEFAULT_SMART_SCOPES))
    # A public client (token_endpoint_auth_method `none`): no secret, PKCE S256 required.
    public = peewee.BooleanField(default=False, constraints=db_default(False))
    # FHIR API limits of this app (fhir_api/limits.py), "COUNT/SECONDS"; None: the configured default
    # (SVC_FHIR_RATE_LIMIT per clinic, SVC_FHIR_TOKEN_RATE_LIMIT per access token).
    fhir_rate_limit = peewee.CharField(max_length=32, null=True)
    fhir_token_rate_limit = peewee.CharField(max_length=32, null=True)
    # SMART offline_access grants of this app live this long (seconds); None: SVC_OFFLINE_ACCESS_TTL.
    offline_access_ttl = peewee.IntegerField(null=True)
    # SMART Backend Services (issue 48; oauth/client_assertion.py): the app's public keys, at an URL
    # (`jwks_url`, fetched and cached by `oauth.client_jwks`) or stored (`jwks`, a validated public
    # JWKS as JSON text), and the system scopes it may ask (`system/Patient.rs ...`; "" none).
    jwks_url = peewee.CharField(max_length=500, null=True)
    jwks = peewee.TextField(null=True)
    system_scopes = peewee.TextField(default="", constraints=db_default(""))
    created_at = peewee.DateTimeField(default=wall_now)

    @property
    def is_backend(self) -> bool:
        """A backend app (SMART Backend Services): it registered public keys (a JWKS URL or file)."""
        return bool(self.jwks_url or self.jwks)

    @classmethod
    def by_client_id(cls, client_id: str | None) -> "Application | None":
        """The application with this `client_id` (the token endpoint's hot lookup), or None."""
        return _APPLICATION_BY_CLIENT_ID.first(client_id) if isinstance(client_id, str) else None

    @classmethod
    def by_id(cls, application_id: str | None) -> "Application | None":
        """The application with this id (every partner API call looks it up), or None."""
        return _APPLICATION_BY_ID.first(application_id) if isinstance(application_id, str) else None


_APPLICATION_BY_CLIENT_ID = PreparedQuery(
    lambda client_id: Application.select().where(Application.client_id == client_id).limit(1),
    Application.client_id)
_APPLICATION_BY_ID = PreparedQuery(
    lambda application_id: Application.select().where(Application.id == application_id).limit(1),
    Application.id)


class Installation(BaseModel):
    """An application installed in a clinic: its activation status and free-trial start."""

    application = peewee.ForeignKeyField(Application, backref="installations", on_delete="CASCADE")
    organization = peewee.ForeignKeyField(Organization, backref="installations", on_delete="CASCADE")
    installed_at = peewee.DateTimeField(default=wall_now)
    activation_status = peewee.CharField(max_length=16, null=True)
    trial_started_at = peewee.DateTimeField(null=True)

    class Meta:
        indexes = ((("application", "organization"), True),)

    @classmethod
    def find(cls, application_id: str, organization_id: str) -> "Installation | None":
        return _INSTALLATION.first(application_id, organization_id)


_INSTALLATION = PreparedQuery(
    lambda application_id, organization_id: Installation.select().where(
        (Installation.application == application_id) & (Installation.organization == organization_id)).limit(1),
    Installation.application, Installation.organization)


class Authorization(BaseModel):
    """A user completed an app's auth flow: the platform verified a token issued to it for them."""

    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    user = peewee.ForeignKeyField(User, backref="authorizations", on_delete="CASCADE")
    first_verified_at = peewee.DateTimeField(default=wall_now)
    last_verified_at = peewee.DateTimeField(default=wall_now)

    class Meta:
        indexes = ((("application", "user"), True),)


def user_with_installation(user_id, application_id: str) -> User | None:
    """The user with this id, with `user.organization` and `user.installation` (the application's
    installation in the user's clinic, or None) read in one query (the bearer gate's hot path)."""
    return _USER_WITH_INSTALLATION.first(user_id, application_id) if isinstance(user_id, str) else None


_USER_WITH_INSTALLATION = PreparedQuery(
    lambda user_id, application_id: User.select(User, Organization, Installation).join(Organization)
    .switch(User).join(Installation, peewee.JOIN.LEFT_OUTER,
                       on=((Installation.organization == User.organization)
                           & (Installation.application == application_id)))
    .where(User.id == user_id).limit(1),
    User.id, Installation.application, attach={Organization: "organization", Installation: "installation"})
