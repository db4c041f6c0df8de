"""`python -m bertscope.cli` (and `torchrun -m bertscope.cli`): the `bertscope` command."""
import sys

from bertscope.cli.main import main

sys.exit(main())
