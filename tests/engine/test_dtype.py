"""--dtype float32|float16|bfloat16: the model in that dtype, the statistics in float32.

Tolerances, against float32:
- kernels on the same (rounded) half-precision inputs, CPU: the chunked backend widens q, k,
  v to float32, so it matches float32 eager on those inputs to float32 rounding (1e-5); the
  pure-torch row pass in bfloat16 rounds every probability (8 bits): 0.15 nats of entropy
  and 0.03 of mass per row at most;
- a whole run (`bertscope run --dtype bfloat16`, every layer's activations in bfloat16):
  heads.csv within 0.02 of float32, 0.05 nats for the entropy columns.
"""
from __future__ import annotations

import argparse
import json

import pandas as pd
import pytest
import torch

from bertscope.analyses import registry
from bertscope.cli.main import build_parser, main
from bertscope.engine.devices import check_dtype
from bertscope.errors import UserError
from bertscope.kernels.backends import attention_stats
from bertscope.kernels.chunked import attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.spec import StatsSpec
from bertscope.models.loading import load_model

pytestmark = pytest.mark.usefixtures("single_thread")

HALF = (torch.bfloat16, torch.float16)
STATS = ("entropy", "offset_mass", "class_mass")


def inputs(dtype, B=3, H=4, L=37, D=16, C=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g).mul(1.5).to(dtype) for _ in range(3))
    key_valid = torch.ones(B, L, dtype=torch.bool)
    key_valid[1, 30:] = False  # padding
    key_class = torch.randint(0, C, (B, L), generator=g)
    return q, k, v, key_valid, key_class


SPEC = StatsSpec(offsets=(-2, -1, 0, 1, 2), n_key_classes=4, argmax=True, class_mass=True, entropy=True)


def valid_rows(stats, key_valid):
    return key_valid[:, None, :].expand_as(stats.entropy)


@pytest.mark.parametrize("dtype", HALF)
def test_chunked_half_on_cpu_is_float32_on_the_rounded_inputs(dtype):
    q, k, v, kv, kc = inputs(dtype)
    out, got = attention_stats_chunked(q, k, v, kv, kc, SPEC)
    ref_out, ref = attention_stats_eager(q.float(), k.float(), v.float(), kv, kc, SPEC)
    assert out.dtype == dtype
    rows = valid_rows(ref, kv)
    for name in STATS:
        assert getattr(got, name).dtype == torch.float32, name
        torch.testing.assert_close(getattr(got, name)[rows], getattr(ref, name)[rows], atol=1e-5, rtol=1e-5)
    assert torch.equal(got.argmax[rows], ref.argmax[rows])
    torch.testing.assert_close(out.float(), ref_out.to(dtype).float(), atol=1e-2, rtol=1e-2)


def test_torch_row_pass_in_bfloat16_within_its_rounding():
    q, k, v, kv, kc = inputs(torch.bfloat16)
    _, got = attention_stats(q, k, v, kv, kc, SPEC, backend="eager")  # eager computes in bf16
    _, torch_pass = attention_stats_chunked(q, k, v, kv, kc, SPEC, row_pass="torch")
    _, ref = attention_stats_eager(q.float(), k.float(), v.float(), kv, kc, SPEC)
    rows = valid_rows(ref, kv)
    for stats in (got, torch_pass.as_float32()):
        assert stats.entropy.dtype == torch.float32  # attention_stats / as_float32 widen
        assert (stats.entropy - ref.entropy)[rows].abs().max() < 0.15
        assert (stats.class_mass - ref.class_mass)[rows].abs().max() < 0.03
        assert (stats.offset_mass - ref.offset_mass)[rows].abs().max() < 0.03


def test_load_model_in_each_dtype(minilm_path):
    for dtype in ("bfloat16", "float16"):
        loaded = load_model(minilm_path, dtype=dtype)
        assert {p.dtype for p in loaded.model.parameters()} == {getattr(torch, dtype)}
        assert loaded.record()["dtype"] == loaded.dtype == dtype
    assert load_model(minilm_path).record()["dtype"] == "float32"
    with pytest.raises(UserError, match="unknown dtype"):
        load_model(minilm_path, dtype="int8")


def test_a_dtype_torch_cannot_multiply_is_one_user_error(monkeypatch):
    def refuse(*a, **k):
        raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'\nmore')
    monkeypatch.setattr(torch.nn.functional, "linear", refuse)
    with pytest.raises(UserError, match="--dtype float16 is not supported on cpu") as e:
        check_dtype("float16", "cpu")
    assert "\n" not in str(e.value)
    check_dtype("float32", "cpu")  # never probed


def test_every_command_that_runs_a_model_takes_dtype():
    parser = build_parser()
    no_model = {"compare", "cues", "heads remove"}  # read runs or data, or only rewrite a checkpoint
    for name in registry.COMMANDS:
        if name in no_model:
            continue
        actions = [a for a in subparser(parser, name)._actions if "--dtype" in a.option_strings]
        assert actions, name
        assert "bfloat16" in actions[0].choices and actions[0].default == "float32", name
    ft = [a for a in subparser(parser, "finetune")._actions if "--dtype" in a.option_strings][0]
    assert ft.choices == ("float32", "bfloat16")  # autocast; float16 training would need loss scaling
    precision = [a for a in subparser(parser, "finetune")._actions if "--precision" in a.option_strings][0]
    assert precision.help == argparse.SUPPRESS  # the old name: accepted, not shown


def subparser(parser, name):
    p = parser
    for word in name.split():
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        p = sub.choices[word]
    return p


def test_finetune_precision_is_an_alias_of_dtype(caplog):
    from bertscope.analyses.finetune.command import autocast_precision

    assert autocast_precision(argparse.Namespace(precision=None, dtype="bfloat16")) == "bf16"
    assert autocast_precision(argparse.Namespace(precision=None, dtype="float32")) == "fp32"
    args = argparse.Namespace(precision="bf16", dtype="float32")
    assert autocast_precision(args) == "bf16" and args.dtype == "bfloat16"
    assert "deprecated" in caplog.text


@pytest.mark.usefixtures("minilm_path", "wiki")
def test_bfloat16_run_matches_float32(tmp_path):
    """The embedded MiniLM over 8 Wikipedia segments: heads.csv in bfloat16 against float32."""
    tables = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        assert main(["run", "--corpus", "wiki", "--limit", "8", "--dtype", dtype, "--out", str(out), "--quiet",
                     "--no-figures"]) == 0
        record = json.loads((out / "run.json").read_text())
        assert record["settings"]["dtype"] == record["model"]["dtype"] == dtype
        tables[dtype] = pd.read_csv(out / "heads.csv")
    a, b = tables["float32"], tables["bfloat16"]
    assert list(a.columns) == list(b.columns) and (a["n_tokens"] == b["n_tokens"]).all()
    for col in a.columns:
        if col in ("layer", "head", "n_tokens"):
            continue
        limit = 0.05 if "entropy" in col else 0.02
        if col == "weighted_norm":  # a norm (1.6-4 here), not a share: relative (docs/norms.md)
            assert ((a[col] - b[col]).abs() / a[col].abs()).max() < limit, col
            continue
        assert (a[col] - b[col]).abs().max() < limit, col
