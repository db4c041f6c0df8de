"""Logging: library code says what it does through `logging`, never `print`.

Every module logs to a child of the "bertscope" logger (`logging.getLogger(__name__)`). A
notebook sees nothing unless it configures logging; the command line calls `configure` once:
what an analysis reports goes to stdout as plain lines, warnings to stderr as
`bertscope: warning: ...`, and `--quiet` keeps only warnings and errors (no progress bars
either: each command passes `progress=not args.quiet` to its loops).
"""
from __future__ import annotations

import logging
import sys

ROOT = "bertscope"


class _ToStream(logging.Handler):
    """INFO and below to stdout as they are; WARNING and above to stderr, prefixed. The stream
    is looked up at every record, so a redirected sys.stdout (a test's capture) is honoured."""

    def emit(self, record: logging.LogRecord):
        try:
            message = self.format(record)
            if record.levelno >= logging.WARNING:
                print(f"bertscope: {record.levelname.lower()}: {message}", file=sys.stderr, flush=True)
            else:
                print(message, file=sys.stdout, flush=True)
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass


def configure(quiet: bool = False):
    """Send the "bertscope" loggers to the terminal (the command line's setting)."""
    logger = logging.getLogger(ROOT)
    for handler in [h for h in logger.handlers if isinstance(h, _ToStream)]:
        logger.removeHandler(handler)
    logger.addHandler(_ToStream())
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False
