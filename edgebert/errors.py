"""The one exception users see: the CLI prints its message as a single line, never a traceback."""


class EdgebertError(Exception):
    """Bad input or a broken environment: the message names the problem and the fix."""
