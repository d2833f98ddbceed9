"""Reading and writing the files nmt touches: one atomic writer, UTF-8 lines in and out.

Every file the program writes (checkpoints, tokenizer models, caches, metrics, outputs)
goes through `atomic_write`: a crash, a kill or a full disk at any moment leaves either the
old file or the new one, never half of one. Failures become one-line `FileError`s that name
the path and say that the previous file is unchanged.

A file the user names as an output (`--output`, `--attention-plot`) goes through
`write_output`, which keeps what the user owns: a device or FIFO (`/dev/null`,
`/dev/stdout`) is written in place, never replaced by a regular file; a symlink is
followed and the file it points to written; a file with several hard links is written in
place, so that every name still sees one file; an existing file keeps its permissions
and owner. `check_output` refuses, before any work, an output that is one of the inputs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
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


def read_back(path: Path) -> bytes:
    """The bytes of a file nmt wrote and now reads again (settings, metrics, a cache's
    report). OSError as a read gives it where nothing is there or it cannot be read (a
    folder: as the read says), and where something else stands in its place (`stands_in`:
    a pipe, a socket, a broken link), which is never opened (reading a pipe would block for
    ever)."""
    kind = stands_in(path)
    if kind not in (None, "a folder"):
        raise OSError(f"not a regular file ({kind}): {path}")
    return path.read_bytes()


def read_small(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a small file the user named as `what` ("a config file"), never more than
    `limit` of them: a device or an endless pipe in its place (`/dev/zero`, `<(yes)`) is
    refused at the limit instead of filling the machine's memory, which `nmt check-config
    /dev/zero` did (24 GB in 14 s). A pipe that ends (`<(sed ... config.yaml)`) reads as a
    file. FileError, whose message starts with what went wrong (a caller adds the path):
    "file not found", what `stands_in` the file's place, or the reason a read gave."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        kind = stands_in(path)  # a broken link, a folder, a link loop
        if kind:
            raise FileError(f"{kind}, not {what}") from None
        missing = isinstance(e, FileNotFoundError)
        raise FileError("file not found" if missing else f"cannot read ({_reason(e)})") from None
    if len(data) > limit:
        size = f"over {limit:,} bytes"
        kind = stands_in(path)
        raise FileError(f"{kind} giving {size}, not {what}" if kind else f"{size}, not {what}")
    return data


def stands_in(path: Path) -> str | None:
    """What stands at `path` where nmt expects a regular file it reads whole (a checkpoint,
    a corpus split): "a folder", "a pipe", "a socket", "a device" or "a broken link", said
    instead of "no such file"; None where a regular file is (or a link to one) and where
    nothing is. Such a thing is never opened (a pipe would be read once, or block) nor
    replaced (a download does not write over a user's broken link)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "a broken link" if os.path.islink(path) else None
    except OSError as e:  # a link loop, a folder on the way that cannot be searched
        return f"unreadable ({_reason(e)})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    return "a socket" if stat.S_ISSOCK(mode) else "a device"


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` survive a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


Data = bytes | Callable[[BinaryIO], None]


def atomic_write(path: Path, data: Data, *, like: os.stat_result | None = None) -> None:
    """Write `data` (bytes, or a function that writes to a binary file) to `path` atomically.

    The bytes go to a temporary file in the same directory, are fsynced, and the file is
    renamed over `path` (atomic on POSIX); the directory is fsynced so the rename itself is
    durable. The file gets ordinary permissions (0666 less the umask; `mkstemp` makes 0600),
    or those (and where allowed the owner) of `like`, the file it replaces.
    On any failure the temporary file is removed and `path` is left as it was.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise FileError(f"{path}: cannot write ({_reason(e)})") from None
    try:
        os.fchmod(fd, 0o666 & ~_umask() if like is None else stat.S_IMODE(like.st_mode))
        if like is not None and (like.st_uid, like.st_gid) != (os.geteuid(), os.getegid()):
            with contextlib.suppress(OSError):  # only root may give a file away
                os.fchown(fd, like.st_uid, like.st_gid)
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


# A line longer than this is not a sentence: a stream without line ends (`/dev/zero`) is
# refused there instead of being read until the machine's memory is full.
MAX_LINE_BYTES = 1 << 20


def line_too_long(where: str, line: int) -> FileError:
    """The one error for line `line` (from 1) of `where` running past MAX_LINE_BYTES."""
    return FileError(
        f"{where}: line {line} is over {MAX_LINE_BYTES:,} bytes: expected text, one sentence a line"
    )


def read_lines(path: Path | None) -> list[str]:
    """The lines of a UTF-8 file, or of stdin when `path` is None.

    Lines are split on "\n" only (a trailing "\r" is dropped): `str.splitlines` would also
    split on characters such as U+2028 inside a sentence and misalign sources and references.
    A line over MAX_LINE_BYTES is an error, said as soon as it is read.
    """
    where = "stdin" if path is None else str(path)
    try:
        if path is None:
            stream = getattr(sys.stdin, "buffer", None)
            if stream is None:  # a text stream without bytes underneath (tests' fakes)
                data = sys.stdin.read().encode("utf-8")
            else:
                data = _read_lines_bytes(stream, where)
        else:
            with open(path, "rb") as f:
                data = _read_lines_bytes(f, where)
    except FileNotFoundError:
        kind = stands_in(path) if path is not None else None  # a broken link
        raise FileError(f"{where}: {kind or 'no such file'}") from None
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


def _read_lines_bytes(stream: BinaryIO, where: str) -> bytes:
    """All of `stream`, read MAX_LINE_BYTES at a time (so a line that runs past it ends in a
    later read, or never); FileError once a line does."""
    chunks: list[bytes] = []
    lines = open_line = 0  # line ends so far; bytes since the last one
    while chunk := stream.read(MAX_LINE_BYTES):
        first = chunk.find(b"\n")  # where the open line ends, if in this read
        if first < 0:
            open_line += len(chunk)
        elif open_line + first > MAX_LINE_BYTES:
            open_line += first  # it ends here, too long
        else:
            lines += chunk.count(b"\n")
            open_line = len(chunk) - chunk.rfind(b"\n") - 1
        if open_line > MAX_LINE_BYTES:
            raise line_too_long(where, lines + 1)
        chunks.append(chunk)
    return b"".join(chunks)


def write_lines(path: Path, lines: Sequence[str]) -> None:
    """Write one line per item, UTF-8, to a file the user named (`write_output`)."""
    write_output(path, "".join(line + "\n" for line in lines).encode("utf-8"))


def write_output(path: Path, data: Data) -> None:
    """Write a file the user named, keeping what the user owns (see the module's docstring).

    Not a regular file (a device, a FIFO, a socket): written in place. A symlink: the file
    it points to is written, the link stays. Several hard links: written in place (truncated,
    then written: not atomic, but every name keeps seeing the same file). Otherwise
    `atomic_write`, keeping an existing file's permissions and owner.
    """
    path = Path(path)
    try:
        st = os.stat(path)  # follows symlinks
    except FileNotFoundError:  # a new file, or a link to one not made yet
        atomic_write(Path(os.path.realpath(path)), data)
        return
    except OSError as e:
        raise FileError(f"{path}: cannot write ({_reason(e)})") from None
    if stat.S_ISDIR(st.st_mode):
        raise FileError(f"{path}: is a directory; expected a file name")
    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
        atomic_write(Path(os.path.realpath(path)), data, like=st)
        return
    try:  # through the path itself: the kernel follows /dev/stdout to whatever fd 1 is
        with open(path, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                data(f)
    except OSError as e:
        raise FileError(f"{path}: cannot write ({_reason(e)})") from None


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (device and inode: hard links and symlinks count)."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_output(path: Path, what: str, inputs: Sequence[tuple[Path, str]] = ()) -> None:
    """Before any work: `path` (option `what`) can be written, and is none of `inputs`
    ((path, option) pairs: an output written over its own input loses the input).

    A device or FIFO passes as it is (written in place); a regular file with no write
    permission for anyone (mode 0444, the link's target for a symlink) is refused, root or
    not, as the user's own mark; otherwise `check_writable`, on the file a symlink points
    to.
    """
    for source, option in inputs:
        if same_file(path, source):
            raise FileError(
                f"{what} {path}: is the same file as {option} {source}; writing it would "
                "replace that input: choose another output"
            )
    with contextlib.suppress(OSError):
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            return
        if stat.S_ISREG(mode) and not mode & 0o222:  # nobody may write it: the user's choice
            raise FileError(
                f"{what} {path}: the file is read-only; nmt does not replace it: make it "
                "writable or choose another name"
            )
    check_writable(Path(os.path.realpath(path)) if path.is_symlink() else path, what)


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
