"""The exception type for mistakes a user can fix (the CLI prints it as one line), and its one
kind that each way in words its own way. Standard library only: the CLI imports it."""


class NmtError(Exception):
    """A problem with the user's input (config, data, checkpoint, arguments): no traceback."""


class DecodeArgumentError(NmtError, ValueError):
    """A decoding argument out of its range. `argument` names it as the library does
    ("beam", "nbest", "batch_size"); the CLI and the server say it their own way (a flag, a
    JSON field)."""

    def __init__(self, argument: str, value: int, expected: str) -> None:
        self.argument, self.value, self.expected = argument, value, expected
        super().__init__(f"{argument} {value}: expected {expected}")
