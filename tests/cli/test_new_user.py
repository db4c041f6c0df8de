"""What a new user meets first: a mistyped option refused at once in one line, nothing left behind
or silently ignored, and advice that names what the user did (issue 35, part 5). Each test here
failed before its fix."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pytest

from bertscope.analyses import registry
from bertscope.cli.main import CORE_COMMANDS, build_parser, main

HEAVY = {"torch", "transformers", "numpy"}


def cli(*argv: str, python: tuple[str, ...] = ("-m", "bertscope.cli"), **env
        ) -> tuple[subprocess.CompletedProcess, float, set[str]]:
    """`python -X importtime -m bertscope.cli ARGV`: the process, its wall time, the top-level
    packages it imported."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", *python, *argv],
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
    return [name.split() for name in registry.COMMANDS] + [[name] for name in CORE_COMMANDS]


@pytest.mark.parametrize("words", every_command(), ids=" ".join)
def test_a_usage_error_is_one_line_that_points_at_help(words, capsys):
    with pytest.raises(SystemExit) as e:
        main([*words, "--no-such-option"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    prog = f"bertscope {' '.join(words)}"
    assert err.startswith(f"{prog}: error: "), err  # an unknown option, or a required argument missing
    assert err.endswith(f"(see `{prog} --help`)\n")


@pytest.mark.parametrize("argv, prog", [([], "bertscope"), (["heads", "inductio"], "bertscope heads"),
                                        (["run", "--max-len", "0"], "bertscope run")])
def test_a_missing_or_wrong_word_names_its_commands_help(argv, prog, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(f"{prog}: error: ")
    assert err.endswith(f"(see `{prog} --help`)\n")


def every_parser() -> list[tuple[list[str], argparse.ArgumentParser]]:
    """Every command and subcommand of the fully built parser, as typed, with its parser: the
    registry's commands (`bertscope.registry.COMMANDS`, their groups) and the core's (`data` and
    its subcommands, `report`, `view`, `selftest`), found by walking the parser the command line
    builds from them."""
    found = []

    def walk(words, parser):
        if words:
            found.append((words, parser))
        sub = getattr(parser, "subcommands", None)
        for word, child in (sub.choices.items() if sub is not None else ()):
            walk([*words, word], child)

    walk([], build_parser())
    return found


def bad_option(parser: argparse.ArgumentParser) -> tuple[list[str], str | None]:
    """An option value the command refuses while parsing, and the error it gives: `--max-len 0`
    where the command takes --max-len (a type check: argparse has parsed up to it), else an
    option no command has (the error then depends on the command: None)."""
    if any("--max-len" in a.option_strings for a in parser._actions):
        return ["--max-len", "0"], "argument --max-len: expected a number >= 1, got 0"
    return ["--no-such-option"], None


@pytest.mark.parametrize("words, parser", [pytest.param(w, p, id=" ".join(w)) for w, p in every_parser()])
def test_a_bad_option_is_refused_before_importing_torch(words, parser):
    """`bertscope run --max-len 0` took 6-9 s, and most commands 3-13 s: their parsers imported
    torch, transformers and numpy first. Each command's process here imports none of them. The
    wall time is printed (pytest -s), not asserted: on a loaded machine it is the load's."""
    argv, message = bad_option(parser)
    done, wall, imported = cli(*words, *argv)
    prog = f"bertscope {' '.join(words)}"
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"{prog}: error: "), done.stderr[-3000:]
    assert done.stderr.endswith(f"(see `{prog} --help`)\n")
    if message is not None:
        assert done.stderr == f"{prog}: error: {message} (see `{prog} --help`)\n"
    assert not imported & HEAVY, imported & HEAVY
    print(f"{prog} {' '.join(argv)}: refused in {wall:.2f} s")


def test_every_command_is_checked_for_a_bad_option():
    """The walk above reaches every command the registry and the core declare (and a bad value,
    not only an unknown option, for the commands the issue names)."""
    walked = {" ".join(words): parser for words, parser in every_parser()}
    assert set(registry.COMMANDS) | set(registry.GROUPS) | set(CORE_COMMANDS) <= set(walked)
    assert {"data list", "data download"} <= set(walked)
    for name in ("run", "sinks", "heads induction", "probe syntax", "patterns", "finetune", "view"):
        assert bad_option(walked[name])[1] is not None, name


def test_the_import_check_sees_torch():
    """The check above can fail: a process that does import torch is seen to."""
    done, _, imported = cli(python=("-c", "import bertscope.kernels.backends"))
    assert done.returncode == 0 and {"torch", "numpy"} <= imported, done.stderr[-3000:]


def test_the_command_lines_backend_names_are_the_kernels():
    from bertscope.cli.args import BACKEND_CHOICES
    from bertscope.kernels.backends import BACKENDS

    assert BACKEND_CHOICES == ("auto", *BACKENDS)


def test_the_command_lines_js_backend_names_are_the_kernels():
    from bertscope.cli.args import JS_BACKEND_CHOICES
    from bertscope.kernels.js import JS_BACKENDS

    assert JS_BACKEND_CHOICES == JS_BACKENDS


# --- the run directory: nothing left behind, a folder that cannot be written said in one line -----

TEXTS = ["The cat sat on the mat. It was happy, very happy.", "Mr. Smith went to Washington. He liked it there.",
         "Attention heads attend to the separator token, to periods and to commas.", "A short line of text."]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def command_lines(model_dirs: dict, corpus) -> dict[str, list[str]]:
    """The three commands a new user runs first, on tiny models, as typed (without --out)."""
    return {
        "run": ["run", "--model", str(model_dirs["encoder"]), "--corpus", str(corpus), "--limit", "4",
                "--batch-size", "2", "--quiet", "--no-figures"],
        "sinks": ["sinks", "--model", str(model_dirs["encoder"]), "--corpus", str(corpus), "--limit", "4",
                  "--max-len", "32", "--batch-size", "2", "--backend", "chunked", "--quiet", "--no-figures"],
        "heads induction": ["heads", "induction", "--model", str(model_dirs["lm"]), "--seq-len", "4", "--limit", "2",
                            "--top-k", "1", "--random-draws", "1", "--per-head", "0", "--backend", "chunked",
                            "--quiet", "--no-figures"],
    }


@pytest.fixture
def commands(tiny_checkpoint, tiny_llama_lm_dir, corpus):
    return command_lines({"encoder": tiny_checkpoint, "lm": tiny_llama_lm_dir}, corpus)


def test_a_run_leaves_no_lock_file(commands, tmp_path):
    out = tmp_path / "run"
    assert main([*commands["run"], "--out", str(out)]) == 0
    assert main([*commands["sinks"], "--out", str(out)]) == 0  # a second analysis in the same folder
    assert not [p.name for p in out.iterdir() if "lock" in p.name]
    assert set(json.loads((out / "run.json").read_text())["analyses"]) == {"sinks"}


def test_the_run_json_lock_still_serialises_writers(tmp_path):
    """The lock is on the folder now: two processes adding entries at once lose neither."""
    code = ("import sys; from bertscope.run.rundir import update_json; "
            "[update_json(sys.argv[1], lambda r, i=i: r.setdefault(sys.argv[2], []).append(i)) for i in range(100)]")
    path = tmp_path / "run.json"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), name]) for name in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert json.loads(path.read_text()) == {"a": list(range(100)), "b": list(range(100))}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


@pytest.fixture
def read_only_dir(tmp_path):
    """An existing, empty folder that this process cannot write: mode 0555, and as root (whom modes
    do not stop) immutable too (chattr +i; skipped where that is not allowed)."""
    path = tmp_path / "read-only"
    path.mkdir()
    path.chmod(0o555)
    immutable = False
    if os.geteuid() == 0:
        immutable = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False).returncode == 0
        if not immutable:
            pytest.skip("running as root, and chattr +i is not allowed here: no folder is read-only to root")
    yield path
    if immutable:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    path.chmod(0o755)


@pytest.mark.parametrize("name", ["run", "sinks", "heads induction"])
def test_a_read_only_out_folder_is_one_line(name, commands, read_only_dir, capsys):
    assert main([*commands[name], "--out", str(read_only_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"bertscope: error: cannot write {read_only_dir / 'run.json'}: "), err
    assert not any(read_only_dir.iterdir())


# --- --resume takes every setting from the run: one given otherwise is refused, not dropped --------

@pytest.mark.parametrize("name", ["run", "sinks"])
def test_resume_refuses_settings_it_would_ignore(name, commands, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*commands[name], "--out", str(out)]) == 0
    words = name.split()
    before = (out / "run.json").read_text()
    assert main([*words, "--resume", str(out), "--max-len", "64", "--limit", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"--resume {out} continues that run with its recorded settings" in err
    assert "--max-len 64 (the run's: " in err and "--limit 1 (the run's: 4)" in err
    assert (out / "run.json").read_text() == before  # refused before anything was touched
    # --out elsewhere is refused too; the run's own values, and options of where and how it runs, are taken
    assert main([*words, "--resume", str(out), "--out", str(tmp_path / "elsewhere"), "--quiet"]) == 2
    assert f"--out {tmp_path / 'elsewhere'} (the run's folder: {out})" in capsys.readouterr().err
    if name == "run":  # an option whose dest is not its name is said by its name
        assert main(["run", "--resume", str(out), "--window", "8", "--quiet"]) == 2
        assert "--window 8 (the run's: 64)" in capsys.readouterr().err
    assert main([*words, "--resume", str(out), "--limit", "4", "--threads", "1", "--no-figures", "--quiet"]) == 0


@pytest.mark.parametrize("bos", [[], ["--bos", "without"]])
def test_sinks_refuses_a_bos_token_it_would_not_use(bos, tiny_llama_lm_dir, corpus, tmp_path, capsys):
    """Under --bos auto (the default) the template decides the first token: --bos-token was
    recorded in run.json and not used."""
    out = tmp_path / "run"
    assert main(["sinks", "--model", str(tiny_llama_lm_dir), "--corpus", str(corpus), "--bos-token", "<s>", *bos,
                 "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bertscope: error: --bos-token <s> is the BOS that --bos with")
    assert not out.exists()


# --- segments that cannot carry a statistic -----------------------------------------------------

@pytest.fixture
def no_bos_decoder(tiny_llama_lm_dir, tmp_path):
    """The tiny Llama with a tokenizer that adds nothing to a text (as SmolLM2's: no BOS)."""
    import shutil

    path = shutil.copytree(tiny_llama_lm_dir, tmp_path / "no-bos")
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    tokenizer["post_processor"] = None
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    return path


@pytest.fixture
def one_token_corpus(no_bos_decoder, tmp_path):
    """Texts that tokenizer makes one token each."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(no_bos_decoder)
    words = ["cat", "dog", "home", "happy"]
    assert all(len(tokenizer(w)["input_ids"]) == 1 for w in words)
    path = tmp_path / "one-token.txt"
    path.write_text("\n".join(words) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["run", "sinks"])
def test_a_corpus_of_lone_tokens_is_refused(name, no_bos_decoder, one_token_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    more = ["--bos", "without"] if name == "sinks" else []
    assert main([name, "--model", str(no_bos_decoder), "--corpus", str(one_token_corpus), "--limit", "all",
                 "--max-len", "16", "--backend", "chunked", "--quiet", "--no-figures", *more, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is one token long: a lone token can only attend to itself" in err, err
    assert not (out / "heads.csv").exists() and not (out / "sinks.csv").exists()


def test_some_lone_tokens_are_said(no_bos_decoder, one_token_corpus, tmp_path, caplog):
    corpus = tmp_path / "mixed.txt"
    corpus.write_text(one_token_corpus.read_text() + "the cat sat on a mat .\n", encoding="utf-8")
    assert main(["run", "--model", str(no_bos_decoder), "--corpus", str(corpus), "--limit", "all", "--max-len", "16",
                 "--quiet", "--no-figures", "--out", str(tmp_path / "run")]) == 0
    assert "4 of 5 segments are one token long" in caplog.text


# --- advice that names what the user did ----------------------------------------------------------

def test_a_file_given_as_out_is_not_offered_to_resume(tiny_checkpoint, corpus, tmp_path, capsys):
    afile = tmp_path / "afile.txt"
    afile.write_text("notes\n")
    assert main(["run", "--model", str(tiny_checkpoint), "--corpus", str(corpus), "--out", str(afile)]) == 2
    err = capsys.readouterr().err
    assert err == f"bertscope: error: --out {afile} is a file, not a folder: give the folder the run should go to\n"
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("x")
    assert main(["run", "--model", str(tiny_checkpoint), "--corpus", str(corpus), "--out", str(used)]) == 2
    assert "--resume" not in capsys.readouterr().err  # no run there to resume


def test_induction_blames_seq_len_when_max_len_was_not_given(tiny_llama_lm_dir, tmp_path, capsys):
    base = ["heads", "induction", "--model", str(tiny_llama_lm_dir), "--quiet", "--out", str(tmp_path / "x")]
    assert main([*base, "--seq-len", "40"]) == 2  # the tiny model allows 64 positions
    assert capsys.readouterr().err == ("bertscope: error: --seq-len 40, a sequence of 81 tokens (BOS and T tokens "
                                       "twice), is longer than the model allows (64)\n")
    assert main([*base, "--seq-len", "40", "--max-len", "100"]) == 2  # given: then it is the one to blame
    assert capsys.readouterr().err == "bertscope: error: --max-len 100 is longer than the model allows (64)\n"


@pytest.mark.parametrize("typo, meant", [("smollm2-135m-instruct-q4_2", "smollm2-135m-instruct-q4_1"),
                                         ("gemma-3-270m", "gemma-3-270m-q4_k_m")])
def test_a_mistyped_decoder_name_names_the_decoders(typo, meant, monkeypatch, tmp_path, capsys):
    from bertscope.data import decoders

    monkeypatch.setenv(decoders.MODELS_ENV, str(tmp_path / "models"))  # nothing installed
    assert main(["sinks", "--model", typo, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (f"bertscope: error: model not found: {typo} is no folder and no decoder bertscope knows: did you "
                   f"mean {meant}? (none is installed here; `bertscope data install-decoders` installs them)\n")
    assert "hf download" not in err


def test_a_converted_decoder_is_readable_by_all(monkeypatch, tmp_path):
    """transformers writes model.safetensors through a temporary file: mode 0600 before the fix."""
    import dataclasses
    import hashlib

    from bertscope.data import decoders

    data = os.urandom(2000)
    (tmp_path / "part00").write_bytes(data)
    gemma = decoders.DECODERS["gemma-3-270m-q4_k_m"]
    d = dataclasses.replace(gemma, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                            packages=gemma.packages[:1], files=("x/part00",))
    monkeypatch.setattr(decoders, "gguf_parts", lambda _d: [tmp_path / "part00"])

    def convert_gguf(d, gguf, out, progress=True):  # as transformers leaves the weights
        out.mkdir()
        fd = os.open(out / "model.safetensors", os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(decoders, "convert_gguf", convert_gguf)
    old = os.umask(0o022)
    try:
        folder = decoders.convert(d, tmp_path / "models", progress=False)
    finally:
        os.umask(old)
    assert oct(folder.stat().st_mode & 0o777) == oct(0o755)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()} == {
        "model.safetensors": oct(0o644), "config.json": oct(0o644), decoders.PROVENANCE_FILE: oct(0o644)}


# --- tidy output ----------------------------------------------------------------------------------

def test_a_new_runs_report_is_written_not_updated(commands, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*[a for a in commands["sinks"] if a != "--quiet"], "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"wrote the report {out / 'index.html'}\n" in said and "updated the report" not in said
    induction = [a for a in commands["heads induction"] if a != "--quiet"]
    assert main([*induction, "--out", str(out)]) == 0  # a second analysis there: updated
    assert "updated the report" in capsys.readouterr().out


def test_a_decoders_run_json_records_no_encoder_settings(tiny_llama_lm_dir, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    run = ["run", "--model", str(tiny_llama_lm_dir), "--corpus", str(corpus), "--limit", "all", "--max-len", "24",
           "--quiet", "--no-figures"]
    assert main([*run, "--out", str(out)]) == 0
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["token_types"] is None and settings["packing"] is None and settings["max_len"] == 24
    assert main(["run", "--resume", str(out), "--quiet", "--no-figures"]) == 0  # the nulls read back
    # given to a decoder, they are refused rather than recorded and not used
    assert main([*run, "--token-types", "zeros", "--packing", "balanced", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertscope: error: --token-types and --packing: how an encoder's sentence pairs are made")
    assert not (tmp_path / "b").exists()


def test_sinks_positions_count_from_0_as_the_docs_say(commands, tmp_path):
    """sinks_positions.csv numbered query positions from 0 while docs/sinks.md called the first
    token position 1: the docs now say 0, the table's numbering (and the heatmap's) is unchanged."""
    import csv
    from pathlib import Path

    out = tmp_path / "run"
    assert main([*commands["sinks"], "--out", str(out)]) == 0
    with open(out / "sinks_positions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    first = [r for r in rows if r["bucket"] == "0"]
    assert first and all(r["first_position"] == r["last_position"] == "0" for r in first)
    assert all(r["n_queries"] == r["n_seeing"] == "4" for r in first)  # one first token per segment, 4 segments
    docs = (Path(__file__).resolve().parents[2] / "docs" / "sinks.md").read_text(encoding="utf-8")
    assert "so the first token is position 0" in docs and "position 1, the BOS" not in docs
