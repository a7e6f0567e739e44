"""A TCP proxy in front of the S3 test server that can hold a writer inside an upload.

Armed with a pattern, it never forwards the first request whose bytes match (say, the `PUT` of a
chart object or of one of its parts) and sets `held`: the writer then sits inside that upload
for as long as the test wants, and a kill lands there every time. Everything else is forwarded
unchanged, both ways."""
from __future__ import annotations

import re
import socket
import threading


class HoldingProxy:
    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.pattern: re.Pattern | None = None
        self.held = threading.Event()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arm(self, pattern: bytes) -> None:
        """Hold the next request matching `pattern`."""
        self.held.clear()
        self.pattern = re.compile(pattern)

    def disarm(self) -> None:
        """Forward everything from now on, and drop the connections open until now (a held one too)."""
        self.pattern = None
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.disarm()
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
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
