"""float32 as torch does it (issue 40, part 4): the Triton kernels' fp32 dots follow torch's float32
matmul precision, and run.json says which they used (`describe_backend`)."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (tests/conftest.py sets it too)

import pytest
import torch

from bertscope.kernels.backends import describe_backend
from bertscope.kernels.precision import fp32_dot_precision


@pytest.fixture
def restore_precision():
    """Every setting these tests touch back as it was (the legacy getter raises once the new API's
    setting is left on: put back to "none")."""
    legacy = torch.get_float32_matmul_precision()
    yield
    torch.backends.cuda.matmul.fp32_precision = "none"
    torch.backends.fp32_precision = "none"
    torch.set_float32_matmul_precision(legacy)
    assert torch.get_float32_matmul_precision() == legacy


def test_the_default_is_exact():
    assert torch.get_float32_matmul_precision() == "highest" and fp32_dot_precision() == "ieee"


@pytest.mark.parametrize("precision,dot", [("highest", "ieee"), ("high", "tf32"), ("medium", "tf32")])
def test_it_follows_torchs_float32_matmul_precision(restore_precision, precision, dot):
    torch.set_float32_matmul_precision(precision)
    assert fp32_dot_precision() == dot


@pytest.mark.parametrize("matmul,generic,dot", [("tf32", "none", "tf32"), ("ieee", "none", "ieee"),
                                                ("none", "tf32", "tf32"), ("ieee", "tf32", "ieee")])
def test_it_follows_torchs_new_per_backend_setting(restore_precision, matmul, generic, dot):
    """torch 2.9's `torch.backends.(cuda.matmul.)fp32_precision`: the legacy getter refuses to answer
    once it is used; the matmul setting decides, "none" inheriting the generic one."""
    torch.backends.fp32_precision = generic
    torch.backends.cuda.matmul.fp32_precision = matmul
    assert fp32_dot_precision() == dot


def test_run_json_records_the_triton_kernels_fp32_dots(restore_precision):
    assert describe_backend("triton", "cpu")["fp32_dot"] == "ieee"
    torch.set_float32_matmul_precision("high")
    assert describe_backend("triton", "cpu")["fp32_dot"] == "tf32"
    assert "fp32_dot" not in describe_backend("chunked", "cpu")  # no Triton dots: nothing to record
