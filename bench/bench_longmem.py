"""Where the memory of one long forward goes: peak RSS against the tensors alive, per length.

    python bench/bench_longmem.py [--lengths 1024 8192] [--methods bertscope floor] [--threads 1]
                                  [--track] [--env MALLOC_MMAP_THRESHOLD_=1048576] [--out FILE]

Each (method, L) runs in a fresh process (`--child`) on SmolLM2-135M-Instruct (docs/decoders.md):
load, build one segment of exactly L tokens of consecutive Wikipedia text (`bench_long.long_segment`),
run one warm-up forward at 256 tokens, reset the kernel's high-water mark (/proc/self/clear_refs),
then run one forward of the L-token segment:

    bertscope  the statistics `bertscope run` computes (HeadProbe, chunked backend) into HeadStats
    floor      AutoModel(attn_implementation="sdpa"), no statistics

Reported: the RSS before the forward, the peak (VmHWM) and the difference, and the peak's ratio
to the shortest length's. `--track` also follows every tensor the forward makes (a
TorchDispatchMode: a storage counts while a tensor of it lives) and reports the most bytes alive
at once and what they were at that moment. The gap between that and the RSS increase is the
allocator's: freed memory it keeps. Tracking slows the forward several-fold.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
import weakref
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODEL = "smollm2-135m-instruct-q4_1"
WARMUP_TOKENS = 256


def reset_peak_rss():
    """Start the kernel's high-water mark of this process (VmHWM) again from its RSS now."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def status_bytes(key: str) -> int:
    """A size line of /proc/self/status (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def live_tracker():
    """A TorchDispatchMode counting the bytes of the storages that tensors made under it keep alive."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Live(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live, self.refs = {}, collections.Counter()
            self.bytes = self.peak = 0
            self.at_peak = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    storage = t.untyped_storage()
                    key = storage.data_ptr()
                    if not key:
                        continue
                    if key not in self.live:
                        self.live[key] = (str(func), tuple(t.shape), storage.nbytes())
                        self.bytes += storage.nbytes()
                    self.refs[key] += 1
                    weakref.finalize(t, self.release, key)
            if self.bytes > self.peak:
                self.peak, self.at_peak = self.bytes, dict(self.live)
            return out

        def release(self, key):
            self.refs[key] -= 1
            if self.refs[key] <= 0:
                del self.refs[key]
                self.bytes -= self.live.pop(key)[2]

    return Live()


def child(method: str, L: int, threads: int, track: bool) -> dict:
    import torch
    from bench_long import forward_for, long_segment

    torch.set_num_threads(threads)
    go, tokenizer = forward_for(method, MODEL)
    segment, warm = long_segment(tokenizer, L), long_segment(tokenizer, WARMUP_TOKENS)
    tracker = live_tracker() if track else None
    with torch.inference_mode():
        go(warm)
        reset_peak_rss()
        before = status_bytes("VmRSS")
        t0 = time.perf_counter()
        if tracker is None:
            go(segment)
        else:
            with tracker:
                go(segment)
        seconds = time.perf_counter() - t0
        peak = status_bytes("VmHWM")
    out = {"rss_before": before, "peak": peak, "seconds": seconds}
    if tracker is not None:
        by_kind = collections.Counter()
        for func, shape, n in tracker.at_peak.values():
            by_kind[f"{func} {shape}"] += n
        out["live_peak"] = tracker.peak
        out["live_at_peak"] = by_kind.most_common(12)
    return out


def measure(method: str, L: int, args) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", method, str(L), "--threads",
               str(args.threads)] + (["--track"] if args.track else [])
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **args.env}, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{method} L={L} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def mb(n: float) -> str:
    return f"{n / 1e6:,.0f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--methods", nargs="+", default=["bertscope"], choices=("bertscope", "floor"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--track", action="store_true", help="also count the tensors alive (slow)")
    parser.add_argument("--env", nargs="*", default=[], metavar="NAME=VALUE", help="for the children")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "L"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.threads, args.track)))
        return 0
    args.env = dict(item.split("=", 1) for item in args.env)
    load_before = os.getloadavg()
    lines = [f"`python bench/bench_longmem.py {' '.join(sys.argv[1:])}`; {os.cpu_count()} cores, load average "
             f"{load_before[0]:.2f} at the start", "",
             "| method | L | RSS before MB | peak MB | peak - before MB | peak vs shortest | tensors alive at most MB "
             "| forward s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    details = []
    for method in args.methods:
        first = None
        for L in args.lengths:
            r = measure(method, L, args)
            first = first or r["peak"]
            live = mb(r["live_peak"]) if "live_peak" in r else "-"
            lines.append(f"| {method} | {L} | {mb(r['rss_before'])} | {mb(r['peak'])} | "
                         f"{mb(r['peak'] - r['rss_before'])} | {r['peak'] / first:.2f}x | {live} "
                         f"| {r['seconds']:.1f} |")
            print(lines[-1], flush=True)
            if "live_at_peak" in r:
                details += ["", f"{method}, L={L}: tensors alive at the peak, by op and shape (MB)", ""]
                details += [f"- {name}: {mb(n)}" for name, n in r["live_at_peak"]]
    lines += details + ["", f"load average at the end {os.getloadavg()[0]:.2f}"]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
