"""Throughput and peak memory of bertscope's surface suite against the bare model and the usual way.

    python bench/bench_surface.py [--lengths 128 256 512] [--batch-size 16] [--batches 3]
                                  [--repeats 5] [--out bench/results.md] [--profile L]

Three methods, on the same Wikipedia text, with the real all-MiniLM-L6-v2:
    floor      AutoModel with attn_implementation="sdpa": the bare forward, no statistics
    eager+maps attn_implementation="eager", output_attentions=True, then the surface
               statistics computed from the returned maps with vectorised torch
    bertscope  bertscope.engine.loop.run_batch with a HeadProbe (RunSettings().spec(), backend
               "chunked") accumulating into HeadStats

Every segment has exactly L tokens (`[CLS] a [SEP] b [SEP]`, consecutive article text), so
no method gains from padding. Throughput: in each repeat the three methods take turns
batch by batch in rotated order (floor, eager, bertscope on batch 1; eager, bertscope,
floor on batch 2; ...), each method's time summed over its `--batches` batches; the table
gives the median over repeats (and the best, and the paired ratio). Peak memory: every
(method, L) runs in a fresh subprocess (`--_memory-probe METHOD L`), which loads only what
its method needs, runs one small warm-up forward, records its RSS, and then runs the same
measurement; the peak comes from resource.getrusage().ru_maxrss.

Memory probes run first, while this process has not imported torch: on Linux a child's
ru_maxrss starts at its parent's RSS (the kernel carries the high-water mark across
fork/exec), so a parent holding three models would mask the probes' own peaks.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import make_batches, wiki_token_stream

METHODS = ("floor", "eager+maps", "bertscope")
METHOD_HELP = {
    "floor": 'bare forward, attn_implementation="sdpa", no statistics',
    "eager+maps": 'attn_implementation="eager", output_attentions=True, statistics from the maps',
    "bertscope": 'engine.run_batch, HeadProbe(RunSettings().spec(), backend="chunked") -> HeadStats',
}


# --- the three methods -----------------------------------------------------------------


class MapStats:
    """(b)'s accumulator: the surface statistics, read off full attention maps.

    Per layer, head, row group (all valid queries, then [CLS], [SEP], punct queries) and
    feature (entropy, p[i, i+o] for each offset, mass on each key class): float64 sums, as
    HeadStats keeps them. sep_sep and cls entropy are the [SEP]- and [CLS]-row groups.
    """

    def __init__(self, n_layers, n_heads, offsets, n_classes):
        import torch

        from bertscope.kernels.spec import StatsSpec

        self.offsets, self.C = tuple(offsets), n_classes
        self.spec = StatsSpec(offsets=self.offsets, n_key_classes=n_classes, entropy=True, class_mass=True)
        G, F = n_classes, 1 + len(offsets) + n_classes  # groups: all + every class but "other"
        self.sums = torch.zeros(n_layers, n_heads, G, F, dtype=torch.float64)
        self.n_rows = torch.zeros(G, dtype=torch.float64)

    def add(self, attentions, key_valid, key_class):
        """attentions: per layer (B, H, L, L) probabilities; key_valid, key_class: (B, L)."""
        import torch
        import torch.nn.functional as F

        from bertscope.kernels.reference import stats_from_probs

        valid = key_valid.double()
        groups = torch.cat([valid[..., None], F.one_hot(key_class, self.C)[..., :-1] * valid[..., None]], -1)
        self.n_rows += groups.sum((0, 1))
        for layer, p in enumerate(attentions):  # (B, H, L, L)
            st = stats_from_probs(p, key_valid, key_class, self.spec)  # the oracle's statistics of the maps
            feats = torch.cat([st.entropy[..., None], st.offset_mass, st.class_mass], -1)  # (B, H, L, F)
            self.sums[layer] += torch.einsum("bhlf,blg->hgf", feats.double(), groups)

    def mean(self, feature: int, group: int = 0):
        """(layers, H) per-row mean of one feature over one row group."""
        return (self.sums[:, :, group, feature] / self.n_rows[group].clamp_min(1)).numpy()


class Runner:
    """Holds whatever each method needs; `measure(method, batches)` runs it on batches of Segments."""

    def __init__(self, methods, spec_settings=None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        from bertscope.models.loading import default_model_dir, load_model, token_class_table

        self.torch = torch
        self.models = {}
        path = default_model_dir()
        if "bertscope" in methods:
            from bertscope.analyses.surface.command import RunSettings
            from bertscope.models.attention import HeadProbe

            self.loaded = load_model()
            self.tokenizer, self.class_table = self.loaded.tokenizer, self.loaded.class_table
            self.spec = RunSettings().spec()
            self.probe = HeadProbe(self.loaded.n_layers, self.loaded.n_heads, self.spec, backend="chunked")
            path = self.loaded.path
        else:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            self.class_table = token_class_table(self.tokenizer)
        for method, impl in (("floor", "sdpa"), ("eager+maps", "eager")):
            if method in methods:
                self.models[method] = AutoModel.from_pretrained(
                    path, attn_implementation=impl, local_files_only=True).eval()
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.last = {}  # method -> accumulator of its latest measurement

    def new_accumulator(self, method):
        """An empty accumulator of `method`'s statistics (None for floor, which keeps none)."""
        if method == "eager+maps":
            from bertscope.analyses.surface.command import RunSettings

            spec, cfg = RunSettings().spec(), self.models["eager+maps"].config
            return MapStats(cfg.num_hidden_layers, cfg.num_attention_heads, spec.offsets, spec.n_key_classes)
        if method == "bertscope":
            from bertscope.engine.accumulate import HeadStats

            ld = self.loaded
            return HeadStats(ld.n_layers, ld.n_heads, self.spec, ld.class_names)
        return None

    def step(self, method, batch, acc):
        """One batch of `method`: forward pass and, but for floor, statistics into `acc`."""
        from bertscope.engine.loop import run_batch
        from bertscope.text.segments import collate

        with self.torch.inference_mode():
            if method == "floor":
                self.models["floor"](**collate(batch, self.pad_id))
            elif method == "eager+maps":
                inputs = collate(batch, self.pad_id)
                out = self.models["eager+maps"](**inputs, output_attentions=True)
                acc.add(out.attentions, inputs["attention_mask"].bool(), self.class_table[inputs["input_ids"]])
            elif method == "bertscope":
                run_batch(self.loaded, self.probe, batch, acc)
            else:
                raise ValueError(method)

    def measure(self, method, batches):
        """Run `method` over every batch, accumulating its statistics; returns the accumulator."""
        acc = self.new_accumulator(method)
        for batch in batches:
            self.step(method, batch, acc)
        self.last[method] = acc
        return acc


# --- memory probe (runs in a fresh subprocess) -----------------------------------------


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def memory_probe(method: str, L: int, batch_size: int, n_batches: int) -> dict:
    start_maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # inherited from the parent
    import torch

    runner = Runner((method,))
    body = L - 3
    stream = wiki_token_stream(runner.tokenizer, body * batch_size * n_batches)
    batches = make_batches(runner.tokenizer, L, batch_size, n_batches, stream)
    runner.measure(method, [batches[0][:1]])  # one small warm-up forward (1 segment)
    gc.collect()
    baseline = _status_kib("VmRSS")
    try:  # reset the kernel's high-water mark to the current RSS (mm only; see the notes)
        Path("/proc/self/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    maxrss_after_reset = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    runner.measure(method, batches)
    elapsed = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    hwm = _status_kib("VmHWM")
    return {
        "method": method, "L": L, "threads": torch.get_num_threads(),
        "start_maxrss_kib": start_maxrss, "baseline_rss_kib": baseline, "hwm_reset": reset,
        "maxrss_after_reset_kib": maxrss_after_reset, "peak_maxrss_kib": peak, "vmhwm_kib": hwm,
        # ru_maxrss can only report a peak above everything before the reset (thread exits
        # fold the mm's high-water mark into it); then VmHWM, which the reset did clear, is used
        "masked": peak <= maxrss_after_reset and reset,
        "elapsed_s": elapsed,
    }


def run_memory_probes(args) -> dict:
    results = {}
    for L in args.lengths:
        for method in METHODS:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--_memory-probe", method, str(L),
                   "--batch-size", str(args.batch_size), "--batches", str(args.batches)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr)
                raise RuntimeError(f"memory probe {method} L={L} failed")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            peak_kib = r["vmhwm_kib"] if r["masked"] else r["peak_maxrss_kib"]
            r["process_peak_mib"] = peak_kib / 1024
            r["forward_peak_mib"] = (peak_kib - r["baseline_rss_kib"]) / 1024
            results[(method, L)] = r
            print(f"  memory {method:<10} L={L:<4} baseline {r['baseline_rss_kib'] / 1024:7.1f} MiB  "
                  f"peak {r['process_peak_mib']:7.1f} MiB (+{r['forward_peak_mib']:.1f})  "
                  f"[ru_maxrss {r['peak_maxrss_kib'] / 1024:.1f}, VmHWM {r['vmhwm_kib'] / 1024:.1f}, "
                  f"inherited {r['start_maxrss_kib'] / 1024:.1f} MiB{', masked: used VmHWM' if r['masked'] else ''}]",
                  flush=True)
    return results


# --- throughput ------------------------------------------------------------------------


def run_throughput(args, runner) -> dict:
    """seconds[(method, L)]: per repeat, the method's time over all `--batches` batches.

    Interleaved at batch granularity: for every batch the three methods run back to back,
    in an order rotated by batch and repeat, so each method's measurement spans the same
    stretch of time as the others' (other processes come and go on a shared machine).
    """
    seconds = {}
    stream = wiki_token_stream(runner.tokenizer, (max(args.lengths) - 3) * args.batch_size * args.batches)
    for L in args.lengths:
        batches = make_batches(runner.tokenizer, L, args.batch_size, args.batches, stream)
        n_seg = sum(len(b) for b in batches)
        for method in METHODS:  # warm-up: one batch each
            runner.measure(method, batches[:1])
        for r in range(args.repeats):
            accs = {m: runner.new_accumulator(m) for m in METHODS}
            spent = dict.fromkeys(METHODS, 0.0)
            for i, batch in enumerate(batches):
                k = (r + i) % len(METHODS)
                for method in METHODS[k:] + METHODS[:k]:  # rotate: no method always runs first
                    gc.collect()
                    t0 = time.perf_counter()
                    runner.step(method, batch, accs[method])
                    spent[method] += time.perf_counter() - t0
            runner.last.update(accs)
            for m in METHODS:
                seconds.setdefault((m, L), []).append(spent[m])
            line = "  ".join(f"{m} {n_seg / spent[m]:6.2f}" for m in METHODS)
            print(f"  L={L:<4} repeat {r + 1}/{args.repeats}: seg/s  {line}  (load {os.getloadavg()[0]:.2f})",
                  flush=True)
    return seconds


def check_agreement(runner) -> list[str]:
    """(c) computes real statistics and (b) agrees with it: the last measured config."""
    import numpy as np

    hs, ms = runner.last["bertscope"], runner.last["eager+maps"]
    assert hs.n_segments > 0 and hs.n_rows[0, 0] > 0, "bertscope saw no rows"
    for name in ("entropy_sum", "offset_mass_sum", "class_mass_sum"):
        assert np.abs(getattr(hs, name)).sum() > 0, f"bertscope's {name} is all zero"
    O, names = len(hs.spec.offsets), hs.class_names
    sep, cls = names.index("sep"), names.index("cls")
    assert ms.n_rows.tolist() == hs.n_rows[0, : len(ms.n_rows)].tolist(), "row counts differ"  # no non_sep group here
    checks = {
        "sep mass": (hs.mean("class_mass_sum")[..., sep], ms.mean(1 + O + sep)),
        "cls mass": (hs.mean("class_mass_sum")[..., cls], ms.mean(1 + O + cls)),
        "entropy": (hs.mean("entropy_sum"), ms.mean(0)),
        "prev/self/next": (hs.mean("offset_mass_sum")[..., [hs.spec.offsets.index(o) for o in (-1, 0, 1)]],
                           np.stack([ms.mean(1 + hs.spec.offsets.index(o)) for o in (-1, 0, 1)], -1)),
        "sep_sep": (hs.mean("class_mass_sum", group="sep")[..., sep], ms.mean(1 + O + sep, group=1 + sep)),
        "cls entropy": (hs.mean("entropy_sum", group="cls"), ms.mean(0, group=1 + cls)),
    }
    lines = []
    for what, (a, b) in checks.items():
        lines.append(f"max |bertscope - eager+maps| per head, mean {what}: {np.abs(a - b).max():.2e}")
    sep_diff = np.abs(checks["sep mass"][0] - checks["sep mass"][1]).max()
    assert sep_diff < 1e-4, f"mean [SEP] mass per head differs by {sep_diff}"
    return lines


# --- profile ---------------------------------------------------------------------------


def profile(runner, batches, repeats=3, rows=16):
    """Where the time of one batch goes: a wall-clock split, then torch.profiler's op table.

    The split wraps (at run time, nothing is edited) torch's SDPA for floor, and for
    bertscope the chunked kernel and the HeadStats sink; "rest" is the model outside
    attention, which both share. Each method runs `repeats` times, interleaved; the fastest
    repeat is shown (the others mostly measure other processes on the machine).
    """
    from collections import defaultdict

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    import bertscope.kernels.backends as K
    from bertscope.engine.accumulate import HeadStats

    timers = defaultdict(float)

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                timers[name] += time.perf_counter() - t0
        return wrapper

    F = torch.nn.functional
    saved = (F.scaled_dot_product_attention, K.BACKENDS["chunked"], HeadStats.add)
    F.scaled_dot_product_attention = timed("attention (torch SDPA)", saved[0])
    K.BACKENDS["chunked"] = timed("attention + row stats (chunked kernel)", saved[1])
    HeadStats.add = timed("HeadStats.add (per-segment sums, float64 einsums)", saved[2])
    best = {}
    try:
        for method in ("floor", "bertscope"):
            runner.measure(method, batches[:1])  # warm-up
        for _ in range(repeats):
            for method in ("floor", "bertscope"):
                timers.clear()
                gc.collect()
                t0 = time.perf_counter()
                runner.measure(method, batches[:1])
                total = time.perf_counter() - t0
                if method not in best or total < best[method][0]:
                    best[method] = (total, dict(timers))
    finally:
        F.scaled_dot_product_attention, K.BACKENDS["chunked"], HeadStats.add = saved
    B, L = len(batches[0]), batches[0][0].n_tokens
    print(f"\n### wall-clock split, one batch of {B} x L={L} (fastest of {repeats}, load {os.getloadavg()[0]:.2f})\n")
    print("| method | part | s | share |\n|---|---|---:|---:|")
    for method, (total, parts) in best.items():
        for part, t in sorted(parts.items(), key=lambda kv: -kv[1]):
            print(f"| {method} | {part} | {t:.3f} | {t / total:.0%} |")
        rest = total - sum(parts.values())
        print(f"| {method} | rest (model outside attention, collate) | {rest:.3f} | {rest / total:.0%} |")
        print(f"| {method} | **total** | **{total:.3f}** | |")

    for method in ("floor", "bertscope"):
        with tprofile(activities=[ProfilerActivity.CPU]) as prof:
            runner.measure(method, batches[:1])
        print(f"\n### torch.profiler, {method}, one batch of {B} x L={L} (profiler overhead included)\n")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


# --- report ----------------------------------------------------------------------------


def throughput_ratios(floor_t, t) -> dict:
    """Method throughput / floor throughput, three ways (times in seconds, one per repeat)."""
    return {
        "median": statistics.median(floor_t) / statistics.median(t),
        "paired": statistics.median(f / x for f, x in zip(floor_t, t)),  # same repeat, same load
        "best": min(floor_t) / min(t),
    }


def report(args, seconds, memory, info_lines, check_lines) -> str:
    n_seg = args.batch_size * args.batches
    rows = ["| L | method | seg/s (median) | seg/s (best) | ratio to floor | paired ratio | best ratio | "
            "peak forward MiB | ratio | process peak MiB | ratio |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    verdicts = []
    for L in args.lengths:
        floor_t = seconds[("floor", L)]
        for method in METHODS:
            t = seconds[(method, L)]
            med, best = n_seg / statistics.median(t), n_seg / min(t)
            m, mf = memory.get((method, L)), memory.get(("floor", L))
            mem = ("| - | - | - | - |" if m is None else
                   f"| {m['forward_peak_mib']:.1f} | {m['forward_peak_mib'] / mf['forward_peak_mib']:.2f}x "
                   f"| {m['process_peak_mib']:.1f} | {m['process_peak_mib'] / mf['process_peak_mib']:.2f}x |")
            r = throughput_ratios(floor_t, t)
            rows.append(f"| {L} | {method} | {med:.2f} | {best:.2f} | {r['median']:.2f}x | {r['paired']:.2f}x "
                        f"| {r['best']:.2f}x {mem}")
        need = {512: 0.8, 128: 0.9}.get(L)
        if need is not None:
            r = throughput_ratios(floor_t, seconds[("bertscope", L)])
            ok = {k: v >= need for k, v in r.items()}
            note = "" if len(set(ok.values())) == 1 else (
                f" (noisy: paired {r['paired']:.2f}x, best {r['best']:.2f}x "
                f"{'pass' if ok['paired'] else 'fail'}/{'pass' if ok['best'] else 'fail'})")
            verdicts.append(f"- throughput L={L}: bertscope {r['median']:.2f}x floor (target >= {need}x): "
                            f"{'PASS' if ok['median'] else 'FAIL'}{note}")
        if memory:
            mc, ma = memory[("bertscope", L)], memory[("floor", L)]
            fr = mc["forward_peak_mib"] / ma["forward_peak_mib"]
            pr = mc["process_peak_mib"] / ma["process_peak_mib"]
            verdicts.append(f"- memory L={L}: bertscope peak forward {fr:.2f}x floor (strict), "
                            f"process peak {pr:.2f}x (target <= 1.25x): strict {'PASS' if fr <= 1.25 else 'FAIL'}, "
                            f"process {'PASS' if pr <= 1.25 else 'FAIL'}")
    raw = [f"- {m} L={L}: " + ", ".join(f"{x:.2f}" for x in t) for (m, L), t in seconds.items()]
    parts = [
        "# bertscope surface suite: throughput and memory", "",
        "```", f"$ {' '.join(['python', *map(shlex.quote, sys.argv)])}", *info_lines, "```", "",
        "Methods:", *[f"- **{m}**: {METHOD_HELP[m]}" for m in METHODS], "",
        f"Each measurement: {args.batches} batches x {args.batch_size} segments of exactly L tokens "
        f"({n_seg} segments); {args.repeats} repeats; within a repeat the methods take turns batch "
        "by batch, in rotated order. seg/s (median) and the ratio to floor use the median time over "
        "repeats; seg/s (best) and the best ratio the fastest repeat of each method; the paired ratio "
        "is the median over repeats of floor time / method time within the same repeat. The PASS/FAIL "
        "verdict uses the ratio of medians; when the three estimators disagree it says so. Peak forward MiB: peak RSS "
        "during the measurement minus RSS after loading and one warm-up forward (fresh process per cell); process peak "
        "MiB: the whole process's RSS at that peak (baseline + peak forward; about 0.5 GiB of every process is "
        "torch and transformers themselves).", "",
        *rows, "", "Targets:", *verdicts, "", "Agreement (last measured config):",
        *[f"- {line}" for line in check_lines], "", "Seconds per measurement, by repeat:", *raw, "",
    ]
    return "\n".join(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench/results.md")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    ap.add_argument("--profile", type=int, metavar="L", help="only print a torch.profiler breakdown of "
                    "floor vs bertscope for one batch at length L")
    ap.add_argument("--_memory-probe", nargs=2, metavar=("METHOD", "L"), dest="memory_probe",
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.memory_probe:
        method, L = args.memory_probe
        print(json.dumps(memory_probe(method, int(L), args.batch_size, args.batches)))
        return 0

    t_start = time.perf_counter()
    load_start = os.getloadavg()
    memory = {}
    if not args.no_memory and args.profile is None:
        print("memory probes (one fresh process per method and length):", flush=True)
        memory = run_memory_probes(args)

    import torch
    import transformers

    info = [f"torch {torch.__version__}, transformers {transformers.__version__}, "
            f"torch threads {torch.get_num_threads()} (default), {os.cpu_count()} CPUs, "
            f"python {platform.python_version()}, {platform.machine()}"]
    print(info[0], flush=True)
    runner = Runner(METHODS)

    if args.profile is not None:
        stream = wiki_token_stream(runner.tokenizer, (args.profile - 3) * args.batch_size)
        profile(runner, make_batches(runner.tokenizer, args.profile, args.batch_size, 1, stream))
        return 0

    print("throughput:", flush=True)
    seconds = run_throughput(args, runner)
    check_lines = check_agreement(runner)
    info.append(f"load average (1 min) at start {load_start[0]:.2f}, at end {os.getloadavg()[0]:.2f}; "
                f"total {time.perf_counter() - t_start:.0f} s")
    text = report(args, seconds, memory, info, check_lines)
    print()
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
