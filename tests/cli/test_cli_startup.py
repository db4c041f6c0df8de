"""`bertscope --help` and `--version` start without torch and transformers (they took 4-6.5 s
when every command's module was imported to build the parser), and the help they print is the
fully built parser's, byte for byte."""
import contextlib
import io
import os
import subprocess
import sys

import pytest

from bertscope.analyses import registry
from bertscope.cli.main import build_parser, command_help, main, named_command

HEAVY = {"torch", "transformers", "numpy", "huggingface_hub", "scipy", "tokenizers"}


def imported_by(*argv: str, python: tuple[str, ...] = ("-m", "bertscope.cli")) -> set[str]:
    """The top-level packages `python -m bertscope.cli ARGV` imports, from `-X importtime`."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-X", "importtime", *python, *argv], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()  # it did print the help or the version
    names = [line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert len(names) > 20  # -X importtime did report
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["heads", "--help"],
                                  ["data", "install-decoders", "--help"], ["run", "--help"], ["sinks", "--help"],
                                  ["heads", "induction", "--help"], ["patterns", "--help"], ["view", "--help"],
                                  ["selftest", "--help"]])
def test_help_and_version_import_neither_torch_nor_transformers(argv):
    assert not imported_by(*argv) & HEAVY


def test_the_import_check_can_fail():
    """The check above can fail: it sees the imports of a process that does import torch and
    transformers (no command's --help does any more: tests/cli/test_new_user.py holds every one)."""
    assert {"torch", "transformers"} <= imported_by(python=("-c", "import bertscope.models.attention; print(1)"))


def printed(argv) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    return out.getvalue()


def test_the_help_is_the_fully_built_parsers(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    full = build_parser()
    assert printed(["--help"]) == full.format_help()
    sub = next(a for a in full._actions if a.dest == "command")  # argparse keeps subparsers here
    for group in registry.GROUPS:
        assert printed([group, "--help"]) == sub.choices[group].format_help(), group
    assert printed(["run", "--help"]) == sub.choices["run"].format_help()


def test_every_commands_help_is_read_without_importing_it():
    for name, module_name in registry.COMMANDS.items():
        assert command_help(module_name) == __import__(module_name, fromlist=["HELP"]).HELP, name


@pytest.mark.parametrize("argv,named", [
    (["--help"], None), (["--version"], None), ([], None), (["run", "--limit", "5"], "run"),
    (["heads", "disable", "--help"], "heads disable"), (["heads", "--help"], "heads"),
    (["--quiet", "data", "list"], "data"), (["nonsense"], "nonsense")])
def test_the_named_command(argv, named):
    assert named_command(argv) == named


def test_an_unknown_command_is_still_argparses_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["nonsense"])
    assert e.value.code == 2 and "invalid choice: 'nonsense'" in capsys.readouterr().err
