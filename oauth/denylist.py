"""Revoked access tokens (by `jti`) until they expire: the only per-token state we keep.

Tokens are not recorded when issued. A revocation (a replayed authorization code revokes what the
code issued) puts the jtis on this list; userinfo, introspection and the REST API refuse a token
whose jti is on it. Redis when configured (a key per jti that expires with the token), else a
database table (expired rows are removed when new ones are added).

Either way, what the list answered for a jti is kept in memory while the database's `denied`
version (`models.changes`) stands still, so a token in use costs no query or Redis call of its own:
the version is read with the directory's, once per request (`Versions`). The table's trigger moves
it with every denial; the Redis list moves it itself, after the denial is in Redis (issue 49), so a
request that arrives after `deny` returned, in any process, asks again and is refused.
"""
from __future__ import annotations

from models.changes import DENIED, ChangeVersion, Versions
from models.denylist import DeniedToken
from models.prepared import PreparedQuery
from errors import ApiError

_DENIED = PreparedQuery(  # on every bearer token's use: its SQL text is built once
    lambda jti, now: DeniedToken.select(DeniedToken.jti)
    .where((DeniedToken.jti == jti) & (DeniedToken.expires_at >= now)).limit(1),
    DeniedToken.jti, DeniedToken.expires_at)


def _unavailable() -> ApiError:
    # Fail closed: without the deny-list a revoked token cannot be told apart from a live one.
    return ApiError(503, "temporarily_unavailable", "The revocation list (Redis) cannot be reached; retry shortly.",
                    {"Retry-After": "5"})


class DatabaseDenyList:
    """The `denied_token` table. What it answered for a jti is kept while the `denied` version
    (`models.changes`: a trigger moves it with every denial, whoever adds it) stands still, so a
    token in use costs no query of its own: the version is read with the directory's, once per
    request (`Versions`)."""

    MAX_KEPT = 10_000
    """Past this many jtis' answers, all are forgotten at once."""

    def __init__(self, clock, versions: Versions | None = None):
        self.clock = clock
        self.versions = versions
        self._kept: dict[str, tuple[int, bool]] = {}

    def deny(self, jtis, until: float) -> None:
        now = int(self.clock.time())
        rows = [{"jti": jti, "expires_at": int(until)} for jti in jtis if jti]
        if rows:
            DeniedToken.insert_many(rows).on_conflict_ignore().execute()
        DeniedToken.delete().where(DeniedToken.expires_at < now).execute()

    def is_denied(self, jti: str) -> bool:
        if self.versions is None:
            return _DENIED.first(jti, int(self.clock.time())) is not None
        version = self.versions.of(DENIED)  # before the read: an answer is never older than its version
        kept = self._kept.get(jti)
        if kept is not None and kept[0] == version:
            return kept[1]
        denied = _DENIED.first(jti, int(self.clock.time())) is not None
        if len(self._kept) >= self.MAX_KEPT:
            self._kept = {}
        self._kept[jti] = (version, denied)
        return denied

    def close(self) -> None:
        pass


class RedisDenyList:
    """A key per denied jti in Redis. With `versions`, answers are kept as `DatabaseDenyList` keeps
    them: `deny` moves the database's `denied` version once the keys are set."""

    MAX_KEPT = DatabaseDenyList.MAX_KEPT

    def __init__(self, url: str, namespace: str, clock, versions: Versions | None = None):
        import redis
        self.clock = clock
        self.versions = versions
        self._kept: dict[str, tuple[int, bool]] = {}
        self.prefix = f"{namespace}:denied:"
        self.client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)

    def deny(self, jtis, until: float) -> None:
        from redis.exceptions import RedisError
        ttl = max(1, int(until - self.clock.time()) + 1)
        pipe = self.client.pipeline(transaction=False)
        for jti in jtis:
            if jti:
                pipe.set(self.prefix + jti, b"1", ex=ttl)
        try:
            pipe.execute()
        except (RedisError, OSError):
            raise _unavailable() from None
        if self.versions is not None:  # after the keys: whoever reads the new version finds them
            ChangeVersion.insert(topic=DENIED, version=1).on_conflict(
                conflict_target=[ChangeVersion.topic], update={ChangeVersion.version: ChangeVersion.version + 1}).execute()

    def is_denied(self, jti: str) -> bool:
        if self.versions is None:
            return self._exists(jti)
        version = self.versions.of(DENIED)  # before Redis: an answer is never older than its version
        kept = self._kept.get(jti)
        if kept is not None and kept[0] == version:
            return kept[1]
        denied = self._exists(jti)
        if len(self._kept) >= self.MAX_KEPT:
            self._kept = {}
        self._kept[jti] = (version, denied)
        return denied

    def _exists(self, jti: str) -> bool:
        from redis.exceptions import RedisError
        try:
            return bool(self.client.exists(self.prefix + jti))
        except (RedisError, OSError):
            raise _unavailable() from None

    def close(self) -> None:
        self.client.close()


def build_denylist(settings, clock, versions: Versions | None = None):
    if settings.redis_url:
        return RedisDenyList(settings.redis_url, settings.redis_namespace, clock, versions)
    return DatabaseDenyList(clock, versions)
