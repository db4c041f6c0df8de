"""Every registered command keeps the command contract (analyses/registry.py).

A command module is `HELP` (one line for `bertscope --help`), `DESCRIPTION`, `add_arguments(parser)`
and `main(args) -> int`, and nothing more is asked of it: the run set-up (the model on every rank,
--resume, Ctrl-C, run.json, the report) is the run class's (`bertscope.run.analysis_run`). So a
command's source names none of the pieces that set-up replaced, and every command that loads a
model takes the options every model command shares, with the same meaning.
"""
import argparse
import ast
import importlib
import inspect

import pytest

from bertscope.analyses import registry

pytestmark = pytest.mark.smoke  # one per command: make test-latest (tools/releases.py)

EVERY_COMMAND = ("--out", "--quiet")
MODEL_COMMAND = ("--model", "--revision", "--threads")
FORWARD_COMMAND = ("--dtype", "--device", "--backend", "--batch-size", "--max-len", "--no-figures")
# what the run class does, which a command must not do again by hand
SET_UP = {"KeyboardInterrupt": "Ctrl-C", "Interrupted": "Ctrl-C", "refresh_report": "the report",
          "init_distributed": "torchrun", "ProbeRun": "the old run class"}
# the exceptions, each with its reason
OWN = {("finetune", "KeyboardInterrupt"):
       "it notes the interruption in its timing table, then re-raises to the run class",
       ("compare", "refresh_report"): "it writes no analysis of a model: it adds a comparison to an existing run"}


def options(module) -> dict[str, argparse.Action]:
    parser = argparse.ArgumentParser(prog="bertscope")
    module.add_arguments(parser)
    return {o: a for a in parser._actions for o in a.option_strings}


@pytest.fixture(scope="module", params=list(registry.COMMANDS), ids=lambda n: n.replace(" ", "-"))
def command(request):
    return request.param, importlib.import_module(registry.COMMANDS[request.param])


def test_the_module_is_help_description_arguments_and_main(command):
    name, module = command
    assert isinstance(module.HELP, str) and module.HELP and "\n" not in module.HELP, name
    assert isinstance(module.DESCRIPTION, str) and len(module.DESCRIPTION) >= len(module.HELP) // 2, name
    assert list(inspect.signature(module.add_arguments).parameters) == ["p"] or \
        len(inspect.signature(module.add_arguments).parameters) == 1, name
    assert len(inspect.signature(module.main).parameters) == 1, name


def test_every_command_takes_the_shared_options(command):
    name, module = command
    opts = options(module)
    assert set(EVERY_COMMAND) <= set(opts), name
    if "--model" in opts:
        assert set(MODEL_COMMAND) <= set(opts), name
        if name != "heads remove":  # it writes a smaller model: no forward pass, no figures
            assert set(FORWARD_COMMAND) <= set(opts), (name, set(FORWARD_COMMAND) - set(opts))
            assert opts["--dtype"].default == "float32" and opts["--device"].default == "cpu", name
    assert opts["--quiet"].nargs == 0, name


def test_no_command_sets_up_its_run_by_hand(command):
    name, module = command
    tree = ast.parse(inspect.getsource(module))
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
           {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
           {a.name.rpartition(".")[2] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names}
    again = {f"{k} ({v})" for k, v in SET_UP.items() if k in used and (name, k) not in OWN}
    assert not again, f"{name} does by hand what the run class does: {', '.join(sorted(again))}"


def test_the_check_finds_a_command_that_catches_ctrl_c():
    source = ("def main(args):\n    try:\n        go(args)\n"
              "    except KeyboardInterrupt:\n        raise Interrupted('x')\n")
    names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    assert {"KeyboardInterrupt", "Interrupted"} <= names
