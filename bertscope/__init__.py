"""bertscope: streamed attention-head statistics for transformer encoders and decoders.

`bertscope.load()` gives a `bertscope.api.Scope` for notebooks; `bertscope` on the command
line runs the analyses.
"""
from bertscope.version import __version__

__all__ = ["__version__", "load"]


def load(*args, **kwargs):
    """`bertscope.api.load`: imported on first use, so `import bertscope` stays light."""
    from bertscope.api import load as _load  # it imports torch and transformers: see the docstring

    return _load(*args, **kwargs)
