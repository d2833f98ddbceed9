"""The exception type for mistakes a user can fix (the CLI prints it as one line), its kinds
that more than one module raises or that each way in words its own way, the scripts' way of
printing it (`one_line`), and a long text cut for such a line (`cut`). Standard library only:
the CLI imports it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class NmtError(Exception):
    """A problem with the user's input (config, data, checkpoint, arguments): no traceback."""


class DataError(NmtError):
    """A corpus that cannot be read or does not have the expected layout (`nmt.corpus`), or
    cannot be downloaded (`nmt.download`)."""


class DecodeArgumentError(NmtError, ValueError):
    """A decoding argument out of its range. `argument` names it as the library does
    ("beam", "nbest", "batch_size"); the CLI and the server say it their own way (a flag, a
    JSON field)."""

    def __init__(self, argument: str, value: int, expected: str) -> None:
        self.argument, self.value, self.expected = argument, value, expected
        super().__init__(f"{argument} {value}: expected {expected}")


@contextlib.contextmanager
def one_line() -> Iterator[None]:
    """For a script's `main` (`scripts/`): an `NmtError`, or an `OSError` from a file read
    or written outside `nmt.files`, raised inside ends the program as the CLI's mistakes do,
    "error: ..." on one line and no traceback (exit status 1)."""
    try:
        yield
    except (NmtError, OSError) as e:
        raise SystemExit(f"error: {e}") from None


def cut(text: str, limit: int) -> str:
    """`text`, shortened to `limit` characters for a one-line message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
