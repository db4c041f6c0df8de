"""The one version string of bertscope: the installed distribution's, as setup.py declares it."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bertscope")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
