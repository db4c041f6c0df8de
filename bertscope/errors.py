"""Errors that are the user's to fix."""


class UserError(Exception):
    """A mistake of the user's (bad path, bad option): the CLI prints it as one line, no traceback."""
