"""The running service's shared parts, built once from `Settings` and handed to handlers and CLI."""
from __future__ import annotations

from conf import Settings
from keys.secrets import SecretHasher, load_hmac_key
from keys.signing import KeyRing
from models.clock import clock
from models.db import open_database
from oauth.tokens import TokenService


class Runtime:
    """Database, keys and token service of one process (each forked process builds its own)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.clock = clock
        self.db = open_database(settings.database_url)
        self.hasher = SecretHasher(load_hmac_key(settings.hmac_key, settings.keys_dir))
        retain = max(settings.id_token_ttl, settings.access_token_ttl, settings.client_token_ttl,
                     settings.sandbox_token_ttl)
        self.keyring = KeyRing(settings.keys_dir, retain_seconds=retain, clock=clock.time)
        self.tokens = TokenService(self.keyring, settings.issuer_claim)
        self.draining = False  # set on SIGTERM: readiness fails while in-flight requests finish

    def migrate(self) -> list[str]:
        from models.schema import migrate
        return migrate()

    def close(self) -> None:
        if not self.db.is_closed():
            self.db.close()
