"""`/static/`: the files under static/, and the JS SDK's browser build at /static/sdk/.

The SDK is an npm package (sdk/js/); its committed build sdk/js/dist/ is served as
/static/sdk/svc-sdk.js (script tag), .mjs, .cjs and .d.ts, so the service needs no Node at
run time. Both directories sit beside server.py in a checkout and in an installed wheel.
"""
from __future__ import annotations

from types import MappingProxyType

import os
from pathlib import Path

import tornado.web

ROOT = Path(__file__).resolve().parent.parent
STATIC_DIR = ROOT / "static"
SDK_DIST_DIR = ROOT / "sdk" / "js" / "dist"
MOUNTS = MappingProxyType({"sdk/": SDK_DIST_DIR})
"""URL path prefix under /static/ -> the directory that serves it instead of static/."""


class StaticAssets(tornado.web.StaticFileHandler):
    """Tornado's static file handler (caching, ETags, `static_url` versions) over static/ + MOUNTS."""

    @classmethod
    def get_absolute_path(cls, root: str, path: str) -> str:
        for prefix, directory in MOUNTS.items():
            if path.startswith(prefix):
                return os.path.abspath(os.path.join(directory, path[len(prefix):]))
        return super().get_absolute_path(root, path)

    def validate_absolute_path(self, root: str, absolute_path: str) -> str | None:
        if "\x00" in absolute_path:  # os.stat refuses a NUL with ValueError: a 404, not a 500
            raise tornado.web.HTTPError(404)
        # A mounted file is checked against its own directory (no escaping it with `..`).
        for directory in MOUNTS.values():
            if absolute_path.startswith(str(directory) + os.sep):
                root = str(directory)
        return super().validate_absolute_path(root, absolute_path)
