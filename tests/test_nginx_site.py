"""deploy/nginx/svc-auth.conf as shipped (only its placeholders and ports substituted): `nginx -t`
accepts it, and a running nginx serves the service over TLS only. Port 80 redirects GET/HEAD to
https and refuses other methods without proxying; an unknown host name gets no answer (444, or a
refused TLS handshake); the upstream sees this server's host, never the client's X-Forwarded-Host;
/metrics and /readyz answer loopback (and the named monitoring network) only. The upstream here
is a tiny echo server: nothing of svc-auth is needed to check the proxy."""
import http.client
import http.server
import json
import os
import socket
import ssl
import subprocess
import threading

import pytest

from helpers.nginx_site import HOST, NGINX, nginx_conf, runnable_site
from helpers.processes import free_port, wait_for_port

pytestmark = pytest.mark.skipif(not os.path.exists(NGINX), reason="needs Debian's nginx (make system-deps)")


class Echo(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        body = json.dumps({"method": self.command, "path": self.path, "headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def site(tmp_path):
    echo = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    http_port, https_port = free_port(), free_port()  # as in production, the default server shares both
    ports = {"default_http": http_port, "default_https": https_port, "http": http_port, "https": https_port}
    conf = nginx_conf(tmp_path, runnable_site(tmp_path, ports, [echo.server_address[1]]))
    check = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-c", str(conf)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    nginx = subprocess.Popen([NGINX, "-p", str(tmp_path), "-c", str(conf)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        for port in (http_port, https_port):
            wait_for_port(port, proc=nginx)
        yield ports
    finally:
        nginx.terminate()
        nginx.wait(10)
        echo.shutdown()


def plain(port, method, path, host=HOST, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def tls(port, method, path, sni=HOST, headers=None, source="127.0.0.1"):
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    conn.sock = context.wrap_socket(sock, server_hostname=sni)
    try:
        conn.request(method, path, headers={"Host": sni, **(headers or {})})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def test_the_shipped_site_serves_over_tls_only(site):
    # Port 80: GET and HEAD go to https on the configured host; nothing reaches the upstream.
    status, headers, _ = plain(site["http"], "GET", "/v1/oauth/authorize?client_id=x")
    assert status == 301 and headers["Location"] == f"https://{HOST}/v1/oauth/authorize?client_id=x"
    assert plain(site["http"], "HEAD", "/")[0] == 301
    for method in ("POST", "PUT", "DELETE"):
        status, _, body = plain(site["http"], method, "/v1/oauth/token", body="grant_type=client_credentials")
        assert status == 400 and b"headers" not in body  # nginx's own answer, not the echo's
    # TLS: proxied, with HSTS, and the upstream learns this server's host whatever the client says.
    status, headers, body = tls(site["https"], "GET", "/healthz",
                                headers={"X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "http"})
    assert status == 200 and headers["Strict-Transport-Security"] == "max-age=63072000"
    seen = {k.lower(): v for k, v in json.loads(body)["headers"].items()}
    assert (seen["host"], seen["x-forwarded-host"], seen["x-forwarded-proto"]) == (HOST, HOST, "https")


def test_an_unknown_host_gets_no_answer(site):
    """On the same ports as the service's server: a Host (or TLS server name) other than its
    server_name is closed without an answer, so no forged host reaches the service."""
    assert plain(site["http"], "GET", "/")[0] == 301
    for host in ("evil.example", "127.0.0.1"):
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            plain(site["http"], "GET", "/", host=host)
        with pytest.raises(ssl.SSLError):
            tls(site["https"], "GET", "/", sni=host)


def test_metrics_and_readyz_answer_loopback_only(site):
    for path in ("/metrics", "/readyz"):
        assert tls(site["https"], "GET", path)[0] == 200
        # 127.0.0.2 is loopback too, but neither 127.0.0.1 nor the named monitoring network
        assert tls(site["https"], "GET", path, source="127.0.0.2")[0] == 403
    assert tls(site["https"], "GET", "/healthz", source="127.0.0.2")[0] == 200
