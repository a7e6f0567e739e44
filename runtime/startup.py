"""Building the process's Runtime at start, where a missing dependency is one line (StartupError)."""
from __future__ import annotations

from ops import startup
from runtime import Runtime


def open_runtime(settings, check_redis: bool = False) -> Runtime:
    """A migrated Runtime; an unreachable database (or Redis, when asked) is a StartupError."""
    if check_redis:
        startup.check_redis(settings)
    try:
        runtime = Runtime(settings)
        runtime.migrate()
        if not settings.disclosure_audit:  # ONC 170.315(d)(2): turning the audit off is itself audited
            from models.audit import AuditEvent
            AuditEvent.record("svc-auth", "audit.disclosures_off", "SVC_DISCLOSURE_AUDIT",
                              message="SVC_DISCLOSURE_AUDIT=off: disclosures are not recorded by this process")
    except Exception as exc:  # noqa: BLE001  (only database errors are translated; the rest propagate)
        if startup.is_database_error(exc):
            raise startup.database_error(exc, settings) from None
        raise
    return runtime
