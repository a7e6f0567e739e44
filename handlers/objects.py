"""Downloads from the local object store: `GET /objects/<key>?expires=&signature=`.

Only URLs made by `LocalObjectStore.presigned_url` (HMAC-signed, expiring) are served. With an S3
store configured, downloads go to S3 presigned URLs instead and this route answers 404.
"""
from __future__ import annotations

import os

from audit.disclosures import disclosed
from handlers.base import BaseHandler
from errors import ApiError
from partner_api.disclosure import download_disclosure
from storage.local import LocalObjectStore

CHUNK = 256 * 1024


class ObjectDownloadHandler(BaseHandler):
    async def get(self, key: str):
        store = self.runtime.object_store
        if not isinstance(store, LocalObjectStore):
            raise ApiError(404, "not_found", "No such object.")
        params = self.query_params()
        problem = store.verify_download(key, params.get("expires"), params.get("signature"))
        if problem == "url_expired":
            raise ApiError(403, "url_expired", "This download URL has expired; request a new one.")
        if problem:
            raise ApiError(403, "invalid_signature", "This download URL is not valid.")
        try:
            # The disclosure record (audit/) is committed before the first byte is sent.
            disclosure = await self.run(download_disclosure, self.request_disclosure("chart.download"), key)
            handle, size = await disclosed(self.runtime, disclosure,
                                           lambda _: (disclosure.patients, disclosure.resource_ids),
                                           200, open_object, store.path_of(key))
        except FileNotFoundError:
            raise ApiError(404, "not_found", "No such object.") from None
        try:
            self.set_header("Content-Type", "application/zip" if key.endswith(".zip") else "application/octet-stream")
            self.set_header("Content-Length", str(size))
            self.set_header("Content-Disposition", f'attachment; filename="{os.path.basename(key)}"')
            self.set_header("Cache-Control", "private, no-store")
            # Stream in chunks so a large archive never sits in memory whole; reads on the pool.
            while chunk := await self.run(handle.read, CHUNK):
                self.write(chunk)
                await self.flush()
        finally:
            await self.run(handle.close)
        self.finish()


def open_object(path) -> tuple:
    """The open file of a local object and its size (blocking: file system)."""
    handle = open(path, "rb")
    return handle, os.fstat(handle.fileno()).st_size


def routes(runtime) -> list:
    return [(r"/objects/(.+)", ObjectDownloadHandler)]
