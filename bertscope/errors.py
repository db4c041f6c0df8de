"""Errors that are the user's to fix."""


class UserError(Exception):
    """A mistake of the user's (bad path, bad option): the CLI prints it as one line, no traceback."""


class Interrupted(Exception):
    """Ctrl-C during a command: its message, which starts with "interrupted", says what was saved
    and how to resume. The CLI prints it as one line and exits with code 130."""
