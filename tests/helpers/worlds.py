"""The worlds a test starts from: a clinic, its users and an installed app (`World`), the same with
SMART apps (`SmartWorld`), and another clinic (`clinic`)."""
from __future__ import annotations

import dataclasses

from models.application import DEFAULT_SMART_SCOPES, Application
from models.directory import Organization, User

SMART_PATIENT = "pat-b15c092f2447b7a2"
"""A patient of every sandbox clinic's panel (the sandbox EHR's ids are derived, the same everywhere)."""


@dataclasses.dataclass
class World:
    """What `world` makes: a clinic, its physician and staff user, an installed app and its secret,
    and each user's sandbox token."""
    org: Organization
    physician: User
    staff: User
    app: Application
    secret: str
    sandbox_token: str
    staff_sandbox_token: str

    @classmethod
    def build(cls, runtime) -> "World":
        """A clinic with a physician and a staff user, and an installed app (free-trial plan)."""
        from lifecycle.applications import install_application, register_application
        from hub.sandbox import issue_sandbox_token
        from lifecycle.users import create_user
        org, physician = clinic("Test Clinic", "https://ehr.example/test",
                                ("doc@example.com", "Doc", "Tor", "dtor", "1234567893"))
        staff = create_user(org.id, "staff@example.com", "Staff", "Member", "smember")
        app, secret = register_application(
            runtime, "Test App", "https://app.example.com/main", "https://app.example.com/launch",
            billing_plan="free_trial", user_fields=["email", "name", "ehrUsername", "organization"])
        install_application(app.id, org.id)
        return cls(org=org, physician=physician, staff=staff, app=app, secret=secret,
                   sandbox_token=issue_sandbox_token(runtime, physician),
                   staff_sandbox_token=issue_sandbox_token(runtime, staff))

    def smart(self, runtime, scopes: str = DEFAULT_SMART_SCOPES) -> "SmartWorld":
        """This world with SMART apps installed in its clinic (see `SmartWorld.build`)."""
        return SmartWorld.build(runtime, self, scopes)


@dataclasses.dataclass
class SmartWorld:
    """A SMART world: a clinic and its physician (from a `World`), a confidential SMART app (with its
    secret) and a public one (no secret; an allowed origin), both installed with declared scopes,
    and a patient of the clinic's sandbox EHR."""
    org: Organization
    physician: User
    app: Application
    secret: str
    public_app: Application
    patient: str
    world: World

    PUBLIC_ORIGIN = "https://smart.example"

    @classmethod
    def build(cls, runtime, world: World, scopes: str = DEFAULT_SMART_SCOPES) -> "SmartWorld":
        from lifecycle.applications import install_application, register_application, set_smart_scopes
        app = world.app if world.app.smart_scopes == scopes else set_smart_scopes(runtime, world.app.id, scopes)
        public, _ = register_application(runtime, "Smart Viewer", f"{cls.PUBLIC_ORIGIN}/app",
                                         f"{cls.PUBLIC_ORIGIN}/launch", allowed_origins=[cls.PUBLIC_ORIGIN],
                                         public=True, smart_scopes=scopes)
        install_application(public.id, world.org.id)
        return cls(org=world.org, physician=world.physician, app=app, secret=world.secret, public_app=public,
                   patient=SMART_PATIENT, world=world)


def clinic(name: str, ehr_url: str, physician: tuple = ("doc@other.example", "Oth", "Er", "oer", "1245319599")
           ) -> tuple[Organization, User]:
    """Another sandbox clinic (`ehr_url`: the sandbox EHR's, e.g. `https://ehr.example/x?outage=1`
    for one that is down) and its physician: `(email, first, last, ehr username, npi)`."""
    from lifecycle.organizations import create_organization
    from lifecycle.users import create_user
    org = create_organization(name, "sandbox", ehr_url)
    return org, create_user(org.id, *physician)
