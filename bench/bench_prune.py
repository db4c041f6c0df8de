"""Inference speed of really pruned models (`bertscope.models.head_removal`) against the unpruned one.

    nice -n 5 python bench/bench_prune.py                          # embedded MiniLM, 1 thread
    python bench/bench_prune.py --prune-order RUN_DIR             # heads from `bertscope heads prune`
    python bench/bench_prune.py --batch-sizes 64 --lengths 128 --device cuda

Models: the unpruned model and one copy per fraction (default 25%, 50%, 75%) with its heads
really removed: the same share of every layer, chosen with a seeded generator (--seed), or,
with --prune-order, the heads a `bertscope heads prune` run had removed at that fraction
(its prune_order.csv). All are loaded by `bertscope.models.loading.load_model` (bertscope's attention
function; outside an analysis that is torch SDPA) and run under `torch.inference_mode()`.

Inputs: batch B of L random token ids (seeded), no padding, as [CLS] ... [SEP].

Timing: per (B, L), one warm-up forward per model, then --repeats rounds; in each round every
model runs one forward, in an order rotated by round (no model always first), so all models
see the same load of a shared machine. Reported: median seconds per forward, speed-up =
t(unpruned) / t(pruned) in wall time and (on the CPU) in the process's CPU time, which other
processes on a shared machine disturb less; and the share s of the unpruned forward spent in
the attention blocks (Q, K, V projections, attention, output projection + LayerNorm: what
pruning shrinks), timed with forward hooks in separate forwards. If time were proportional to
the heads kept, removing a fraction f of them would give a speed-up of 1 / (1 - f s): the
"expected" column.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint (default: the embedded all-MiniLM-L6-v2)")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--repeats", type=int, default=7, help="rounds per (batch, length) (default: 7)")
    ap.add_argument("--big-repeats", type=int, default=3,
                    help="rounds where batch x length >= --big tokens (default: 3)")
    ap.add_argument("--big", type=int, default=8192, help="tokens per batch from which --big-repeats apply")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: 1)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prune-order", metavar="RUN_DIR", default=None,
                    help="take the heads from RUN_DIR/prune_order.csv (bertscope heads prune) at each fraction")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results_prune.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from bertscope.models import head_removal
    from bertscope.models.loading import load_model

    device = torch.device(args.device)
    started = time.perf_counter()
    base = load_model(args.model, device=str(device))
    L_, H = base.n_layers, base.n_heads
    models = {"unpruned": base.model}
    heads_of, fraction_of = {}, {"unpruned": 0.0}
    for f in args.fractions:
        heads = chosen_heads(args, f, L_, H)
        m = load_model(args.model, device=str(device)).model
        head_removal.prune_heads(m, heads)
        name = f"{round(100 * f)}% pruned"
        models[name], heads_of[name] = m, heads
        fraction_of[name] = sum(map(len, heads.values())) / (L_ * H)  # what was really removed
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    for name, heads in heads_of.items():
        print(f"{name}: kept per layer {[H - len(heads.get(layer, [])) for layer in range(L_)]}", file=sys.stderr)

    rows, shares = [], {}
    for B in args.batch_sizes:
        for L in args.lengths:
            if L > base.max_len:
                print(f"skip L={L}: the model takes at most {base.max_len} tokens", file=sys.stderr)
                continue
            inputs = make_inputs(base, B, L, args.seed, device)
            repeats = args.big_repeats if B * L >= args.big else args.repeats
            times = time_models(models, inputs, repeats, device)
            shares[(B, L)] = attention_share(base.model, inputs, device)
            full = [statistics.median(t[i] for t in times["unpruned"]) for i in (0, 1)]  # wall, CPU
            for name, ts in times.items():
                t, cpu = (statistics.median(x[i] for x in ts) for i in (0, 1))
                f = fraction_of[name]
                rows.append((B, L, name, t, full[0] / t, full[1] / cpu, 1 / (1 - f * shares[(B, L)])))
                print(f"B={B} L={L} {name}: {1000 * t:.1f} ms (x{full[0] / t:.3f}, CPU x{full[1] / cpu:.3f}) "
                      f"over {repeats} rounds", file=sys.stderr)
            print(f"B={B} L={L}: attention blocks {100 * shares[(B, L)]:.1f}% of the unpruned forward", file=sys.stderr)
    text = table(args, base, rows, shares, params, time.perf_counter() - started)
    Path(args.out).write_text(text)
    print(text)
    return 0


def chosen_heads(args, fraction: float, n_layers: int, n_heads: int) -> dict[int, list[int]]:
    """The heads to remove at `fraction`: from --prune-order, else round(fraction * H) per layer,
    a seeded choice per layer (the same seed gives the same heads)."""
    from bertscope.models import head_removal

    if args.prune_order:
        return head_removal.heads_from_prune_order(Path(args.prune_order) / "prune_order.csv", fraction)
    rng = np.random.default_rng(args.seed)
    k = round(fraction * n_heads)
    return {layer: sorted(int(h) for h in rng.choice(n_heads, size=k, replace=False)) for layer in range(n_layers)}


def make_inputs(loaded, B: int, L: int, seed: int, device) -> dict:
    g = torch.Generator().manual_seed(seed)
    tok = loaded.tokenizer
    ids = torch.randint(1000, len(tok), (B, L), generator=g)  # (B, L) ordinary word pieces
    ids[:, 0], ids[:, -1] = tok.cls_token_id, tok.sep_token_id
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if loaded.takes_token_types:
        inputs["token_type_ids"] = torch.zeros_like(ids)
    return {k: v.to(device) for k, v in inputs.items()}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_time(model, inputs, device) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of one forward."""
    sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        model(**inputs)
    sync(device)
    return time.perf_counter() - t0, time.process_time() - c0


def time_models(models: dict, inputs: dict, repeats: int, device) -> dict[str, list[tuple[float, float]]]:
    """Seconds per forward of every model: a warm-up, then `repeats` rotated rounds."""
    names = list(models)
    for name in names:
        forward_time(models[name], inputs, device)
    times = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(forward_time(models[name], inputs, device))
    return times


def attention_share(model, inputs, device, repeats: int = 2) -> float:
    """Fraction of a forward spent inside the attention blocks (median over `repeats`),
    timed by forward hooks on each layer's attention module."""
    from bertscope.models import head_removal

    n_layers = head_removal.n_layers_heads(model.config)[0]
    blocks = {id(attention_block(model, layer)): attention_block(model, layer) for layer in range(n_layers)}
    spent, start = [0.0], {}

    def pre(module, args):
        sync(device)
        start[id(module)] = time.perf_counter()

    def post(module, args, output):
        sync(device)
        spent[0] += time.perf_counter() - start.pop(id(module))

    handles = [h for b in blocks.values() for h in (b.register_forward_pre_hook(pre), b.register_forward_hook(post))]
    try:
        shares = []
        for _ in range(repeats):
            spent[0] = 0.0
            total = forward_time(model, inputs, device)[0]
            shares.append(spent[0] / total)
    finally:
        for h in handles:
            h.remove()
    return statistics.median(shares)


def attention_block(model, layer):
    """The module that holds a layer's whole attention (projections, attention, output)."""
    from bertscope.models.architectures import architecture_of, attribute

    arch = architecture_of(model.config)
    return attribute(arch.layer_module(model, layer), arch.layers.block)


def header(args, loaded, elapsed) -> str:
    """When, what, where and how: the line under the command."""
    from bertscope.models.loading import model_name

    device = f"cpu ({cpu_name()})" if args.device == "cpu" else f"{args.device} ({torch.cuda.get_device_name()})"
    heads = (f"heads from {args.prune_order}" if args.prune_order
             else f"heads: an equal share per layer, seed {args.seed}")
    return (f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {elapsed / 60:.1f} min in all; model "
            f"{model_name(loaded.path)} ({loaded.n_layers} layers x {loaded.n_heads} heads, hidden "
            f"{loaded.model.config.hidden_size}); device {device}; torch {torch.__version__}, "
            f"{torch.get_num_threads()} intra-op thread(s); {heads}; {args.repeats} rounds ({args.big_repeats} where "
            f"batch x length >= {args.big} tokens), median per forward.")


def table(args, loaded, rows, shares, params, elapsed) -> str:
    lines = [
        "# Real head pruning: inference speed (bench/bench_prune.py)",
        "",
        f"`{' '.join(['python', *sys.argv])}`",
        "",
        header(args, loaded, elapsed),
        "",
        "Parameters (embeddings included): " + ", ".join(f"{name} {n / 1e6:.2f} M" for name, n in params.items()) + ".",
        "",
        "| batch | L | model | ms / forward | speed-up (wall) | speed-up (CPU time) | expected 1 / (1 - f s) |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for B, L, name, t, ratio, cpu_ratio, expected in rows:
        cpu = f"{cpu_ratio:.3f}" if args.device == "cpu" else "-"
        lines.append(f"| {B} | {L} | {name} | {1000 * t:.1f} | {ratio:.3f} | {cpu} | {expected:.3f} |")
    lines += ["", "Share of the unpruned forward spent in the attention blocks (Q, K, V, attention, output "
              "projection, LayerNorm), timed with forward hooks (s in the expected speed-up):", "",
              "| batch | L | attention share s |", "|---:|---:|---:|"]
    lines += [f"| {B} | {L} | {100 * s:.1f}% |" for (B, L), s in shares.items()]
    from bertscope.analyses.heads.prune.paper import MICHEL_PRUNING_FRACTION as F
    from bertscope.analyses.heads.prune.paper import MICHEL_PRUNING_SPEEDUP as S

    lines += ["", f"Reference: {S.source}: up to about {S.value:g}% faster inference with "
              f"{100 * F.value:.0f}% of the heads removed.", ""]
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
