"""Building the process's Runtime at start, where a missing dependency is one line (StartupError)."""
from __future__ import annotations

from models.schema import MigrationError
from ops import startup
from runtime import Runtime


def open_runtime(settings, check_redis: bool = False) -> Runtime:
    """A migrated Runtime; an unreachable database (or Redis, when asked) is a StartupError, and so
    is a schema behind the code's when SVC_AUTO_MIGRATE=off (the operator migrates explicitly)."""
    if check_redis:
        startup.check_redis(settings)
    try:
        runtime = Runtime(settings)
        if settings.auto_migrate:
            runtime.migrate()
        else:
            _refuse_a_pending_schema(runtime)
        if not settings.disclosure_audit:  # ONC 170.315(d)(2): turning the audit off is itself audited
            from models.audit import AuditEvent
            message = "SVC_DISCLOSURE_AUDIT=off: disclosures are not recorded by this process"
            AuditEvent.record("svc-auth", "audit.disclosures_off", "SVC_DISCLOSURE_AUDIT", message=message)
            # and in the disclosure chain itself, which nobody can quietly change (an `audit_event` row
            # the service role may delete): the gap in what follows is on the record
            runtime.disclosure_writer.write({"action": "audit.disclosures_off", "outcome": "success",
                                             "detail": {"setting": "SVC_DISCLOSURE_AUDIT", "message": message}})
    except MigrationError as exc:  # rolled back: one line, like a database that is down
        raise startup.StartupError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001  (only database errors are translated; the rest propagate)
        if startup.is_database_error(exc):
            raise startup.database_error(exc, settings) from None
        raise
    return runtime


def _refuse_a_pending_schema(runtime: Runtime) -> None:
    from models.schema import code_schema_number, pending_steps, schema_number
    steps = pending_steps(runtime.db)
    if steps:
        found = schema_number(runtime.db)
        runtime.close()
        raise startup.StartupError(
            f"the database schema ({found}) is behind this release's ({code_schema_number()}): {len(steps)} step(s) "
            "pending and SVC_AUTO_MIGRATE=off; run `svc-auth db migrate` first")
