"""Long contexts on the CPU: bertscope's statistics forward against the bare SDPA forward, and
against eager attention with `output_attentions` where its maps fit, on real decoders.

    python bench/bench_long.py [--runs smollm2:1024,4096,8192 gemma3:16384,32768] [--threads N]
                               [--eager-max-gib 6] [--out bench/results_long.md]

Each measurement is a fresh process (`--child`), so that its peak RSS (`ru_maxrss`, read by
`os.wait4` on that child alone) is its own; the parent never imports torch. Every child loads
the model, builds one segment of exactly L tokens of consecutive Wikipedia lead sections
(`common.wiki_token_stream`, with the tokenizer's own BOS where its template adds one), runs one
warm-up forward at 256 tokens, then times one forward of the L-token segment:

    floor      AutoModel(attn_implementation="sdpa"), no statistics: what the model costs
    bertscope  the statistics `bertscope run` computes (HeadProbe, chunked backend) folded into
               HeadStats: what an analysis costs
    eager      AutoModel(attn_implementation="eager", output_attentions=True): what tools that
               read the maps cost; run only where the maps (layers x heads x L^2 x 4 B) fit
               under --eager-max-gib, otherwise the bytes they would need are reported

Reported per (model, L): seconds of the forward, tokens per second, the throughput ratio
bertscope / floor (target >= 0.8x), the peak RSS of each child and the ratio of the peaks
(target <= 1.25x), and the RSS after loading (the model itself), so that the growth with L is
the activations'. The weights are real but were stored in 4 bits and dequantized on load
(docs/decoders.md): the timings do not depend on it, the statistics would.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODELS = {"smollm2": "smollm2-135m-instruct-q4_1", "gemma3": "gemma-3-270m-q4_k_m"}  # --model names
METHODS = ("floor", "bertscope", "eager")
WARMUP_TOKENS = 256


def forward_for(method: str, model_name: str):
    """(go, tokenizer): go(segment) runs one forward of `method` ("bertscope": the statistics
    forward of `bertscope run`; "floor" / "eager": the model alone with SDPA / eager attention)."""
    import torch

    if method == "bertscope":
        from bertscope.analyses.surface.command import RunSettings
        from bertscope.engine.accumulate import HeadStats
        from bertscope.engine.loop import run_batch
        from bertscope.models.attention import HeadProbe
        from bertscope.models.loading import load_model

        loaded = load_model(model_name)
        spec = RunSettings().spec()
        probe = HeadProbe(loaded.n_layers, loaded.n_heads, spec, backend="chunked")

        def go(seg):
            run_batch(loaded, probe, [seg], HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes))
        return go, loaded.tokenizer
    # the model alone, as transformers loads it (no second copy in this process)
    from transformers import AutoModel, AutoTokenizer

    from bertscope.models.source import resolve_model

    path = resolve_model(model_name).path
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, attn_implementation="sdpa" if method == "floor" else "eager",
                                      dtype=torch.float32, local_files_only=True).eval()

    def go(seg):  # no cache, as an analysis runs it (`LoadedModel.forward_options`): at 8k it is 377 MB
        model(input_ids=torch.tensor([seg.input_ids]), output_attentions=method == "eager", use_cache=False)
    return go, tokenizer


def child(method: str, model_name: str, L: int, threads: int) -> dict:
    """One measurement in this process: load, warm up, time one forward of L tokens."""
    import resource

    import torch

    torch.set_num_threads(threads)
    go, tokenizer = forward_for(method, model_name)
    segment, warm = long_segment(tokenizer, L), long_segment(tokenizer, WARMUP_TOKENS)
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with torch.inference_mode():
        go(warm)
        t0 = time.perf_counter()
        go(segment)
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "rss_loaded": rss_loaded}


def long_segment(tokenizer, L: int):
    """One Segment of exactly L tokens: the template's BOS (if any), then running Wikipedia text."""
    from common import wiki_token_stream

    from bertscope.text.segments import Segment

    bos = tokenizer("a", add_special_tokens=True).input_ids[:1]
    bos = bos if bos and bos[0] == tokenizer.bos_token_id and bos != tokenizer("a", add_special_tokens=False
                                                                                   ).input_ids[:1] else []
    ids, word_ids, words = wiki_token_stream(tokenizer, L - len(bos))
    first = {w: i for i, w in enumerate(dict.fromkeys(word_ids))}
    return Segment(input_ids=bos + ids, token_type_ids=[0] * L, word_ids=[-1] * len(bos) + [first[w] for w in word_ids],
                   words=[words[w] for w in first], doc_id=f"wiki-stream:{L}")


def eager_bytes(n_layers: int, n_heads: int, L: int) -> int:
    """What output_attentions returns: one float32 (1, heads, L, L) map per layer."""
    return n_layers * n_heads * L * L * 4


def measure(method: str, model: str, L: int, threads: int) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", method, model, str(L), "--threads",
               str(threads)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    out, err = proc.stdout.read(), proc.stderr.read()
    if status != 0:
        raise RuntimeError(f"{method} {model} L={L} failed:\n{err[-2000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss"] = usage.ru_maxrss * 1024
    return result


def shape_of(model_name: str) -> tuple[int, int]:
    """(layers, query heads) from the converted folder's config, without importing torch."""
    from bertscope.models.source import resolve_model

    config = json.loads((Path(resolve_model(model_name).path) / "config.json").read_text())
    return config["num_hidden_layers"], config["num_attention_heads"]


def gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", default=["smollm2:1024,4096,8192", "gemma3:16384,32768"],
                        help="MODEL:L1,L2,... with MODEL one of " + ", ".join(MODELS))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--eager-max-gib", type=float, default=6.0)
    parser.add_argument("--out", type=Path, default=HERE / "results_long.md")
    parser.add_argument("--child", nargs=3, metavar=("METHOD", "MODEL", "L"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        method, model, L = args.child
        print(json.dumps(child(method, model, int(L), args.threads)))
        return 0

    load_before = os.getloadavg()
    rows = []
    for run in args.runs:
        key, lengths = run.split(":")
        model = MODELS[key]
        n_layers, n_heads = shape_of(model)
        for L in map(int, lengths.split(",")):
            row = {"model": key, "L": L, "eager_bytes": eager_bytes(n_layers, n_heads, L)}
            for method in METHODS:
                if method == "eager" and row["eager_bytes"] > args.eager_max_gib * 2**30:
                    continue
                row[method] = measure(method, model, L, args.threads)
                print(key, L, method, row[method], flush=True)
            rows.append(row)
    write_table(args.out, rows, args, load_before, os.getloadavg())
    return 0


def write_table(path: Path, rows, args, load_before, load_after):
    lines = [
        "# Long contexts on the CPU: statistics forward vs the bare SDPA forward",
        "",
        f"`python bench/bench_long.py --runs {' '.join(args.runs)} --threads {args.threads}` on "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after. One forward of one segment of L tokens of "
        "consecutive Wikipedia lead sections per fresh process, after a 256-token warm-up; peak RSS of that "
        "process. Weights: SmolLM2-135M-Instruct and Gemma-3-270M dequantized from 4-bit GGUF (float32).",
        "",
        "| model | L | floor s | bertscope s | throughput vs floor | floor peak GiB | bertscope peak GiB "
        "| peak vs floor | loaded GiB | eager s | eager maps GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f, b, e = r["floor"], r["bertscope"], r.get("eager")
        eager_s = f"{e['seconds']:.1f}" if e else "does not fit"
        lines.append(
            f"| {r['model']} | {r['L']} | {f['seconds']:.1f} | {b['seconds']:.1f} | {f['seconds'] / b['seconds']:.2f}x "
            f"| {gib(f['peak_rss'])} | {gib(b['peak_rss'])} | {b['peak_rss'] / f['peak_rss']:.2f}x "
            f"| {gib(b['rss_loaded'])} | {eager_s} "
            f"| {gib(r['eager_bytes'])} |")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
