"""The developer console (`/console`): partner developers manage their own applications.

Server-rendered Tornado templates over the lifecycle functions; CSRF protection on every console
POST (the session's own token when signed in, else Tornado's xsrf cookie), and only there: the
OAuth and REST endpoints are not form targets."""
from __future__ import annotations

from handlers.console import account, apps


def routes(runtime) -> list:
    return account.routes() + apps.routes()
