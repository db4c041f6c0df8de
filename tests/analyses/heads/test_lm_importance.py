"""Head importance and pruning with the language-modelling loss (`heads importance --task lm`,
`heads prune --task lm`) on tiny random decoders (GQA Llama; Gemma-3 with a sliding-window layer):
per-segment gate gradients against autograd through transformers' own eager model with a head mask
hooked onto the output projection's input, against central finite differences, a head that cannot
touch the loss, perplexity under pruning against the eager model, the commands end to end (resume,
the prune -> remove path with its GQA refusal), and a slice of real SmolLM2."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_decoders import TEXTS
from transformers import AutoModelForCausalLM

from bertscope.analyses.heads import lm_task as LMD
from bertscope.analyses.heads.prune.stats import random_order
from bertscope.models.loading import load_model

pytestmark = pytest.mark.usefixtures("single_thread")
FIXTURES = ["tiny_llama_lm_dir", "tiny_gemma3_lm_dir"]


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def batch_of(rows, pad=3) -> LMD.LMBatch:
    """Right-padded LMBatch of token-id lists."""
    L = max(map(len, rows))
    ids = torch.full((len(rows), L), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.as_tensor(r)
        mask[i, :len(r)] = 1
    return LMD.LMBatch(ids, mask, 0)


def random_rows(lengths, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(4, vocab, (n - 1,), generator=g).tolist() for n in lengths]


class EagerReference:
    """transformers' own model (eager attention, no bertscope code in the forward) with Michel's head
    mask: a forward pre-hook on each layer's o_proj multiplies head h's slice of its input by xi[layer, h]."""

    def __init__(self, path):
        self.model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        cfg = self.model.config
        self.L, self.H = cfg.num_hidden_layers, cfg.num_attention_heads
        self.xi = None
        for i, layer in enumerate(self.model.model.layers):
            layer.self_attn.o_proj.register_forward_pre_hook(self._hook(i))

    def _hook(self, i):
        def scale(module, args):
            (x,) = args  # (B, L, H * D)
            B, T, _ = x.shape
            return (x.view(B, T, self.H, -1) * self.xi[i][None, None, :, None].to(x.dtype)).view(B, T, -1),
        return scale

    def loss(self, row, xi) -> torch.Tensor:
        """Mean next-token loss of one unpadded row with head mask xi (layers, H)."""
        self.xi = xi
        ids = torch.as_tensor(row)[None]
        return self.model(ids, labels=ids).loss

    def gradient(self, row, keep=None) -> torch.Tensor:
        xi = (torch.ones(self.L, self.H) if keep is None else torch.as_tensor(keep, dtype=torch.float32)).clone()
        xi.requires_grad_(True)
        (g,) = torch.autograd.grad(self.loss(row, xi), xi)
        return g


@pytest.mark.parametrize("fixture", FIXTURES)
def test_segment_gradients_equal_eager_autograd_with_a_hooked_head_mask(fixture, request):
    """Right padding, rows of different lengths (longer than Gemma's 4-key window), a pruned head."""
    path = request.getfixturevalue(fixture)
    loaded = load_model(path, task="causal-lm")
    ref = EagerReference(path)
    rows = random_rows([11, 2, 7, 9], loaded.model.config.vocab_size, seed=3)
    keep = np.ones((loaded.n_layers, loaded.n_heads), np.float32)
    keep[1, 2] = 0
    grads, per, token_sum, targets = LMD.segment_gradients(loaded, batch_of(rows), torch.as_tensor(keep))
    loaded.gates.reset()
    assert grads.shape == (4, 2, 4) and targets == 10 + 1 + 6 + 8
    for e, row in enumerate(rows):
        torch.testing.assert_close(grads[e], ref.gradient(row, keep), atol=2e-5, rtol=2e-4)
        with torch.no_grad():
            torch.testing.assert_close(per[e], ref.loss(row, torch.as_tensor(keep)), atol=2e-5, rtol=1e-5)
    assert grads.abs().sum() > 0


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(2, 12), min_size=1, max_size=4), seed=st.integers(0, 99),
       batch=st.integers(1, 3))
def test_importance_equals_the_eager_mean_of_absolute_gradients(tiny_gemma3_lm_dir, lengths, seed, batch):
    """I_h = mean over segments of |dL/dxi_h| (michel), whatever the batching; the batch convention too."""
    loaded = load_model(tiny_gemma3_lm_dir, task="causal-lm")
    ref = _reference(tiny_gemma3_lm_dir)
    rows = random_rows(lengths, loaded.model.config.vocab_size, seed)
    batches = [batch_of(rows[i:i + batch]) for i in range(0, len(rows), batch)]
    eager = torch.stack([ref.gradient(r) for r in rows]).double()  # (n, layers, H)
    got = LMD.lm_importance(loaded, batches, normalise=False, progress=False)
    np.testing.assert_allclose(got.importance.raw, eager.abs().mean(0).numpy(), atol=2e-5, rtol=2e-4)
    per_batch = sum(eager[i:i + batch].sum(0).abs() for i in range(0, len(rows), batch)) / len(rows)
    got = LMD.lm_importance(loaded, batches, convention="batch", normalise=False, progress=False)
    np.testing.assert_allclose(got.importance.raw, per_batch.numpy(), atol=2e-5, rtol=2e-4)


_REFS = {}


def _reference(path):
    if path not in _REFS:
        _REFS[path] = EagerReference(path)
    return _REFS[path]


def test_gradient_equals_a_central_finite_difference_of_the_gated_loss(tiny_llama_lm_dir):
    loaded = load_model(tiny_llama_lm_dir, task="causal-lm")
    rows = random_rows([9, 6], loaded.model.config.vocab_size, seed=5)
    b = batch_of(rows)
    grads, *_ = LMD.segment_gradients(loaded, b, torch.ones(2, 4))
    loaded.gates.reset()
    eps = 1e-2
    for lay in range(2):
        for h in range(4):
            losses = []
            for sign in (1, -1):
                xi = torch.ones(2, 4)
                xi[lay, h] += sign * eps
                loaded.gates.xi = xi
                with torch.no_grad():
                    from bertscope.tasks.lm_loss import token_losses

                    losses.append(token_losses(loaded, b.input_ids, b.attention_mask).per_sequence())
                loaded.gates.reset()
            fd = (losses[0] - losses[1]) / (2 * eps)  # (segments,)
            torch.testing.assert_close(grads[:, lay, h], fd, atol=2e-4, rtol=2e-2)


def test_a_head_whose_output_cannot_reach_the_loss_has_importance_zero(tiny_llama_lm_dir):
    loaded = load_model(tiny_llama_lm_dir, task="causal-lm")
    D = loaded.model.config.hidden_size // loaded.n_heads
    with torch.no_grad():
        loaded.model.model.layers[1].self_attn.o_proj.weight[:, 2 * D:3 * D] = 0  # head 2-3 writes nothing
    rows = random_rows([8, 5, 10], loaded.model.config.vocab_size, seed=1)
    res = LMD.lm_importance(loaded, [batch_of(rows[:2]), batch_of(rows[2:])], progress=False)
    raw = res.importance.raw
    assert raw[1, 2] == 0 and (np.delete(raw.ravel(), 1 * 4 + 2) > 1e-6).all()
    assert res.importance.ranks()[1, 2] == 8  # the least important of 8
    assert res.targets == 7 + 4 + 9 and res.importance.n_examples == 3


def test_gemma3_post_attention_norm_makes_a_layers_gradients_sum_to_zero(tiny_gemma3_lm_dir, tiny_llama_lm_dir):
    """Gemma-3 normalises the attention block's output (post_attention_layernorm, RMSNorm, before the
    residual): scaling every xi of a layer by c leaves the loss unchanged (up to the norm's eps), so by
    Euler's theorem sum_h dL/dxi_h = 0 at xi = 1, per segment and layer. Llama (pre-norm only) has no
    such constraint."""
    for path, zero in ((tiny_gemma3_lm_dir, True), (tiny_llama_lm_dir, False)):
        loaded = load_model(path, task="causal-lm")
        rows = random_rows([12, 7, 10], loaded.model.config.vocab_size, seed=6)
        grads, *_ = LMD.segment_gradients(loaded, batch_of(rows), torch.ones(2, 4))
        loaded.gates.reset()
        sums, scale = grads.sum(-1), grads.abs().sum(-1)  # (segments, layers)
        if zero:
            assert (sums.abs() <= 1e-4 * scale).all() and (scale > 1e-3).all()
        else:
            assert (sums.abs() > 1e-2 * scale).any()


@pytest.mark.parametrize("fixture", FIXTURES)
def test_perplexity_under_pruning_equals_the_eager_model_with_those_heads_masked(fixture, request):
    path = request.getfixturevalue(fixture)
    loaded = load_model(path, task="causal-lm")
    ref = _reference(path)
    rows = random_rows([10, 3, 12, 7], loaded.model.config.vocab_size, seed=2)
    batches = [batch_of(rows[:3]), batch_of(rows[3:])]
    for pruned in ([], [(0, 1), (1, 3)], [(0, h) for h in range(4)]):
        xi = torch.ones(2, 4)
        for lay, h in pruned:
            xi[lay, h] = 0
        with torch.no_grad():  # each row's mean loss times its targets: the sum over every target
            total = sum(float(ref.loss(r, xi)) * (len(r) - 1) for r in rows)
        n = sum(len(r) - 1 for r in rows)
        loss, targets = LMD.mean_token_loss(loaded, batches, pruned)
        assert targets == n
        assert loss == pytest.approx(total / n, rel=1e-5, abs=1e-5)
    assert (loaded.gates.xi == 1).all()  # the gates are reset


def test_pad_id_and_batches(tiny_llama_lm_dir):
    loaded = load_model(tiny_llama_lm_dir, task="causal-lm")
    assert LMD.pad_id(loaded.tokenizer) == 3

    class Seg:
        def __init__(self, ids):
            self.input_ids, self.n_tokens = ids, len(ids)
    batches = LMD.lm_batches([Seg([1, 5, 6]), Seg([1, 7]), Seg([1, 8, 9, 10])], 2, 3)
    assert [b.first for b in batches] == [0, 2]
    assert batches[0].input_ids.tolist() == [[1, 5, 6], [1, 7, 3]]
    assert batches[0].attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]


# ----------------------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A text corpus, one document (segment) per line: 20 lines of the tiny tokenizer's words."""
    path = tmp_path_factory.mktemp("lmcorpus") / "corpus.txt"
    path.write_text("\n".join(TEXTS * 4) + "\n")
    return path


def run_cli(argv):
    from bertscope.cli.main import main

    return main(argv + ["--quiet"])


def test_importance_and_prune_commands_end_to_end(tiny_llama_lm_dir, corpus, tmp_path):
    common = ["--model", str(tiny_llama_lm_dir), "--task", "lm", "--corpus", str(corpus), "--max-len", "24",
              "--batch-size", "3"]
    imp_dir, prune_dir = tmp_path / "imp", tmp_path / "prune"
    assert run_cli(["heads", "importance", *common, "--limit", "6", "--out", str(imp_dir)]) == 0
    imp = read(imp_dir / "importance.csv")
    assert [(int(r["layer"]), int(r["head"])) for r in imp] == [(a, b) for a in (1, 2) for b in (1, 2, 3, 4)]
    assert sorted(int(r["rank"]) for r in imp) == list(range(1, 9))
    res = json.loads((imp_dir / "run.json").read_text())["analyses"]["importance"]
    assert res["status"] == "complete" and res["results"]["task"] == "lm" and res["results"]["examples"] == 6
    assert res["settings"]["corpus"] == str(corpus) and res["results"]["peak_rss_mb"] > 0
    assert (imp_dir / "fig_importance.png").is_file() and not (imp_dir / "importance_state.npz").exists()

    assert run_cli(["heads", "prune", *common, "--limit", "6", "--eval-limit", "5", "--step", "0.25",
                    "--max-fraction", "0.5", "--random-seeds", "2", "--out", str(prune_dir)]) == 0
    rows = read(prune_dir / "prune.csv")
    assert list(rows[0]) == ["step", "fraction_pruned", "heads_pruned", "order", "seed", "loss", "perplexity",
                             "perplexity_ratio"]
    assert [(r["order"], r["seed"], r["heads_pruned"]) for r in rows] == [
        (o, s, n) for o, s in (("importance", ""), ("random", "0"), ("random", "1")) for n in ("0", "2", "4")]
    # step 1's importance (the unpruned model, the same 6 segments) is what `heads importance` wrote
    steps = read(prune_dir / "prune_importance.csv")
    first = {(r["layer"], r["head"]): float(r["importance_raw"]) for r in steps if r["step"] == "1"}
    for r in imp:
        assert first[(r["layer"], r["head"])] == pytest.approx(float(r["importance_raw"]), rel=1e-5)
    # the second step's importance has the first step's heads masked (empty cells)
    order = read(prune_dir / "prune_order.csv")
    gone = {(r["layer"], r["head"]) for r in order if r["step"] == "1"}
    assert len(gone) == 2 and all(r["importance"] == "" for r in steps if r["step"] == "2" and
                                  (r["layer"], r["head"]) in gone)
    # perplexity at 0% is the plain model's on the 5 held-out segments (lines 7-11 of the sampled stream)
    loaded = load_model(tiny_llama_lm_dir, task="causal-lm")
    segments, _ = LMD.lm_segments(loaded, str(corpus), 24, 11, 0)
    plain = LMD.mean_token_loss(loaded, LMD.lm_batches(segments[6:], 2, 3))[0]
    assert float(rows[0]["perplexity"]) == pytest.approx(np.exp(plain), rel=1e-5)
    # each step's perplexity is that of the model with the heads removed so far gated off
    so_far = [(int(r["layer"]) - 1, int(r["head"]) - 1) for r in order]
    got = LMD.mean_token_loss(loaded, LMD.lm_batches(segments[6:], 5, 3), so_far)[0]
    assert float(rows[2]["loss"]) == pytest.approx(got, rel=1e-5)
    # random orders: the seeded permutation
    rnd = random_order(2, 4, [2, 4], 1)
    got = LMD.mean_token_loss(loaded, LMD.lm_batches(segments[6:], 5, 3), rnd[0] + rnd[1])[0]
    assert float(rows[8]["loss"]) == pytest.approx(got, rel=1e-5)
    record = json.loads((prune_dir / "run.json").read_text())["analyses"]["prune"]["results"]
    assert record["baseline_perplexity"] == pytest.approx(float(rows[0]["perplexity"]))
    assert len(record["random_geomean_perplexity"]) == 3 and not (prune_dir / "prune_state.json").exists()
    page = (prune_dir / "index.html").read_text()
    assert "Perplexity on 5 held-out" in page and "fig_prune.png" in page


def test_random_orders_are_seeded_and_reproducible(tiny_llama_lm_dir, corpus, tmp_path):
    common = ["--model", str(tiny_llama_lm_dir), "--task", "lm", "--corpus", str(corpus), "--max-len", "24",
              "--limit", "4", "--eval-limit", "3", "--step", "0.25", "--max-fraction", "0.5", "--random-seeds", "2",
              "--no-figures"]
    for name in ("a", "b"):
        assert run_cli(["heads", "prune", *common, "--out", str(tmp_path / name)]) == 0
    a, b = read(tmp_path / "a" / "prune.csv"), read(tmp_path / "b" / "prune.csv")
    assert a == b
    rnd = [r["loss"] for r in a if r["order"] == "random" and r["step"] != "0"]
    assert len(set(rnd)) == 4  # two seeds, two different orders


def test_importance_resumes_after_ctrl_c(tiny_llama_lm_dir, corpus, tmp_path, monkeypatch):
    from conftest import interrupt_on_call

    common = ["heads", "importance", "--model", str(tiny_llama_lm_dir), "--task", "lm", "--corpus", str(corpus),
              "--max-len", "24", "--limit", "7", "--batch-size", "2", "--no-figures"]
    assert run_cli([*common, "--out", str(tmp_path / "whole")]) == 0
    original = interrupt_on_call(monkeypatch, LMD.LMSums, 3, method="save")  # dies saving batch 3
    assert run_cli([*common, "--out", str(tmp_path / "part")]) == 130
    assert LMD.LMSums.load(tmp_path / "part" / "importance_state.npz").batches_done == 2
    monkeypatch.setattr(LMD.LMSums, "save", original)
    assert run_cli(["heads", "importance", "--resume", str(tmp_path / "part")]) == 0
    whole, part = read(tmp_path / "whole" / "importance.csv"), read(tmp_path / "part" / "importance.csv")
    for x, y in zip(whole, part):
        assert float(x["importance_raw"]) == pytest.approx(float(y["importance_raw"]), rel=1e-6)


def test_prune_resumes_after_ctrl_c(tiny_llama_lm_dir, corpus, tmp_path, monkeypatch):
    common = ["--model", str(tiny_llama_lm_dir), "--task", "lm", "--corpus", str(corpus), "--max-len", "24",
              "--limit", "4", "--eval-limit", "3", "--step", "0.25", "--max-fraction", "0.5", "--random-seeds", "1",
              "--no-figures"]
    assert run_cli(["heads", "prune", *common, "--out", str(tmp_path / "whole")]) == 0
    calls, original = [], LMD.mean_token_loss

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(*args, **kwargs)
    monkeypatch.setattr(LMD, "mean_token_loss", dying)
    assert run_cli(["heads", "prune", *common, "--out", str(tmp_path / "part")]) == 130
    state = json.loads((tmp_path / "part" / "prune_state.json").read_text())
    assert len(state["removed"]) == 2 and len(state["losses"]) == 2
    monkeypatch.setattr(LMD, "mean_token_loss", original)
    assert run_cli(["heads", "prune", "--resume", str(tmp_path / "part")]) == 0
    assert read(tmp_path / "whole" / "prune.csv") == read(tmp_path / "part" / "prune.csv")


def test_user_errors_are_one_line(tiny_llama_lm_dir, corpus, tmp_path, capsys, minilm_path):
    cases = [
        (["heads", "prune", "--task", "lm", "--model", str(tiny_llama_lm_dir), "--max-len", "24"], "needs --limit"),
        (["heads", "importance", "--task", "rte", "--corpus", str(corpus)], "--corpus goes with --task lm"),
        (["heads", "prune", "--task", "rte", "--eval-limit", "3"], "--eval-limit goes with --task lm"),
        (["heads", "importance", "--task", "lm", "--model", str(minilm_path), "--limit", "2"], "needs a decoder"),
        (["heads", "prune", "--task", "lm", "--model", str(tiny_llama_lm_dir), "--max-len", "24", "--corpus",
          str(corpus), "--limit", "20"], "none is left for perplexity"),
    ]
    for argv, match in cases:
        code = run_cli(argv + ["--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == 2 and match in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
        assert not (tmp_path / "o").exists()


def test_prune_to_remove_on_a_gqa_decoder(tiny_llama_lm_dir, corpus, tmp_path, capsys):
    """`heads remove` keeps the LM head; a set of query heads that covers whole key/value groups goes
    for real (same losses as gating them), one that splits a group is a one-line refusal."""
    prune_dir = tmp_path / "prune"
    prune_dir.mkdir()
    with open(prune_dir / "prune_order.csv", "w") as f:  # what `heads prune` writes: step 1 splits group 1-1/1-2
        f.write("step,fraction_pruned,layer,head\n1,0.25,1,2\n1,0.25,2,3\n2,0.5,2,4\n2,0.5,1,1\n")
    code = run_cli(["heads", "remove", "--model", str(tiny_llama_lm_dir), "--from-prune", str(prune_dir),
                    "--fraction", "0.25", "--out", str(tmp_path / "no")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "1-2 shares key/value head 1 with kept 1-1" in err
    assert not (tmp_path / "no").exists() or not any((tmp_path / "no").iterdir())
    out = tmp_path / "removed"
    assert run_cli(["heads", "remove", "--model", str(tiny_llama_lm_dir), "--from-prune", str(prune_dir),
                    "--fraction", "0.5", "--out", str(out)]) == 0
    small = load_model(out, task="causal-lm")
    full = load_model(tiny_llama_lm_dir, task="causal-lm")
    assert small.pruned_heads == {0: [0, 1], 1: [2, 3]}
    assert small.model.model.layers[0].self_attn.k_proj.out_features == 8  # one key/value head of 2 left
    rows = random_rows([9, 4, 12], full.model.config.vocab_size, seed=4)
    batches = [batch_of(rows)]
    removed = LMD.mean_token_loss(small, batches)[0]
    gated = LMD.mean_token_loss(full, batches, [(0, 0), (0, 1), (1, 2), (1, 3)])[0]
    assert removed == pytest.approx(gated, rel=1e-5) and removed != pytest.approx(LMD.mean_token_loss(full, batches)[0])


# ----------------------------------------------------------------------------- real weights


def test_real_smollm2_slice(smollm2_dir, wiki):
    """Two short Wikipedia segments on SmolLM2-135M (dequantized from 4-bit GGUF): gradients against
    transformers' eager model with the hooked head mask, and a sane perplexity."""
    loaded = load_model(smollm2_dir, task="causal-lm")
    segments, report = LMD.lm_segments(loaded, "wiki", 40, 2, 0)
    assert len(segments) == 2 and all(s.n_tokens <= 40 for s in segments)
    batch = LMD.lm_batches(segments, 2, LMD.pad_id(loaded.tokenizer))[0]
    grads, per, _, targets = LMD.segment_gradients(loaded, batch, torch.ones(30, 9))
    loaded.gates.reset()
    ref = EagerReference(smollm2_dir)
    for e, s in enumerate(segments):
        torch.testing.assert_close(grads[e], ref.gradient(s.input_ids), atol=2e-4, rtol=2e-3)
    ppl = float(np.exp(LMD.mean_token_loss(loaded, [batch])[0]))
    assert 3 < ppl < 200, ppl  # a trained model on English text
