"""`make gpu-check`: everything a lent GPU should measure, in one command, into bench/results_gpu.md.

    python bench/gpu_check.py [--python PYTHON] [--out bench/results_gpu.md] [--steps NAME ...]

Steps, each in its own process with a time limit, its output captured:
    kernel_probe  python bench/kernel_probe.py (first, a minute: the fused forward against the flash baseline
                  and SDPA, kernel only, D 64 and 128, plain and causal GQA, bf16, L = 4k: the number the
                  instruction budget predicts, docs/gpu.md)
    selftest      bertscope selftest (every backend against eager on the GPU, fp16/bf16 too)
    aot           python -m bertscope.kernels.triton_aot --layouts core (registers, spills, shared memory
                  of every shipped kernel, the layout kernel's largest specialisations, for the device's
                  architecture when the report knows it)
    bench_triton  python bench/bench_triton.py --no-aot (kernel timings against eager, chunked, SDPA)
    bench_gpu     python bench/bench_gpu.py --quick --no-decoder (end to end: SDPA floor, eager + maps, bertscope)
    bench_decoder python bench/bench_gpu.py --quick --decoder-only (a Llama-3.2-1B-shaped decoder, bf16,
                  L = 4k and 32k: SDPA / flash floor against bertscope's statistics forward, and the
                  attention alone)
    pytest_gpu    python -m pytest -m gpu tests (the kernel parity tests on compiled kernels)
The report is written even when a step fails or times out (and after each step, so an
interrupted check leaves what it had); the exit code is 1 if any step failed. It uses the
python it is given (default: the one running it) and installs nothing: on the GPU image,
`pip install --no-deps .` with the image's torch and Triton, then `make gpu-check`.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("kernel_probe", "selftest", "aot", "bench_triton", "bench_gpu", "bench_decoder", "pytest_gpu")
# seconds per step: the whole check is meant to stay under 10 minutes on one H100
LIMITS = {"kernel_probe": 90, "selftest": 150, "aot": 240, "bench_triton": 60, "bench_gpu": 180, "bench_decoder": 150,
          "pytest_gpu": 100}
OUTPUT_TAIL = 150  # lines of a step's output kept in the report (a markdown table in full)


def commands(py: str, arch: int | None, tmp: Path) -> dict[str, list[str]]:
    cli = "import sys; from bertscope.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return {
        "kernel_probe": [py, "bench/kernel_probe.py", "--out", str(tmp / "kernel_probe.md")],
        "selftest": [py, "-c", cli, "selftest", "--device", "cuda"],
        "aot": [py, "-m", "bertscope.kernels.triton_aot", "--layouts", "core",
                *(["--arch", str(arch)] if arch else [])],
        "bench_triton": [py, "bench/bench_triton.py", "--no-aot", "--out", str(tmp / "bench_triton.md")],
        "bench_gpu": [py, "bench/bench_gpu.py", "--quick", "--no-decoder", "--out", str(tmp / "bench_gpu.md")],
        "bench_decoder": [py, "bench/bench_gpu.py", "--quick", "--decoder-only", "--out",
                          str(tmp / "bench_decoder.md")],
        "pytest_gpu": [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"],
    }


def probe_environment(py: str) -> tuple[dict, int | None]:
    """Device name, driver, torch, CUDA and Triton versions as `py` sees them; the device's sm_XY."""
    script = """
import json, torch
info = {"torch": torch.__version__, "cuda (torch built with)": str(torch.version.cuda)}
try:
    import triton
    info["triton"] = triton.__version__
except ImportError:
    info["triton"] = "not installed"
if torch.cuda.is_available():
    cc = torch.cuda.get_device_capability()
    info.update(device=torch.cuda.get_device_name(), capability=f"sm_{cc[0]}{cc[1]}",
                memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
else:
    info["device"] = "none (torch sees no CUDA GPU)"
print(json.dumps(info))
"""
    import json

    try:
        out = subprocess.run([py, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as e:
        info = {"device": f"unknown ({py} could not report: {e})"}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=False)
        info["driver"] = smi.stdout.strip().splitlines()[0].split(",")[-1].strip() if smi.returncode == 0 else "-"
    except (OSError, subprocess.SubprocessError, IndexError):
        info["driver"] = "- (no nvidia-smi)"
    info["python"] = platform.python_version()
    cap = info.get("capability", "")
    arch = int(cap[3:]) if cap.startswith("sm_") and cap[3:] in ("80", "90") else None
    return info, arch


def step_env(cmd: list[str]) -> dict[str, str]:
    """The environment of a step. `python -c` and `python -m` put the working directory, ROOT, first on
    sys.path, and ROOT/bertscope, the source folder, would then stand in for the package that
    `pip install --no-deps .` installed: the check is of the installed package (on the first lent GPU,
    before bertscope/kernels and bertscope/analyses were links, the source folder lacked both and every
    such step failed). PYTHONSAFEPATH=1 (Python 3.11 and later) leaves ROOT off sys.path for those steps.
    A script (bench/*.py) puts its own folder first instead, not ROOT, and is left as it is."""
    env = dict(os.environ)
    if len(cmd) > 1 and cmd[1] in ("-c", "-m"):
        env["PYTHONSAFEPATH"] = "1"
    return env


def run_step(name: str, cmd: list[str], limit: float) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=ROOT, env=step_env(cmd),
                           check=False)
        code, output = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        code = "timeout"
        output = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        output += f"\n(stopped after {limit:.0f} s)"
    except OSError as e:
        code, output = "not run", str(e)
    return {"name": name, "cmd": cmd, "code": code, "seconds": time.perf_counter() - t0, "output": output}


def verdict(r: dict) -> str:
    return "ok" if r["code"] == 0 else f"FAILED ({r['code']})"


def report(info: dict, results: list[dict], tmp: Path, total: float) -> str:
    ok = all(r["code"] == 0 for r in results)
    lines = ["# make gpu-check", "",
             f"{'All steps passed' if ok else 'SOME STEPS FAILED'}; {total:.0f} s in all.", "",
             "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in info.items()]
    lines += ["", "| step | result | seconds |", "|---|---|---|"]
    lines += [f"| {r['name']} | {verdict(r)} | {r['seconds']:.0f} |" for r in results]
    for r in results:
        shown = " ".join([Path(r["cmd"][0]).name, *r["cmd"][1:]]).replace(str(tmp), "$TMP")
        lines += ["", f"## {r['name']}", "", f"`{shown}`: {verdict(r)}, {r['seconds']:.0f} s", ""]
        table = tmp / f"{r['name']}.md"
        if r["code"] == 0 and table.is_file():  # a benchmark's own markdown, in full
            lines += [table.read_text(encoding="utf-8").replace("\n# ", "\n### ").removeprefix("# ")]
            continue
        out = r["output"].rstrip().splitlines()
        if len(out) > OUTPUT_TAIL:
            out = [f"... ({len(out) - OUTPUT_TAIL} lines above not kept)"] + out[-OUTPUT_TAIL:]
        lines += ["```", *out, "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default=sys.executable, help="the python that runs every step (default: this one)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results_gpu.md"))
    p.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply every step's time limit")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    info, arch = probe_environment(args.python)
    print(f"gpu-check: {info.get('device')}, torch {info.get('torch')}, triton {info.get('triton')}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cmds = commands(args.python, arch, tmp)
        for name in args.steps:
            print(f"gpu-check: {name} ...", flush=True)
            r = run_step(name, cmds[name], LIMITS[name] * args.time_scale)
            results.append(r)
            print(f"gpu-check: {name}: {verdict(r)} ({r['seconds']:.0f} s)", flush=True)
            Path(args.out).write_text(report(info, results, tmp, time.perf_counter() - t0), encoding="utf-8")
    failed = [r["name"] for r in results if r["code"] != 0]
    print(f"gpu-check: wrote {args.out}; " + (f"failed: {', '.join(failed)}" if failed else "every step passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
