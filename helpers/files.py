"""Files the project writes (results, the twins' configs, benchmark tables): whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def unusable_name(path) -> str | None:
    """Why the system would refuse `path` as a file name before looking at the disk ('a name of more than 255 bytes',
    'a NUL byte'), or None."""
    text = os.fspath(path)
    if "\x00" in text:
        return "a NUL byte"
    if any(len(os.fsencode(p)) > 255 for p in Path(text).parts):
        return "a name of more than 255 bytes"
    return None


def write_text_atomically(path: Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file of its own in the same folder, renamed into place: a reader
    (or a second writer of the same file) never sees half of it. The file is world-readable (mkstemp makes 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
