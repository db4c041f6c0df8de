"""bench/bench_gpu.py and bench/gpu_check.py (`make gpu-check`) on a machine without a GPU:
the benchmark refuses in one line with exit code 1, its code paths run in a CPU dry run, and
the check writes its report even when steps fail."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")


def run(*args, timeout=300):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          check=False)


@no_gpu
def test_bench_gpu_refuses_without_a_gpu():
    p = run("bench/bench_gpu.py", "--quick")
    assert p.returncode == 1
    assert p.stdout == ""
    assert p.stderr.count("\n") == 1 and "needs a CUDA GPU" in p.stderr, p.stderr


@no_gpu
def test_bench_gpu_code_paths_in_a_cpu_dry_run(minilm_path, tmp_path):
    out = tmp_path / "bench.md"
    p = run("bench/bench_gpu.py", "--dry-run-cpu", "--models", "minilm", "--lengths", "16", "--dtypes", "bf16",
            "--batch-size", "2", "--batches", "1", "--repeats", "1", "--no-analyses", "--no-decoder", "--out", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| minilm | 16 | 2 | bf16 |")]
    assert [r.split("|")[5].strip() for r in rows] == ["floor", "eager+maps", "bertscope"]
    agreement = rows[-1].split("|")[9].strip()  # entropy / [SEP] mass, bertscope against the maps
    assert all(float(x) < 0.05 for x in agreement.split(" / ")), agreement


@no_gpu
def test_kernel_probe_refuses_without_a_gpu():
    p = run("bench/kernel_probe.py")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "needs a CUDA GPU" in p.stderr, p.stderr


@no_gpu
def test_kernel_probe_in_a_cpu_dry_run(tmp_path):
    """Every case's three forwards run (the fused one and the flash baseline through Triton's interpreter)
    and agree with SDPA: the table a lent GPU fills is the one the code paths write."""
    out = tmp_path / "probe.md"
    p = run("-W", "ignore", "bench/kernel_probe.py", "--dry-run-cpu", "--out", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| 64 |")
            or line.startswith("| 128 |")]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("64", "plain"), ("64", "causal GQA"),
                                                            ("128", "plain"), ("128", "causal GQA")]
    assert all(float(r[-1]) < 1e-4 for r in rows), rows  # fp32 on the CPU: max |out - SDPA|


@no_gpu
def test_gpu_check_reports_failed_steps(tmp_path):
    out = tmp_path / "results_gpu.md"
    p = run("bench/gpu_check.py", "--steps", "bench_gpu", "--out", str(out))
    assert p.returncode == 1
    text = out.read_text()
    assert "SOME STEPS FAILED" in text and "| bench_gpu | FAILED (1) |" in text
    assert "needs a CUDA GPU" in text
    for field in ("| device |", "| driver |", "| torch |", "| triton |"):
        assert field in text, field


def test_gpu_check_steps_import_the_installed_package(tmp_path):
    """`python -c` / `python -m` steps run from the checkout without it on sys.path, so that they check the
    installed package: the source folder shadowed it on the first lent GPU (selftest, aot and pytest_gpu:
    ModuleNotFoundError: No module named 'bertscope.kernels', before bertscope/kernels was a link)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "bench"))
    cmds = gpu_check.commands(sys.executable, None, tmp_path)
    assert gpu_check.STEPS[0] == "kernel_probe" and set(cmds) == set(gpu_check.STEPS) == set(gpu_check.LIMITS)
    assert [cmds[s][1] for s in ("selftest", "aot", "pytest_gpu")] == ["-c", "-m", "-m"]
    probe = f"import sys; print('' in sys.path or {str(ROOT)!r} in sys.path)"
    r = gpu_check.run_step("probe", [sys.executable, "-c", probe], 60)
    assert r["code"] == 0 and r["output"].strip() == "False", r["output"]
    assert "PYTHONSAFEPATH" not in gpu_check.step_env([sys.executable, "bench/bench_triton.py"]) or \
        os.environ.get("PYTHONSAFEPATH")  # a script keeps its own folder first (bench/), as before


def test_makefile_gpu_check_installs_nothing():
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("\ngpu-check:\n", 1)[1].split("\n\n", 1)[0]
    assert "gpu_check.py" in recipe and "pip" not in recipe and "venv" not in recipe.lower()
    assert "gpu-check: PYTHON = python" in make  # python from PATH, PYTHON=... overrides


@no_gpu
def test_bench_gpu_decoder_in_a_cpu_dry_run(tmp_path):
    """The decoder part on a tiny Llama: floor and bertscope rows with their agreement."""
    out = tmp_path / "decoder.md"
    p = run("bench/bench_gpu.py", "--dry-run-cpu", "--decoder-only", "--decoder-lengths", "32", "--decoder-tokens",
            "64", "--batches", "1", "--repeats", "1", "--out", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| 32 | 2 |")]
    assert [r[3].strip() for r in rows] == ["floor", "bertscope"]
    assert float(rows[1][7]) < 0.1  # bf16 hidden states of the same weights, bertscope's attention against SDPA
