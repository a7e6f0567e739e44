"""Start-up checks that turn a missing dependency into one line naming what to fix.

An operator starting a process with a wrong SVC_DATABASE_URL, an unreachable Redis or a port
already taken should read one sentence, not three chained tracebacks (issue 14, item 6).
"""
from __future__ import annotations

import errno

from conf.logging import redacted_url


class StartupError(Exception):
    """A dependency or resource the process needs at start is missing; the message says what to fix."""


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def database_error(exc: BaseException, settings) -> StartupError:
    return StartupError(f"cannot use the database at SVC_DATABASE_URL={redacted_url(settings.database_url)}: "
                        f"{_first_line(exc)}; check SVC_DATABASE_URL and that the database server is running")


def is_database_error(exc: BaseException) -> bool:
    import peewee
    return isinstance(exc, (peewee.OperationalError, peewee.InterfaceError))


def check_redis(settings, timeout: float = 3.0) -> None:
    """Ping SVC_REDIS_URL when it is set; StartupError when it does not answer."""
    if not settings.redis_url:
        return
    import redis
    try:
        client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except redis.RedisError as exc:
        raise StartupError(f"cannot reach Redis at SVC_REDIS_URL={redacted_url(settings.redis_url)}: "
                           f"{_first_line(exc)}; check SVC_REDIS_URL and that redis-server is running") from None


def bind_error(exc: OSError, port: int, address: str, option: str = "--port") -> StartupError:
    if exc.errno == errno.EADDRINUSE:
        return StartupError(f"port {port} on {address} is already in use; stop the other process or choose "
                            f"another {option}")
    if exc.errno == errno.EACCES:
        return StartupError(f"no permission to listen on port {port}; choose a {option} above 1023")
    if exc.errno == errno.EADDRNOTAVAIL:
        return StartupError(f"address {address} is not available on this host; choose another --address")
    return StartupError(f"cannot listen on {address}:{port}: {exc.strerror or exc}")
