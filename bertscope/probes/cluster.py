"""`bertscope probe cluster` (placeholder: being built)."""
from bertscope.errors import UserError
from bertscope.probes.common import add_common_arguments

HELP = "(being built)"
DESCRIPTION = HELP


def add_arguments(p):
    add_common_arguments(p)


def run(args, probe_run_cls):
    raise UserError("bertscope probe cluster is not built yet")
