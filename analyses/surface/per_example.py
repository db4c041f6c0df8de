"""`bertscope run --per-example`'s writer is the core's (`bertscope.engine.per_example`: the notebook API
writes the same rows); the command imports it here."""
from bertscope.engine.per_example import PerExampleWriter  # noqa: F401
