"""A weights file cut short (a download or a copy that stopped) is one line that names the file,
never safetensors' or torch's traceback: through the API and through the CLI."""
import shutil

import pytest
import torch
from conftest import TINY_LAYERS
from safetensors.torch import load_file

from bertscope.cli.main import main
from bertscope.errors import UserError
from bertscope.models.loading import load_model


@pytest.fixture
def checkpoint_copy(tiny_checkpoint, tmp_path):
    path = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, path)
    return path


def cut(file, keep: int):
    data = file.read_bytes()
    assert len(data) > keep
    file.write_bytes(data[:keep])


@pytest.mark.parametrize("keep", ["half", 100, 5, 0])  # the tensors, the header, the header's length, nothing
def test_a_truncated_safetensors_file_is_one_line_naming_it(checkpoint_copy, keep):
    weights = checkpoint_copy / "model.safetensors"
    cut(weights, weights.stat().st_size // 2 if keep == "half" else keep)
    with pytest.raises(UserError) as e:
        load_model(checkpoint_copy)
    message = str(e.value)
    assert "\n" not in message and str(weights) in message
    assert "damaged or incomplete" in message


def test_a_truncated_pytorch_bin_file_is_one_line_naming_it(checkpoint_copy):
    weights = checkpoint_copy / "pytorch_model.bin"
    torch.save(load_file(checkpoint_copy / "model.safetensors"), weights)  # the same weights, the older format
    (checkpoint_copy / "model.safetensors").unlink()
    assert load_model(checkpoint_copy).n_layers == TINY_LAYERS  # the whole .bin loads
    cut(weights, weights.stat().st_size // 2)
    with pytest.raises(UserError) as e:
        load_model(checkpoint_copy)
    assert "\n" not in str(e.value) and str(weights) in str(e.value)


def test_the_cli_says_it_in_one_line(checkpoint_copy, capsys):
    weights = checkpoint_copy / "model.safetensors"
    cut(weights, weights.stat().st_size - 10)
    code = main(["run", "--model", str(checkpoint_copy), "--corpus", "wiki", "--limit", "2", "--quiet",
                 "--no-figures", "--out", str(checkpoint_copy.parent / "run")])
    err = capsys.readouterr().err
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("bertscope: error:") and str(weights) in lines[0], err
    assert "Traceback" not in err
