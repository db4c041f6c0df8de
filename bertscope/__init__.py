"""bertscope: streamed attention-head statistics for BERT-family encoders.

`bertscope.load()` gives a `bertscope.api.Scope` for notebooks; `bertscope` on the command
line runs the analyses.
"""
__version__ = "0.1.0"


def load(*args, **kwargs):
    """`bertscope.api.load`: imported on first use, so `import bertscope` stays light."""
    from bertscope.api import load as _load

    return _load(*args, **kwargs)
