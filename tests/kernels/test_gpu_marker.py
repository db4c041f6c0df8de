"""The `gpu` marker: `pytest -m gpu` collects tests/kernels/test_gpu.py alone (no module that turns
Triton's interpreter on is imported), and a plain session collects it too and skips it."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collect(*args):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}  # as a shell might have it
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_gpu_session_collects_only_the_gpu_file():
    items = collect("-m", "gpu", "tests")
    assert len(items) >= 45 and all(item.startswith("tests/kernels/test_gpu.py::") for item in items)


def test_plain_session_collects_the_gpu_tests_beside_the_others():
    items = collect("tests/kernels/test_gpu.py", "tests/kernels/test_gpu_marker.py")
    assert any(i.startswith("tests/kernels/test_gpu.py::test_fused_forward_on_cuda[2048-torch.bfloat16-32]")
               for i in items)
    assert any(i.startswith("tests/kernels/test_gpu_marker.py::") for i in items)
