"""Reading and writing the files nmt touches: one atomic writer, UTF-8 lines in and out.

Every file the program writes (checkpoints, tokenizer models, caches, metrics, outputs)
goes through `atomic_write`: a crash, a kill or a full disk at any moment leaves either the
old file or the new one, never half of one. Failures become one-line `FileError`s that name
the path and say that the previous file is unchanged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from nmt.errors import NmtError


class FileError(NmtError):
    """A file that cannot be read or written (missing, no permission, disk full)."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` survive a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | Callable[[BinaryIO], None]) -> None:
    """Write `data` (bytes, or a function that writes to a binary file) to `path` atomically.

    The bytes go to a temporary file in the same directory, are fsynced, and the file is
    renamed over `path` (atomic on POSIX); the directory is fsynced so the rename itself is
    durable. The file gets ordinary permissions (0666 less the umask; `mkstemp` makes 0600).
    On any failure the temporary file is removed and `path` is left as it was.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise FileError(f"{path}: cannot write ({_reason(e)})") from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                data(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        kept = "; the previous file is unchanged" if path.exists() else ""
        raise FileError(f"{path}: cannot write ({_reason(e)}){kept}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """Fill a temporary directory beside `path`, then rename it to `path` in one step.

    Yields the temporary directory. If `path` appeared meanwhile (another process won the
    race), the temporary copy is dropped and theirs is kept.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as e:
        raise FileError(f"{path}: cannot write ({_reason(e)})") from None
    try:
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if not path.is_dir():
            raise FileError(f"{path}: cannot write ({_reason(e)})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_lines(path: Path | None) -> list[str]:
    """The lines of a UTF-8 file, or of stdin when `path` is None.

    Lines are split on "\n" only (a trailing "\r" is dropped): `str.splitlines` would also
    split on characters such as U+2028 inside a sentence and misalign sources and references.
    """
    where = "stdin" if path is None else str(path)
    try:
        if path is None:
            stream = getattr(sys.stdin, "buffer", None)
            data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8")
        else:
            data = path.read_bytes()
    except FileNotFoundError:
        raise FileError(f"{where}: no such file") from None
    except OSError as e:
        raise FileError(f"{where}: cannot read ({_reason(e)})") from None
    try:
        text = data.decode("utf-8-sig")  # tolerate the byte-order mark some editors write
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise FileError(f"{where}: line {line} is not valid UTF-8 (byte {e.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def write_lines(path: Path, lines: Sequence[str]) -> None:
    """Write one line per item, UTF-8, atomically."""
    atomic_write(path, "".join(line + "\n" for line in lines).encode("utf-8"))


def check_writable(path: Path, what: str) -> None:
    """Fail now, before any work, if a file cannot be created at `path`.

    The directory must exist (a typo in it should not create a tree of folders), and a
    probe file is created and removed in it: that catches read-only file systems and, for
    users other than root, missing permissions. `what` names the option in the error.
    """
    parent = path.parent
    if path.is_dir():
        raise FileError(f"{what} {path}: is a directory; expected a file name")
    if not parent.is_dir():
        raise FileError(f"{what} {path}: directory {parent} does not exist")
    try:
        with tempfile.NamedTemporaryFile(prefix=f".{path.name}.", dir=parent):
            pass
    except OSError as e:
        raise FileError(f"{what} {path}: cannot write in {parent} ({_reason(e)})") from None
