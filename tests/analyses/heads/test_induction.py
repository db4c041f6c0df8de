"""`bertscope heads induction`: the three scores on planted attention (exactly 1 and 0 where they
must be), through the kernels and against an independent eager computation from transformers'
own attention maps (Llama; Gemma-3 with a sliding window that hides the induction key), the
gated losses against an eager model whose head output is zeroed by hand, and the command end to
end (tiny decoder; a small slice of SmolLM2)."""
from __future__ import annotations

import csv
import json
from argparse import Namespace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertscope.analyses.heads.induction import command as induction_command
from bertscope.analyses.heads.induction.stats import (
    SCORES,
    InductionScores,
    RepeatedSequence,
    half_losses,
    induction_spec,
    random_head_sets,
    random_sequences,
    score_offsets,
    token_pool,
    variant_losses,
    zero_gates,
)
from bertscope.cli.main import main
from bertscope.errors import UserError
from bertscope.kernels.backends import attention_stats
from bertscope.kernels.spec import AttentionLayout, RowStats

TOL = 2e-5


# ----------------------------------------------------------------------------- planted attention


def planted_qk(B: int, L: int, offsets: list[int | None], big: float = 100.0):
    """q, k (B, H, L, L) where head h's row i puts all its mass on key i + offsets[h] (q_i = big
    e_{i+o}, k_j = e_j), or spreads it evenly over what it sees when that key does not exist
    (offsets[h] None: every row uniform)."""
    H = len(offsets)
    k = torch.eye(L).expand(B, H, L, L).clone()
    q = torch.zeros(B, H, L, L)
    for h, o in enumerate(offsets):
        if o is None:
            continue
        for i in range(L):
            if 0 <= i + o < L:
                q[:, h, i, i + o] = big
    return q, k


def batch_of(layers: list[RowStats], spec, L: int, B: int):
    """The parts of a `BatchContext` the accumulator reads."""
    return SimpleNamespace(spec=spec, layers=layers, key_valid=torch.ones(B, L, dtype=torch.bool), size=B)


@pytest.mark.parametrize("bos", [True, False])
@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_planted_heads_score_exactly_one_and_zero(backend, bos):
    T, B = 5, 2
    layout = RepeatedSequence(T, bos)
    L = layout.length
    spec = induction_spec(T, 4)
    off = score_offsets(T)
    # head 0 an induction head, 1 duplicate-token, 2 previous-token, 3 uniform, 4 attends to itself
    q, k = planted_qk(B, L, [off["induction"], off["duplicate"], off["previous"], None, 0])
    key_valid = torch.ones(B, L, dtype=torch.bool)
    _, stats = attention_stats(q, k, k.clone(), key_valid, torch.zeros(B, L, dtype=torch.long), spec, scale=1.0,
                               backend=backend, layout=AttentionLayout(causal=True))
    acc = InductionScores(1, 5, layout)
    acc.add(batch_of([stats], spec, L, B))
    s = acc.scores()
    got = np.stack([s[name][0] for name in SCORES], 1)  # (H, 3)
    expected = np.zeros((5, 3))
    expected[0, 0] = expected[1, 1] = expected[2, 2] = 1.0
    # the uniform head: row i sees i + 1 keys, each gets 1 / (i + 1), at every offset
    rows = np.arange(layout.repeated_rows.start, L)
    expected[3] = np.mean(1.0 / (rows + 1))
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert acc.rows == B * T


def test_only_the_repeated_rows_count():
    """Mass planted on the first half's rows (and on offsets no score reads) never enters a score."""
    T, B, H = 4, 3, 2
    layout = RepeatedSequence(T, True)
    spec = induction_spec(T, 1)
    mass = torch.full((B, H, layout.length, len(spec.offsets)), 0.9)
    mass[:, :, layout.repeated_rows] = 0.0
    col = {o: c for c, o in enumerate(spec.offsets)}
    mass[:, 0, layout.repeated_rows, col[-T + 1]] = 0.5
    mass[:, 1, layout.repeated_rows, col[-1]] = 0.25
    acc = InductionScores(1, H, layout)
    acc.add(batch_of([RowStats(offset_mass=mass)], spec, layout.length, B))
    s = acc.scores()
    assert s["induction"][0].tolist() == [0.5, 0.0]
    assert s["duplicate"][0].tolist() == [0.0, 0.0]
    assert s["previous"][0].tolist() == [0.0, 0.25]


@settings(max_examples=25, deadline=None)
@given(T=st.integers(3, 9), bos=st.booleans(), B=st.integers(1, 3), H=st.integers(1, 3), layers=st.integers(1, 2),
       batches=st.integers(1, 3), seed=st.integers(0, 1000))
def test_scores_are_the_mean_of_the_repeated_rows(T, bos, B, H, layers, batches, seed):
    """Random offset masses over several batches: each score is the plain mean of its offset's
    column over the repeated rows of every sequence, whatever the column order of the spec."""
    layout = RepeatedSequence(T, bos)
    spec = induction_spec(T, 1)
    rng = np.random.default_rng(seed)
    acc = InductionScores(layers, H, layout)
    masses = [rng.uniform(0, 1, (layers, B, H, layout.length, 3)) for _ in range(batches)]
    for m in masses:
        acc.add(batch_of([RowStats(offset_mass=torch.tensor(m[lay])) for lay in range(layers)], spec,
                         layout.length, B))
    allm = np.concatenate(masses, axis=1)  # (layers, B', H, L, 3)
    first = layout.first
    for name, o in score_offsets(T).items():
        col = spec.offsets.index(o)
        expected = allm[:, :, :, first + T:, col].mean((1, 3))  # (layers, H)
        np.testing.assert_allclose(acc.scores()[name], expected, rtol=1e-6)
    assert acc.rows == batches * B * T


def test_accumulator_merges_and_saves(tmp_path):
    layout = RepeatedSequence(6, True)
    a, b = InductionScores(2, 3, layout), InductionScores(2, 3, layout)
    a.sums[...], a.rows = np.arange(18).reshape(2, 3, 3), 12
    b.sums[...], b.rows = 1.0, 6
    a.batches_done = 4
    a.save(tmp_path / "s.npz")
    c = InductionScores.load(tmp_path / "s.npz")
    assert c.layout == layout and c.rows == 12 and c.batches_done == 4
    np.testing.assert_array_equal(c.sums, a.sums)
    c.merge(b)
    np.testing.assert_allclose(c.scores()["previous"], (a.sums[..., 2] + 1) / 18)
    with pytest.raises(ValueError):
        c.merge(InductionScores(2, 3, RepeatedSequence(5, True)))


def test_inputs():
    pool = np.array([5, 7, 9, 11])
    ids = random_sequences(3, 6, pool, bos=1, seed=4)
    assert ids.shape == (3, 13) and (ids[:, 0] == 1).all()
    np.testing.assert_array_equal(ids[:, 1:7], ids[:, 7:])
    assert set(ids[:, 1:].ravel()) <= set(pool.tolist())
    np.testing.assert_array_equal(random_sequences(2, 6, pool, 1, 4), ids[:2])  # row r depends on (seed, r)
    assert not np.array_equal(random_sequences(3, 6, pool, 1, 5), ids)
    assert random_sequences(2, 6, pool, None, 4).shape == (2, 12)
    with pytest.raises(UserError):
        score_offsets(2)
    # the halves of the loss columns (column c: the target at position c + 1)
    first, rep = RepeatedSequence(6, True).target_halves()
    assert (first, rep) == (slice(0, 6), slice(6, 12))
    first, rep = RepeatedSequence(6, False).target_halves()
    assert (first, rep) == (slice(0, 5), slice(5, 11))
    sets = random_head_sets(3, 4, 2, [(0, 0), (1, 1)], 5, seed=0)
    assert len(sets) == 5 and all(len(s) == 2 and not {(0, 0), (1, 1)} & set(s) for s in sets)
    assert sets == random_head_sets(3, 4, 2, [(0, 0), (1, 1)], 5, seed=0)


def test_token_pool_leaves_out_the_specials(tiny_llama_lm_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_lm_dir)
    pool = token_pool(tok, 25)
    assert not set(pool.tolist()) & set(tok.all_special_ids)
    assert len(pool) == 25 - len(set(tok.all_special_ids))


# ----------------------------------------------------------------------------- real forwards vs eager


def eager_reference(model_dir, ids: np.ndarray, layout: RepeatedSequence, heads_zeroed=()):
    """(scores {name: (layers, H)}, losses (N, L - 1)) from transformers' eager attention maps and
    logits; `heads_zeroed` (layer, head) have their output zeroed before o_proj by a hook."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    D = model.config.head_dim if getattr(model.config, "head_dim", None) else \
        model.config.hidden_size // model.config.num_attention_heads
    handles = []
    for lay, h in heads_zeroed:
        def zero(module, args, h=h):
            x = args[0].clone()
            x[..., h * D:(h + 1) * D] = 0
            return (x,)
        handles.append(model.model.layers[lay].self_attn.o_proj.register_forward_pre_hook(zero))
    with torch.no_grad():
        out = model(torch.as_tensor(ids), output_attentions=True)
    for hd in handles:
        hd.remove()
    rows = torch.arange(layout.repeated_rows.start, layout.length)
    T = layout.seq_len
    scores = {name: np.stack([a[:, :, rows, rows + o].double().mean((0, 2)).numpy() for a in out.attentions])
              for name, o in score_offsets(T).items()}
    logp = out.logits.double().log_softmax(-1)[:, :-1]
    losses = -logp.gather(-1, torch.as_tensor(ids)[:, 1:, None])[..., 0]
    return scores, losses.numpy()


def stream(model_dir, ids, layout, backend, tmp_path, batch_size=3):
    from bertscope.models.loading import load_model

    loaded = load_model(str(model_dir), task="causal-lm")
    run = SimpleNamespace(loaded=loaded, dir=tmp_path, progress=False, log=lambda *a: None)
    args = Namespace(seq_len=layout.seq_len, batch_size=batch_size, backend=backend, resume=None)
    scores, losses = induction_command.stream_scores(run, args, ids, layout)
    return loaded, scores.scores(), losses.losses


@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_scores_and_losses_match_transformers_eager(tiny_llama_lm_dir, backend, tmp_path):
    T = 7
    layout = RepeatedSequence(T, True)
    ids = random_sequences(5, T, np.arange(6, 25), bos=1, seed=2)
    _, scores, losses = stream(tiny_llama_lm_dir, ids, layout, backend, tmp_path)
    ref_scores, ref_losses = eager_reference(tiny_llama_lm_dir, ids, layout)
    for name in SCORES:
        np.testing.assert_allclose(scores[name], ref_scores[name], atol=TOL)
        assert scores[name].max() > 0.01  # a random model still puts some mass there: not a vacuous match
    np.testing.assert_allclose(losses, ref_losses, atol=1e-4)


def test_gemma3_sliding_window_hides_the_induction_key(tiny_gemma3_lm_dir, tmp_path):
    """Layer 1 sees 4 keys (itself and 3 before): at T = 6 the keys i - T + 1 and i - T lie
    beyond it, so its induction and duplicate masses are exactly 0; layer 2 is global."""
    T = 6
    layout = RepeatedSequence(T, True)
    ids = random_sequences(4, T, np.arange(6, 25), bos=1, seed=3)
    _, scores, losses = stream(tiny_gemma3_lm_dir, ids, layout, "chunked", tmp_path, batch_size=4)
    ref_scores, ref_losses = eager_reference(tiny_gemma3_lm_dir, ids, layout)
    assert (scores["induction"][0] == 0).all() and (scores["duplicate"][0] == 0).all()
    assert (scores["previous"][0] > 0).all() and (scores["induction"][1] > 0).all()
    for name in SCORES:
        np.testing.assert_allclose(scores[name], ref_scores[name], atol=TOL)
    np.testing.assert_allclose(losses, ref_losses, atol=1e-4)


@pytest.mark.parametrize("max_rows", [1, 4, 64])
def test_gated_losses_match_heads_zeroed_by_hand(tiny_llama_lm_dir, max_rows):
    from bertscope.models.loading import load_model

    T = 5
    layout = RepeatedSequence(T, True)
    ids = random_sequences(3, T, np.arange(6, 25), bos=1, seed=5)
    loaded = load_model(str(tiny_llama_lm_dir), task="causal-lm")
    variants = [[], [(1, 2)], [(0, 0), (1, 3)], [(0, 1), (0, 2), (1, 0)]]
    got = variant_losses(loaded, torch.as_tensor(ids), [zero_gates(2, 4, v) for v in variants], max_rows)
    assert (loaded.gates.xi == 1).all()  # reset afterwards
    for v, heads in enumerate(variants):
        _, ref = eager_reference(tiny_llama_lm_dir, ids, layout, heads)
        np.testing.assert_allclose(got[v], ref, atol=1e-4)
    # the heads matter: each gating moves the loss
    first, rep = half_losses(got, layout)
    assert np.all(np.abs(rep[1:].mean(1) - rep[0].mean()) > 1e-4)


# ----------------------------------------------------------------------------- the command


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_command_end_to_end_and_resume(tiny_llama_lm_dir, tmp_path):
    out = tmp_path / "run"
    cli = ["heads", "induction", "--model", str(tiny_llama_lm_dir), "--seq-len", "6", "--limit", "5", "--top-k", "1",
           "2", "--random-draws", "2", "--per-head", "2", "--batch-size", "4", "--backend", "eager", "--out", str(out),
           "--quiet"]
    assert main(cli) == 0
    heads = read_csv(out / "induction.csv")
    assert len(heads) == 8 and list(heads[0]) == ["layer", "head", "induction", "duplicate", "previous", "rank",
                                                  "delta_loss_repeated", "delta_loss_first", "delta_icl"]
    assert sorted(int(r["rank"]) for r in heads) == list(range(1, 9))
    ablation = read_csv(out / "ablation.csv")
    assert [(r["ablation"], r["k"]) for r in ablation] == [("none", "0"), ("top", "1"), ("random", "1"),
                                                          ("random", "1"), ("top", "2"), ("random", "2"),
                                                          ("random", "2")]
    top1 = max(heads, key=lambda r: float(r["induction"]))
    assert ablation[1]["heads"] == f"{top1['layer']}-{top1['head']}"
    record = json.loads((out / "run.json").read_text())["analyses"]["induction"]
    r = record["results"]
    assert record["status"] == "complete" and r["length"] == 13 and r["bos_token"] == "<s>"
    assert r["top_induction"][0]["head"] == ablation[1]["heads"]
    # the ablation's top-k row against the direct computation of that gating
    ids = random_sequences(5, 6, token_pool_of(tiny_llama_lm_dir), bos=1, seed=0)
    head = (int(top1["layer"]) - 1, int(top1["head"]) - 1)
    _, base = eager_reference(tiny_llama_lm_dir, ids, RepeatedSequence(6, True))
    _, zeroed = eager_reference(tiny_llama_lm_dir, ids, RepeatedSequence(6, True), [head])
    f0, r0 = half_losses(base, RepeatedSequence(6, True))
    f1, r1 = half_losses(zeroed, RepeatedSequence(6, True))
    assert float(ablation[0]["loss_repeated"]) == pytest.approx(r0.mean(), abs=1e-4)
    assert float(ablation[1]["delta_loss_repeated"]) == pytest.approx(r1.mean() - r0.mean(), abs=1e-4)
    assert float(ablation[1]["icl_score"]) == pytest.approx(r1.mean() - f1.mean(), abs=1e-4)
    # per head: the first 2 sequences
    _, zeroed2 = eager_reference(tiny_llama_lm_dir, ids[:2], RepeatedSequence(6, True), [head])
    row = next(h for h in heads if h["rank"] == "1")
    _, rb = half_losses(base[:2], RepeatedSequence(6, True))
    _, rz = half_losses(zeroed2, RepeatedSequence(6, True))
    assert float(row["delta_loss_repeated"]) == pytest.approx((rz - rb).mean(), abs=1e-4)
    positions = read_csv(out / "loss_by_position.csv")
    assert len(positions) == 12 and float(positions[0]["none"]) == pytest.approx(base[:, 0].mean(), abs=1e-4)
    for name in ("scores", "loss", "ablation", "per_head"):
        assert (out / f"fig_induction_{name}.png").is_file()
    assert "Induction heads (Olsson et al. 2022)" in (out / "index.html").read_text()
    # --resume of a finished run: every part is read back, nothing recomputed, the same tables
    before = (out / "ablation.csv").read_text()
    assert main(["heads", "induction", "--resume", str(out), "--quiet"]) == 0
    assert (out / "ablation.csv").read_text() == before


def token_pool_of(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return token_pool(tok, min(len(tok), 25))


def test_command_refusals(tiny_llama_lm_dir, tiny_checkpoint, tmp_path, capsys):
    base = ["heads", "induction", "--out", str(tmp_path / "x"), "--quiet"]
    assert main(base + ["--model", str(tiny_llama_lm_dir), "--corpus", "wiki"]) == 2
    assert "random" in capsys.readouterr().err
    assert main(base + ["--model", str(tiny_llama_lm_dir), "--seq-len", "2"]) == 2
    assert main(base + ["--model", str(tiny_llama_lm_dir), "--seq-len", "10", "--max-len", "20"]) == 2
    assert main(base + ["--model", str(tiny_checkpoint)]) == 2  # an encoder
    assert "decoder" in capsys.readouterr().err
    assert main(base + ["--model", str(tiny_llama_lm_dir), "--seq-len", "4", "--limit", "2", "--top-k", "5"]) == 2
    assert not (tmp_path / "x").exists()


def test_smollm2_slice(smollm2_dir, tmp_path):
    """SmolLM2-135M (dequantized from 4-bit GGUF), 2 sequences of 2 x 16 random tokens: it has strong
    induction heads, its loss falls on the repeat, and zeroing its top 3 induction heads costs
    more of that than 3 random heads do."""
    out = tmp_path / "smol"
    assert main(["heads", "induction", "--model", str(smollm2_dir), "--seq-len", "16", "--limit", "2", "--top-k", "3",
                 "--random-draws", "1", "--per-head", "0", "--no-figures", "--out", str(out), "--quiet"]) == 0
    r = json.loads((out / "run.json").read_text())["analyses"]["induction"]["results"]
    assert r["top_induction"][0]["induction"] > 0.5
    assert r["loss"]["icl_score"] < -3
    a = r["ablation"]["3"]
    assert a["top"]["delta_loss_repeated"] > a["random"]["delta_loss_repeated"]["max"] + 0.5


def test_command_without_bos(tiny_gemma3_lm_dir, tmp_path):
    """--no-bos: sequences of 2T tokens, the first half one target shorter; the scores as the eager
    maps give them (the sliding layer sees neither earlier copy at T = 5)."""
    out = tmp_path / "nobos"
    assert main(["heads", "induction", "--model", str(tiny_gemma3_lm_dir), "--seq-len", "5", "--limit", "3",
                 "--no-bos", "--top-k", "1", "--random-draws", "1", "--per-head", "0", "--no-figures",
                 "--out", str(out), "--quiet"]) == 0
    r = json.loads((out / "run.json").read_text())["analyses"]["induction"]["results"]
    assert r["length"] == 10 and r["bos_id"] is None and "per_head" not in r
    ids = random_sequences(3, 5, token_pool_of(tiny_gemma3_lm_dir), bos=None, seed=0)
    ref, losses = eager_reference(tiny_gemma3_lm_dir, ids, RepeatedSequence(5, False))
    heads = read_csv(out / "induction.csv")
    for name in SCORES:
        np.testing.assert_allclose([float(h[name]) for h in heads], ref[name].ravel(), atol=TOL)
    assert all(float(h["induction"]) == 0 for h in heads if h["layer"] == "1")
    first, rep = half_losses(losses, RepeatedSequence(5, False))
    assert r["loss"]["first"] == pytest.approx(first.mean(), abs=1e-4)
    assert r["loss"]["icl_score"] == pytest.approx(rep.mean() - first.mean(), abs=1e-4)
    assert heads[0]["delta_loss_repeated"] == ""


def test_ctrl_c_in_the_stream_and_in_the_variants_then_resume(tiny_llama_lm_dir, tmp_path, monkeypatch):
    """Ctrl-C while the scores stream, then while the gated variants run: each resume goes on from
    the last saved batch or variant, and the tables match an uninterrupted run's."""
    import bertscope.engine.loop as loop
    import bertscope.tasks.lm_loss as lm

    def die_on_call(module, name, n):
        """`module.name` raises KeyboardInterrupt on its n-th call; returns the original."""
        original, calls = getattr(module, name), []

        def dying(*a, **k):
            calls.append(1)
            if len(calls) == n:
                raise KeyboardInterrupt
            return original(*a, **k)

        monkeypatch.setattr(module, name, dying)
        return original

    args = ["heads", "induction", "--model", str(tiny_llama_lm_dir), "--seq-len", "5", "--limit", "8", "--top-k", "1",
            "2", "--random-draws", "2", "--per-head", "1", "--batch-size", "2", "--no-figures", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "cut"
    forward = die_on_call(loop, "forward", 3)  # in the third batch's forward pass
    assert main(args + ["--out", str(out)]) == 130
    assert InductionScores.load(out / "induction_scores.npz").batches_done == 2
    monkeypatch.setattr(loop, "forward", forward)
    original = die_on_call(lm, "token_losses", 9)  # in the third variant (4 forwards of 2 sequences each)
    assert main(["heads", "induction", "--resume", str(out), "--quiet"]) == 130
    with np.load(out / "induction_ablation.npz") as f:
        assert int(f["done"]) == 2
    monkeypatch.setattr(lm, "token_losses", original)
    assert main(["heads", "induction", "--resume", str(out), "--quiet"]) == 0
    for name in ("induction.csv", "ablation.csv", "loss_by_position.csv"):
        whole, cut = read_csv(tmp_path / "whole" / name), read_csv(out / name)
        assert len(whole) == len(cut)
        for a, b in zip(whole, cut):
            assert a.keys() == b.keys()
            for key in a:
                if key in ("ablation", "heads", "half"):
                    assert a[key] == b[key]
                elif a[key] != "":
                    assert float(a[key]) == pytest.approx(float(b[key]), abs=1e-5), (name, key)
