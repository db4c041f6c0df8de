"""Analyses defined on encoders' inputs refuse a decoder in one line, before a run directory is
made; the analyses written for decoders (and those that read any model) take it. The list of
what runs on decoders is docs/decoders.md's table: this test holds the commands to it."""
from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from bertscope.analyses import registry
from bertscope.cli.main import main

DOCS = Path(__file__).resolve().parents[2] / "docs" / "decoders.md"


def passes_encoders_only(module) -> bool:
    """Whether the command's module (or the `run_variants` it calls) hands ModelRun `encoders_only`."""
    source = inspect.getsource(module)
    if "run_variants(" in source:
        source += inspect.getsource(importlib.import_module("bertscope.analyses.heads.common"))
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "ModelRun"]
    return bool(calls) and all(any(k.arg == "encoders_only" for k in c.keywords) for c in calls)


def decoder_table() -> dict[str, bool]:
    """docs/decoders.md's "What runs on decoders" table: command -> runs on a decoder (None: reads no model)."""
    text = DOCS.read_text().split("## What runs on decoders", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `bertscope ([a-z -]+)` \| (yes|no|n/a) \|", text, flags=re.M)
    return {name: {"yes": True, "no": False, "n/a": None}[answer] for name, answer in rows}


def test_every_command_says_whether_it_runs_on_decoders_and_the_docs_agree():
    table = decoder_table()
    for name, path in registry.COMMANDS.items():
        module = importlib.import_module(path)
        encoder_only = hasattr(module, "ENCODERS_ONLY") or "run_variants(" in inspect.getsource(module)
        assert name in table, f"docs/decoders.md does not say whether `bertscope {name}` runs on decoders"
        if table[name] is None:  # n/a: a command that reads no model
            assert "--model" not in inspect.getsource(module.add_arguments) and not encoder_only, name
            continue
        assert table[name] == (not encoder_only), name
        if encoder_only:
            assert passes_encoders_only(module), f"bertscope {name} declares ENCODERS_ONLY but does not pass it"


@pytest.mark.usefixtures("single_thread")
def test_an_encoder_analysis_refuses_a_decoder_in_one_line(tiny_llama_lm_dir, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["patterns", "--model", str(tiny_llama_lm_dir), "--max-len", "32", "--limit", "2",
               "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "runs on encoders only" in err and "causal llama decoder" in err and "docs/decoders.md" in err
    assert not out.exists()
