"""S3 in the worker tests: moto's S3 server on loopback (the `s3_endpoint` fixture, conftest.py's), the
settings of a worker that uses it, what a bucket holds, and a proxy that holds a writer inside an upload."""
from __future__ import annotations

import re
import socket
import threading
import uuid

import boto3

from helpers.environment import REDIS_URL
from helpers.processes import free_port, settings_env
from models.directory import Organization


AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def bucket_keys(settings) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=settings.s3_bucket).get("Contents", []))


def set_ehr_url(org, url: str) -> None:
    Organization.update(ehr_url=url).where(Organization.id == org.id).execute()


def worker_settings(settings, s3_endpoint: str, monkeypatch, redis_namespace: str, **fields):
    """`settings` in the worker shape: Redis (a namespace of the test's own), a fresh bucket on
    moto's S3 server (credentials in the environment), and `fields` (retries, recovery...)."""
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    configured = settings.replace(redis_url=REDIS_URL, redis_namespace=redis_namespace, s3_endpoint_url=s3_endpoint,
                                  s3_bucket=f"charts-{uuid.uuid4().hex[:10]}", **fields)
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=configured.s3_bucket)
    return configured


def worker_env(settings) -> dict:
    """The environment of a child worker (or scheduler) on `settings` in the worker shape: its task
    settings and moto's S3 credentials."""
    return settings_env(settings, SVC_TASK_MAX_RETRIES=settings.task_max_retries,
                        SVC_TASK_MIN_BACKOFF_MS=settings.task_min_backoff_ms,
                        SVC_TASK_MAX_BACKOFF_MS=settings.task_max_backoff_ms,
                        SVC_TASK_RECOVERY_SECONDS=settings.task_recovery_seconds, **AWS)


class _LoopbackListener:
    """A TCP listener on loopback whose accepted connections a subclass handles (`_connected`);
    `close()` stops it and closes every connection it holds."""

    def __init__(self, port: int = 0):
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _drop_connections(self) -> None:
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._drop_connections()
        self.listener.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self._connected(client)

    def _connected(self, client: socket.socket) -> None:
        raise NotImplementedError


class HoldingProxy(_LoopbackListener):
    """A TCP proxy in front of the S3 test server that can hold a writer inside an upload.

    Armed with a pattern, it never forwards the first request whose bytes match (say, the `PUT` of a
    chart object or of one of its parts) and sets `held`: the writer then sits inside that upload
    for as long as the test wants, and a kill lands there every time. Everything else is forwarded
    unchanged, both ways."""

    def __init__(self, upstream_port: int, port: int = 0):
        self.upstream_port = upstream_port
        self.pattern: re.Pattern | None = None
        self.held = threading.Event()
        super().__init__(port)

    def arm(self, pattern: bytes) -> None:
        """Hold the next request matching `pattern`."""
        self.held.clear()
        self.pattern = re.compile(pattern)

    def disarm(self) -> None:
        """Forward everything from now on, and drop the connections open until now (a held one too)."""
        self.pattern = None
        self._drop_connections()

    def _connected(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        with self.lock:
            self.sockets += [client, upstream]
        threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, from_client: bool) -> None:
        holding = False
        try:
            while data := source.recv(65536):
                pattern = self.pattern
                if from_client and not holding and pattern is not None and pattern.search(data):
                    holding = True  # this request, and whatever follows on its connection, goes nowhere
                    self.held.set()
                if not holding:
                    target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class OutageProxy(HoldingProxy):
    """A TCP proxy in front of the S3 test server that can go down (`down()`: its port refuses
    connections and the open ones are dropped, as a stopped server's) and come back on the same port
    (`up()`), the server's objects kept: an object store outage as its clients see it."""

    def __init__(self, upstream_port: int):
        super().__init__(upstream_port, free_port())  # the allocator's: the port is bound again after `down()`

    def down(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() in progress: it takes no more
        except OSError:
            pass
        self.close()

    def up(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()


class SilentServer(_LoopbackListener):
    """A TCP server on loopback that accepts every connection, reads what it is sent and never
    answers: an S3 endpoint that has hung (the connect succeeds, no byte ever comes back)."""

    def _connected(self, client: socket.socket) -> None:
        with self.lock:
            self.sockets.append(client)
        threading.Thread(target=self._swallow, args=(client,), daemon=True).start()

    @staticmethod
    def _swallow(client: socket.socket) -> None:
        try:
            while client.recv(65536):
                pass
        except OSError:
            pass
