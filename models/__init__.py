"""Peewee models of svc-auth; `models.schema.migrate()` creates them."""
from models.application import Application, Authorization, Installation  # noqa: F401
from models.audit import AuditEvent  # noqa: F401
from models.db import open_database  # noqa: F401
from models.directory import Organization, User  # noqa: F401
from models.grants import AuthorizationCode, Launch  # noqa: F401
from models.appointments import ConnectorSession, Snapshot, SnapshotAppointment  # noqa: F401
from models.charts import ChartRequest  # noqa: F401
from models.invitations import Invitation  # noqa: F401
from models.billing import BillableUse  # noqa: F401
