"""The one exception type for mistakes a user can fix; the CLI prints it as one line."""


class NmtError(Exception):
    """A problem with the user's input (config, data, checkpoint, arguments): no traceback."""
