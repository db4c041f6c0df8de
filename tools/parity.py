"""Parity figures: every statistic of bertscope's plug-in against the model's own eager attention
(`output_attentions`), as the largest absolute difference on the valid rows, per family and backend.

    python tools/parity.py [--backends eager chunked] [--real] [--out FILE.md]

The reference statistics are the oracle's (`bertscope.kernels.reference.stats_from_probs`) read
off the model's eager maps. Tiny random families: the configs and padded batches (left padding for
decoders) of `bertscope.models.tiny` (`parity_config`, `run_both`), the ones
tests/models/test_decoder_families.py asserts the same of within 2e-5; this prints the differences
themselves. --real adds the converted SmolLM2 and Gemma-3 (`bertscope data
install-decoders`; dequantized from 4-bit GGUF) on a batch of two Wikipedia segments, one
left-padded, long enough that Gemma-3's 512-key window bites (L = 700).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench")]  # bench/common.py's wiki_token_stream, for --real

STATS = ("entropy", "offset_mass", "class_mass", "column_mass", "word_map")


def differences(ref, hidden, layers, valid, key_class, pooling, heads: int) -> dict:
    """Largest |bertscope - eager| of each statistic over every layer, on valid rows; argmax as the
    share of valid rows whose argmax differs where the top two probabilities are 1e-4 apart."""
    import torch

    from bertscope.kernels.reference import stats_from_probs
    from bertscope.models.tiny import SPEC  # every statistic of the kernels' table, switched on

    rows = valid[:, None, :].expand(-1, heads, -1)
    out = {name: 0.0 for name in STATS}
    out["hidden"] = float((hidden[valid] - ref.last_hidden_state[valid]).abs().max())
    wrong = clear_total = 0
    for stats, p in zip(layers, ref.attentions):
        # the oracle, off eager maps (the token relations are not among STATS: no ids needed)
        want = stats_from_probs(p.float(), valid, key_class, replace(SPEC, token_relations=False), pooling=pooling)
        for name in STATS:
            got, exp = getattr(stats, name), getattr(want, name)
            if name in ("entropy", "offset_mass", "class_mass"):
                got, exp = got[rows], exp[rows]
            elif name == "column_mass":
                got, exp = got * valid[:, None], exp * valid[:, None]
            out[name] = max(out[name], float((got.float() - exp.float()).abs().max()))
        top2 = torch.cat([p, torch.zeros_like(p[..., :1])], -1).topk(2, dim=-1).values
        clear = rows & ((top2[..., 0] - top2[..., 1]) > 1e-4)
        wrong += int((stats.argmax[clear] != want.argmax[clear]).sum())
        clear_total += int(clear.sum())
    out["argmax"] = wrong / max(clear_total, 1)
    return out


def tiny(kind: str, backend: str) -> dict:
    import torch

    from bertscope.models.tiny import HEADS, run_both  # the tiny families (see the module docstring)

    with torch.no_grad():
        ref, hidden, layers, valid, key_class, pooling = run_both(kind, (7, 4), 9, backend)
    return differences(ref, hidden, layers, valid, key_class, pooling, HEADS)


def real(name: str, backend: str, L: int = 700) -> dict:
    """Two segments of L and L - 57 tokens of running Wikipedia text, the shorter left-padded."""
    import torch
    from common import wiki_token_stream
    from transformers import AutoModel, AutoTokenizer

    from bertscope.models.attention import HeadProbe
    from bertscope.models.source import resolve_model
    from bertscope.models.tiny import SPEC, pooling_for

    path = resolve_model(name).path
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids, _, _ = wiki_token_stream(tokenizer, 2 * L)
    bos = [tokenizer.bos_token_id] if tokenizer("a").input_ids[0] == tokenizer.bos_token_id else []
    short = L - 57
    input_ids = torch.tensor([bos + ids[: L - len(bos)], [0] * (L - short) + bos + ids[L: L + short - len(bos)]])
    valid = torch.ones(2, L, dtype=torch.bool)
    valid[1, : L - short] = False
    position_ids = (valid.long().cumsum(-1) - 1).clamp_min(0)
    inputs = dict(input_ids=input_ids, attention_mask=valid.long(), position_ids=position_ids, use_cache=False)
    key_class = torch.randint(0, SPEC.n_key_classes, valid.shape, generator=torch.Generator().manual_seed(1))
    pooling = pooling_for(valid)
    with torch.no_grad():
        eager = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
        ref = eager(**inputs, output_attentions=True)
        del eager
        model = AutoModel.from_pretrained(path, attn_implementation="bertscope").eval()
        config = model.config
        layers = []
        probe = HeadProbe(config.num_hidden_layers, config.num_attention_heads, SPEC, backend=backend)
        with probe.active(key_class, lambda layer, stats, kv: layers.append(stats), pooling, token_ids=input_ids):
            hidden = model(**inputs).last_hidden_state
    return differences(ref, hidden, layers, valid, key_class, pooling, config.num_attention_heads)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["eager", "chunked"])
    parser.add_argument("--real", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import torch

    import bertscope.models.attention  # noqa: F401  (registers the "bertscope" implementation)
    from bertscope.models.tiny import KINDS

    torch.set_num_threads(1)
    cases = [(kind, "tiny random", lambda k=kind, b=None: tiny(k, b)) for kind in KINDS]
    if args.real:
        cases += [("smollm2-135m-instruct-q4_1", "real, 4-bit dequantized", lambda b=None: real(
            "smollm2-135m-instruct-q4_1", b)), ("gemma-3-270m-q4_k_m", "real, 4-bit dequantized", lambda b=None: real(
                "gemma-3-270m-q4_k_m", b))]
    lines = ["| model | weights | backend | hidden | entropy | offset mass | class mass | column mass | word map "
             "| argmax differs |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, weights, fn in cases:
        for backend in args.backends:
            d = fn(b=backend)
            lines.append(f"| {name} | {weights} | {backend} | {d['hidden']:.1e} | {d['entropy']:.1e} | "
                         f"{d['offset_mass']:.1e} | {d['class_mass']:.1e} | {d['column_mass']:.1e} | "
                         f"{d['word_map']:.1e} | {d['argmax']:.1%} |")
            print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
