"""Writing a file that holds a secret (a key ring, a key, a credential).

Owns: `write_private`, the one way such a file is written: a fresh temporary file beside it
(created exclusively, mode 0600: no leftover or planted file is reused), filled, flushed and
renamed over the target. An existing file's mode never carries over (a key file someone made
0644 kept that mode, with a fresh secret in it, when it was rewritten in place).
Must not: log or print what it writes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_private(path: Path, data: bytes, *, keep_group: bool = False) -> None:
    """`data` at `path`, readable by its owner only. With `keep_group`, a file that was
    there keeps its owner and group, and its group-read bit (never more): a gateway that
    reads it as another user of that group still can after a rotation. When the group
    cannot be kept (only root may give a file away), the file is owner-only: group read
    for some other group would hand the secret to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    before = None
    if keep_group:
        with contextlib.suppress(FileNotFoundError):
            before = os.stat(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            mode = 0o600
            if before is not None:
                with contextlib.suppress(PermissionError):  # only root may give a file away
                    os.fchown(fh.fileno(), before.st_uid, before.st_gid)
                if os.fstat(fh.fileno()).st_gid == before.st_gid:  # never group read for another group
                    mode |= before.st_mode & 0o040
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
