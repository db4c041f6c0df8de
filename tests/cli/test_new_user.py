"""What a new user meets first: a mistyped option refused at once in one line, nothing left behind
or silently ignored, and advice that names what the user did (issue 35, part 5). Each test here
failed before its fix."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from bertscope import analyses
from bertscope.cli.main import CORE_COMMANDS, main

HEAVY = {"torch", "transformers", "numpy"}


def cli(*argv: str, **env) -> tuple[subprocess.CompletedProcess, float, set[str]]:
    """`python -X importtime -m bertscope.cli ARGV`: the process, its wall time, the top-level
    packages it imported."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "bertscope.cli", *argv],
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **env}, capture_output=True, text=True,
                          timeout=600, check=False)
    wall = time.perf_counter() - t0
    lines = done.stderr.splitlines()
    imported = {line.split("|")[-1].strip().split(".")[0] for line in lines if line.startswith("import time:")}
    done.stderr = "\n".join(line for line in lines if not line.startswith("import time:")) + "\n"
    return done, wall, imported


# --- argparse's errors: one line, and where to read more ------------------------------------------

def every_command() -> list[list[str]]:
    """Every command the registry and the core declare, as typed."""
    return [name.split() for name in analyses.COMMANDS] + [[name] for name in CORE_COMMANDS]


@pytest.mark.parametrize("words", every_command(), ids=" ".join)
def test_a_usage_error_is_one_line_that_points_at_help(words, capsys):
    with pytest.raises(SystemExit) as e:
        main([*words, "--no-such-option"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("bertscope") and ": error: " in err  # unrecognized, or a required argument missing
    assert err.rstrip().endswith("--help`)")


@pytest.mark.parametrize("argv, prog", [([], "bertscope"), (["heads", "inductio"], "bertscope heads"),
                                        (["run", "--max-len", "0"], "bertscope run")])
def test_a_missing_or_wrong_word_names_its_commands_help(argv, prog, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(f"{prog}: error: ")
    assert err.endswith(f"(see `{prog} --help`)\n")


def test_run_refuses_a_bad_option_before_importing_torch():
    """`bertscope run --max-len 0` took 6-9 s: its parser imported torch and transformers first.
    The wall time is printed (pytest -s), not asserted: on a loaded machine it is the load's."""
    done, wall, imported = cli("run", "--max-len", "0")
    assert done.returncode == 2
    assert done.stderr == ("bertscope run: error: argument --max-len: expected a number >= 1, got 0 "
                           "(see `bertscope run --help`)\n")
    assert not imported & HEAVY, imported & HEAVY
    print(f"bertscope run --max-len 0: refused in {wall:.2f} s")


def test_the_command_lines_backend_names_are_the_kernels():
    from bertscope.cli.args import BACKEND_CHOICES
    from bertscope.kernels import BACKENDS

    assert BACKEND_CHOICES == ("auto", *BACKENDS)
