"""The embedded object store: files under `var/objects/`, URLs signed with the server HMAC key."""
from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator
from urllib.parse import quote, urlencode

from storage.uploads import UnfinishedUpload
from storage.keys import check_key

URL_PREFIX = "/objects/"
# A temporary file beside its target: `.<name>.<random>.part` (`.upload-<random>.part` before 1.6).
TEMP_FILE = re.compile(r"^\.(?:(?P<name>[A-Za-z0-9_-][A-Za-z0-9._-]*)\.[A-Za-z0-9_]+|upload-[A-Za-z0-9_]+)\.part$")


def signed_message(key: str, expires: int) -> str:
    """What a download URL's signature covers: the object key and the expiry time."""
    return f"object-download\n{key}\n{expires}"


class LocalObjectStore:
    def __init__(self, root: str, public_url: str, hasher, clock):
        self.clock = clock
        self.root = Path(root)
        self.public_url = public_url.rstrip("/")
        self.hasher = hasher

    def path_of(self, key: str) -> Path:
        return self.root / check_key(key)

    def put_file(self, key: str, path: str) -> None:
        target = self.path_of(key)
        # Copy next to the target, then rename: readers never see a partial file.
        fd, temp = self._temp_beside(target)
        try:
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                shutil.copyfileobj(src, out, 1024 * 1024)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, target)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise

    def unfinished_uploads(self, prefix: str) -> Iterator[UnfinishedUpload]:
        base = self.path_of(prefix.rstrip("/"))
        for directory, _, files in os.walk(base):
            for name in files:
                match = TEMP_FILE.fullmatch(name)
                if not match:
                    continue
                path = Path(directory) / name
                try:
                    started = dt.datetime.utcfromtimestamp(path.stat().st_mtime)
                except FileNotFoundError:
                    continue  # renamed into place meanwhile
                key = (path.parent / match["name"]).relative_to(self.root).as_posix() if match["name"] else None
                yield UnfinishedUpload(key, started, ("file", str(path)))

    def abort_upload(self, upload: UnfinishedUpload) -> None:
        try:
            os.unlink(upload.handle[1])
        except FileNotFoundError:
            pass

    def exists(self, key: str) -> bool:
        return self.path_of(key).is_file()

    def list_keys(self, prefix: str) -> Iterator[str]:
        base = self.path_of(prefix.rstrip("/"))
        for directory, _, files in os.walk(base):
            for name in files:
                if not TEMP_FILE.fullmatch(name):
                    yield (Path(directory) / name).relative_to(self.root).as_posix()

    def open_object(self, key: str):
        """(a binary stream of the object, its size); FileNotFoundError when it is absent."""
        handle = open(self.path_of(key), "rb")
        return handle, os.fstat(handle.fileno()).st_size

    def delete(self, key: str) -> None:
        """Remove the object, then its directories left empty (an export's `bulk/{id}/`): a store
        that deletes every export's files does not keep a directory per export for ever."""
        path = self.path_of(key)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        directory = path.parent
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass  # removed by another delete meanwhile: its parent may be empty now
            except OSError:
                return  # not empty: an object, or an upload's temporary file, is still there
            directory = directory.parent

    @staticmethod
    def _temp_beside(target: Path, attempts: int = 3):
        """(fd, path) of a new temporary file in `target`'s directory, made if need be. A `delete`
        may remove that directory, once empty, between the two steps: it is made again."""
        for attempt in range(attempts):
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                return tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
            except FileNotFoundError:
                if attempt == attempts - 1:
                    raise

    def presigned_url(self, key: str, ttl: int) -> str:
        expires = int(self.clock.time()) + int(ttl)
        signature = self.hasher.sign(signed_message(check_key(key), expires))
        return (f"{self.public_url}{URL_PREFIX}{quote(key)}?"
                + urlencode({"expires": expires, "signature": signature}))

    def verify_download(self, key: str, expires: str, signature: str) -> str | None:
        """None when the URL is valid now, else why not: `invalid_signature` or `url_expired`."""
        try:
            expires_at = int(expires)
            check_key(key)
        except (TypeError, ValueError):
            return "invalid_signature"
        if not self.hasher.verify(signed_message(key, expires_at), signature or ""):
            return "invalid_signature"
        if expires_at < self.clock.time():
            return "url_expired"
        return None
