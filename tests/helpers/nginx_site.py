"""The shipped nginx site (`deploy/nginx/svc-auth.conf`) made runnable by a non-root nginx in a test:
its listens moved to loopback ports, its certificate placeholders pointed at a throwaway
self-signed pair, its upstreams and log paths substituted. Nothing else of the file changes."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from helpers.environment import ROOT

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
SITE = ROOT / "deploy" / "nginx" / "svc-auth.conf"
HOST = "auth.example.com"  # the site's server_name placeholder


def self_signed_pair(directory: Path, host: str = HOST) -> tuple[Path, Path]:
    """A throwaway certificate for `host` and its key (openssl), valid one day."""
    cert, key = directory / "fullchain.pem", directory / "privkey.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={host}",
                    "-addext", f"subjectAltName=DNS:{host}", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def _sub(pattern: str, replacement: str, text: str) -> str:
    text, count = re.subn(pattern, replacement, text, flags=re.M)
    assert count == 1, f"deploy/nginx/svc-auth.conf changed shape: {pattern!r} matched {count} times"
    return text


def runnable_site(tmp: Path, ports: dict, upstream_ports: list[int], tls: bool = True) -> str:
    """The shipped site with `ports` = {"default_http", "default_https", "http", "https"} on 127.0.0.1.
    `tls=False` serves the proxying server in plain HTTP on ports["https"] (for clients of the service
    that speak http to an issuer of http://127.0.0.1:PORT)."""
    site = SITE.read_text()
    servers = "\n".join(f"    server 127.0.0.1:{p} max_fails=3 fail_timeout=10s;" for p in upstream_ports)
    site = _sub(r"^\s*server 127\.0\.0\.1:\d+ [^\n]*;\n(\s*server 127\.0\.0\.1:\d+ [^\n]*;\n)*", servers + "\n", site)
    site, v6 = re.subn(r"(?m)^\s*listen \[::\]:\d+[^\n]*\n", "", site)
    assert v6 == 4, "deploy/nginx/svc-auth.conf changed shape: its IPv6 listens"
    site = _sub(r"^(\s*)listen 80 default_server;", rf"\1listen 127.0.0.1:{ports['default_http']} default_server;", site)
    site = _sub(r"^(\s*)listen 443 ssl http2 default_server;",
                rf"\1listen 127.0.0.1:{ports['default_https']} ssl http2 default_server;", site)
    site = _sub(r"^(\s*)listen 80;", rf"\1listen 127.0.0.1:{ports['http']};", site)
    site = _sub(r"^(\s*)listen 443 ssl http2;.*$",
                rf"\1listen 127.0.0.1:{ports['https']}{' ssl http2' if tls else ''};", site)
    cert, key = self_signed_pair(tmp)
    site = _sub(r"/etc/letsencrypt/live/auth\.example\.com/fullchain\.pem", str(cert), site)
    site = _sub(r"/etc/letsencrypt/live/auth\.example\.com/privkey\.pem", str(key), site)
    return site.replace("/var/log/nginx/svc-auth.access.log", str(tmp / "access.log"))


def nginx_conf(tmp: Path, site: str) -> Path:
    """`site` inside a non-root nginx.conf whose every path is under `tmp`."""
    for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / name).mkdir(exist_ok=True)
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = tmp / "nginx.conf"
    conf.write_text(f"""{user}worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
{site}
}}
""")
    return conf
