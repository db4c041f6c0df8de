"""The cost of one long needle-in-a-haystack input: `bertscope heads retrieval`'s teacher-forced
pass against the bare SDPA forward, Wu et al.'s decode-time route, and `output_attentions`.

    python bench/bench_haystack.py [--runs gemma3:32768 smollm2:8192] [--depth 50] [--threads 1]
                                   [--methods floor retrieval decode eager] [--eager-max-gib 6]
                                   [--out bench/results_haystack.md]

Each (model, L, method) runs in a fresh process (`--child`; the parent never imports torch), so
that its peak RSS (`ru_maxrss` of that child alone, by `os.wait4`) is its own. The child loads
the model, builds one haystack of exactly L tokens (`HaystackBuilder`: Wikipedia, Wu et al.'s San
Francisco needle at --depth percent, the model's prompt: chat for SmolLM2-Instruct, plain for
Gemma-3), runs the method once on a 256-token haystack (warm-up), resets the kernel's high-water
mark (/proc/self/clear_refs, as bench_longmem.py) and times the method on the L-token one:

    floor      AutoModel(attn_implementation="sdpa") on the haystack's ids, no statistics, no
               cache (`bench_long.forward_for`): what the model costs
    retrieval  `score_haystack` (chunked backend): the argmax key of every head at the answer rows,
               the LM head on those rows; what one cell of `bertscope heads retrieval` costs
    decode     Wu et al.'s route: prefill the prompt but its last token (SDPA, with the KV cache),
               then greedy steps with eager attention and `output_attentions` (one row per layer
               and head per step) until a newline or the end-of-turn token, at most 50
    eager      AutoModel(attn_implementation="eager", output_attentions=True) on the whole input:
               the maps every tool that reads attention builds; run only where the maps
               (layers x heads x L^2 x 4 B) fit under --eager-max-gib, else their size is reported

Reported per row: seconds, the peak RSS of the child, the RSS before the timed call and the
peak above it (what the call itself needed), and for retrieval / decode whether the model
answered (copied / greedy output equal to the reference) and the hits. The weights are real but
dequantized from 4-bit GGUF (docs/decoders.md): the timings do not depend on that.
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

from bench_long import MODELS, eager_bytes, gib, shape_of  # noqa: E402  (bench/ is on sys.path now)
from bench_longmem import reset_peak_rss, status_bytes  # noqa: E402

METHODS = ("floor", "retrieval", "decode", "eager")
WARMUP_TOKENS = 256
NEEDLE = "san-francisco"
MAX_NEW_TOKENS = 50  # Wu et al.'s decode_len


def haystacks(tokenizer, L: int, depth: int):
    """(the L-token haystack, the warm-up one), built as `bertscope heads retrieval` builds them."""
    from bertscope.analyses.heads.retrieval.haystack import (
        HaystackBuilder,
        corpus_texts,
        load_needles,
        resolve_prompt,
    )

    needle = next(n for n in load_needles() if n.name == NEEDLE)
    builder = HaystackBuilder(tokenizer, corpus_texts("wiki"), resolve_prompt("auto", tokenizer))
    return builder.build(needle, L, depth), builder.build(needle, WARMUP_TOKENS, depth)


def segment_of(hay):
    from bertscope.text.segments import Segment

    L = len(hay.input_ids)
    return Segment(input_ids=list(hay.input_ids), token_type_ids=[0] * L, word_ids=[-1] * L, words=[],
                   doc_id=f"haystack-{L}")


def retrieval_runner(model_name: str):
    """(go, tokenizer): go(hay) -> what to report, one `score_haystack` pass."""
    from bertscope.analyses.heads.retrieval.stats import score_haystack
    from bertscope.models.loading import load_model

    loaded = load_model(model_name, task="causal-lm")

    def go(hay):
        score = score_haystack(loaded, hay, backend="chunked")
        return {"answered": score.copied, "hits": int(score.hits.sum())}
    return go, loaded.tokenizer


def decode_runner(model_name: str):
    """(go, tokenizer): Wu et al.'s route, SDPA prefill then eager decode steps with the maps of
    their one row (tests/analyses/heads/retrieval_decode.py is the scoring oracle; this only
    measures its cost and counts the hits the same way)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bertscope.models.source import resolve_model

    path = resolve_model(model_name).path
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32,
                                                 local_files_only=True).eval()
    stops = {tokenizer.eos_token_id} | {t for t in range(len(tokenizer)) if "\n" in tokenizer.decode([t])}

    def go(hay):
        prompt = list(hay.input_ids[:hay.answer[0]])
        ids = np.asarray(prompt)
        model.set_attn_implementation("sdpa")
        out = model(input_ids=torch.tensor([prompt[:-1]]), use_cache=True)  # the prefill
        model.set_attn_implementation("eager")  # the decode rows' maps: one row per layer and head
        cache, feed, produced, hits = out.cache, prompt[-1], [], 0
        for _ in range(MAX_NEW_TOKENS):
            out = model(input_ids=torch.tensor([[feed]]), cache=cache, use_cache=True, output_attentions=True)
            cache, feed = out.cache, int(out.logits[0, -1].argmax())
            total = len(ids) + len(produced)
            for a in out.attentions:  # (1, heads, 1, K); a sliding layer's K < total
                j = (a[0, :, -1].argmax(-1) + total - a.shape[-1]).numpy()
                inside = (j >= hay.needle[0]) & (j < hay.needle[1])
                hits += int((inside & (ids[np.clip(j, 0, len(ids) - 1)] == feed)).sum())
            produced.append(feed)
            if feed in stops:
                break
        reference = list(hay.input_ids[hay.answer[0]:])
        return {"answered": produced[:len(reference)] == reference, "hits": hits, "steps": len(produced)}
    return go, tokenizer


def child(method: str, model_name: str, L: int, depth: int, threads: int) -> dict:
    """One measurement in this process: load, build, warm up, time one call at L tokens."""
    import torch

    torch.set_num_threads(threads)
    if method == "retrieval":
        go, tokenizer = retrieval_runner(model_name)
    elif method == "decode":
        go, tokenizer = decode_runner(model_name)
    else:
        from bench_long import forward_for

        forward, tokenizer = forward_for(method, model_name)

        def go(hay):
            forward(segment_of(hay))
            return {}
    hay, warm = haystacks(tokenizer, L, depth)
    rss_loaded = status_bytes("VmRSS")
    with torch.inference_mode():
        go(warm)
        reset_peak_rss()
        before = status_bytes("VmRSS")
        t0 = time.perf_counter()
        out = go(hay)
        seconds = time.perf_counter() - t0
        peak = status_bytes("VmHWM")
    return {"seconds": seconds, "rss_loaded": rss_loaded, "rss_before": before, "peak_call": peak,
            "needle": list(hay.needle), "answer": list(hay.answer), **out}


def measure(method: str, model: str, L: int, args) -> dict:
    import tempfile

    command = [sys.executable, str(Path(__file__).resolve()), "--child", method, model, str(L), "--depth",
               str(args.depth), "--threads", str(args.threads)]
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: progress bars cannot fill it and block the child
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage: its peak RSS
        if status != 0:
            err.seek(0)
            raise RuntimeError(f"{method} {model} L={L} failed:\n{err.read()[-2000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss"] = usage.ru_maxrss * 1024
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", default=["gemma3:32768", "smollm2:8192"],
                        help="MODEL:L1,L2,... with MODEL one of " + ", ".join(MODELS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--depth", type=int, default=50, help="the needle's depth, percent (default: 50)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eager-max-gib", type=float, default=6.0)
    parser.add_argument("--out", type=Path, default=HERE / "results_haystack.md")
    parser.add_argument("--child", nargs=3, metavar=("METHOD", "MODEL", "L"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        method, model, L = args.child
        print(json.dumps(child(method, model, int(L), args.depth, args.threads)))
        return 0

    load_before = os.getloadavg()
    rows = []
    for run in args.runs:
        key, lengths = run.split(":")
        model = MODELS[key]
        n_layers, n_heads = shape_of(model)
        for L in map(int, lengths.split(",")):
            maps = eager_bytes(n_layers, n_heads, L)
            for method in args.methods:
                row = {"model": key, "L": L, "method": method, "maps": maps}
                if method == "eager" and maps > args.eager_max_gib * 2**30:
                    row["skipped"] = True
                else:
                    row.update(measure(method, model, L, args))
                print(json.dumps(row), flush=True)
                rows.append(row)
    write_table(args.out, rows, args, load_before, os.getloadavg())
    return 0


def write_table(path: Path, rows, args, load_before, load_after):
    lines = [
        "# One long haystack: the retrieval pass, the SDPA floor, Wu et al.'s decode route, output_attentions",
        "",
        f"`python bench/bench_haystack.py --runs {' '.join(args.runs)} --methods {' '.join(args.methods)} "
        f"--depth {args.depth} --threads {args.threads}` on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after. One call per "
        "fresh process after a 256-token warm-up. Weights dequantized from 4-bit GGUF (float32).",
        "",
        "| model | L | method | s | vs floor | peak RSS GiB | RSS before GiB | call's peak above it GiB "
        "| answered | hits | maps (output_attentions) GiB |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    floors = {(r["model"], r["L"]): r["seconds"] for r in rows if r["method"] == "floor" and "seconds" in r}
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r['model']} | {r['L']} | {r['method']} | does not fit | | | | | | | {gib(r['maps'])} |")
            continue
        floor = floors.get((r["model"], r["L"]))
        ratio = f"{r['seconds'] / floor:.2f}x" if floor else ""
        answered = "" if "answered" not in r else ("yes" if r["answered"] else "no")
        steps = f" ({r['steps']} steps)" if "steps" in r else ""
        lines.append(f"| {r['model']} | {r['L']} | {r['method']}{steps} | {r['seconds']:.1f} | {ratio} "
                     f"| {gib(r['peak_rss'])} | {gib(r['rss_before'])} | {gib(r['peak_call'] - r['rss_before'])} "
                     f"| {answered} | {r.get('hits', '')} | {gib(r['maps'])} |")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
