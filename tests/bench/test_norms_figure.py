"""bench/norms_figure.py on tiny hand-built run directories: an encoder's heads.csv gives the [CLS], [SEP],
"." and "," and other columns, a decoder's (`first` for `cls`, no `sep`) the first token, "." and "," and
other, each the mean over a layer's heads, and the decoder's figure carries its 4-bit provenance."""
from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def norms_figure():
    spec = importlib.util.spec_from_file_location("norms_figure", ROOT / "bench" / "norms_figure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_heads(run: Path, classes: tuple[str, ...], shares: dict):
    """shares: (layer, head) -> {class: (weight, norm)}."""
    run.mkdir()
    columns = ["layer", "head", "prev", "self", *classes, "n_tokens", *(f"{c}_norm" for c in classes)]
    with open(run / "heads.csv", "w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        for (layer, head), by_class in shares.items():
            row = {"layer": layer, "head": head, "prev": 0.1, "self": 0.1, "n_tokens": 10}
            for c, (weight, norm) in by_class.items():
                row[c], row[f"{c}_norm"] = weight, norm
            w.writerow(row)


def table_rows(out: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| layer")]


def test_decoder_run_first_token_by_layer(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    write_heads(run, ("first", "punct", "other"), {
        (1, 1): {"first": (0.2, 0.1), "punct": (0.1, 0.1), "other": (0.7, 0.8)},
        (1, 2): {"first": (0.4, 0.1), "punct": (0.1, 0.2), "other": (0.5, 0.7)},
        (2, 1): {"first": (0.9, 0.5), "punct": (0.0, 0.1), "other": (0.1, 0.4)},
        (2, 2): {"first": (0.7, 0.3), "punct": (0.1, 0.1), "other": (0.2, 0.6)},
    })
    (run / "run.json").write_text(json.dumps({
        "settings": {"corpus": "wiki", "model": "tiny-q4"},
        "model": {"converted": {"name": "tiny-q4", "original": "Tiny-LM", "quantization": "Q4_1"}},
    }))
    out = tmp_path / "docs" / "norms_tiny.png"
    monkeypatch.setattr(sys, "argv", ["norms_figure.py", str(run), "--out", str(out)])
    norms_figure().main()
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == ('| layer | first token weight | first token norm | "." and "," weight | '
                                       '"." and "," norm | other tokens weight | other tokens norm |')
    assert table_rows(printed) == [["1", "0.300", "0.100", "0.100", "0.150", "0.600", "0.750"],
                                   ["2", "0.800", "0.400", "0.050", "0.100", "0.150", "0.500"]]
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"
    module = norms_figure()
    title, caption = module.describe(run, [{"n_tokens": "10"}])
    assert title == "Tiny-LM, Wikipedia, 10 tokens" and "4-bit GGUF (Q4_1)" in caption


def test_encoder_run_keeps_its_four_kinds(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    write_heads(run, ("cls", "sep", "punct", "other"), {
        (1, 1): {"cls": (0.4, 0.05), "sep": (0.1, 0.1), "punct": (0.1, 0.15), "other": (0.4, 0.7)},
    })
    out = tmp_path / "norms_minilm.png"
    monkeypatch.setattr(sys, "argv", ["norms_figure.py", str(run), "--out", str(out)])
    norms_figure().main()
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("| layer | [CLS] weight | [CLS] norm | [SEP] weight |")
    assert table_rows(printed) == [["1", "0.400", "0.050", "0.100", "0.100", "0.100", "0.150", "0.400", "0.700"]]
    assert out.exists()
