"""The developer console (`/console`): partner developers manage their own applications.

Server-rendered Tornado templates over the lifecycle functions; CSRF protection (Tornado's xsrf)
on every console POST, and only there: the OAuth and REST endpoints are not form targets."""
from __future__ import annotations

from handlers.console import account, apps
from lifecycle.developers import signin_throttle


def routes(runtime) -> list:
    throttle = signin_throttle(runtime)  # one per process; shared through Redis when configured
    return account.routes(throttle) + apps.routes()
