"""One analysis's run: what every command shares, so that a command keeps only its own logic.

    with ModelRun(NAME, args, task=..., distributed=True, resumable=True) as run:
        ...  # run.loaded, run.dir, run.world, run.log, run.progress
        run.write_csv(...); run.save_figure(...)
        run.finish(results)  # run.json "complete", then the report is refreshed

`ModelRun` loads the model on every rank (under torchrun each rank takes its share of the
batches; rank 0 makes the run directory and writes the outputs, the others learn its path),
records the analysis in run.json under "analyses"[name] and, leaving the `with` block:
- on Ctrl-C (KeyboardInterrupt; the engine's `fold` has saved the finished batches by then),
  marks the entry "interrupted" and raises `Interrupted`, whose one line says how to resume
  (the CLI exits with 130);
- on an error before the first result, removes the run directory it made (when nothing else is
  in it), else marks the entry "failed" with the error: a later `--out` there starts afresh.
`ModelRun.resumed_args` gives `--resume DIR` the settings recorded there. `AnalysisRun` is the
same without a model (e.g. `bertscope cues`).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import platform
import sys
import time
from pathlib import Path

from bertscope.engine.devices import check_device, check_dtype
from bertscope.errors import Interrupted, UserError
from bertscope.files import checked_run, write_csv, write_text
from bertscope.run.rundir import (
    COMPLETE,
    FAILED,
    INTERRUPTED,
    RUN_FILES,
    RUNNING,
    changed_on_resume,
    check_settings,
    clear_run_dir,
    new_run_dir,
    recorded_run,
    refuse_changed_settings,
    resumed_revision,
    settings_parser,
    update_json,
)
from bertscope.version import __version__

logger = logging.getLogger(__name__)

NOT_SETTINGS = ("command", "probe", "func")  # argparse's bookkeeping, not a setting of the run
# what a resumed run takes from its command line, not from run.json: where and how it runs, not what it computes
RESUME_OWN = ("resume", "quiet", "out", "threads", "no_figures")


def _silent(*args, **kwargs):
    """The log of a rank other than 0: only rank 0 speaks."""


class AnalysisRun:
    """One analysis's run: the run directory and its record in run.json.

    name: the entry's name in run.json["analyses"]; `top_level=True` writes the record at
      run.json's top level instead (`bertscope run`, whose run.json is its own).
    command: how the command is typed after `bertscope` (for the log and the resume hint).
    resumable: Ctrl-C's message says `bertscope COMMAND --resume DIR` (the command saves
      checkpoints); otherwise it says "interrupted".
    world: the torchrun world (`bertscope.engine.distributed.World`); rank 0 alone writes.
    open: make the directory and write the record now; `False` waits for `open()` (a
      command that checks more of its input first).
    """

    def __init__(self, name: str, args: argparse.Namespace, model: dict | None = None, *, command: str | None = None,
                 resumable: bool = False, world=None, top_level: bool = False, open: bool = True):
        self.name, self.args, self.t0 = name, args, time.perf_counter()
        self.command, self.resumable, self.world, self.top_level = command or name, resumable, world, top_level
        self.announced_as = command or f"probe {name}"  # how the log names the command
        self.is_main = world is None or world.is_main
        self.log = logging.getLogger(f"bertscope.analyses.{name}").info if self.is_main else _silent
        self.progress = self.is_main and not getattr(args, "quiet", False)
        self.dir: Path | None = None
        self.made_dir = False  # this run created the directory (so may remove it if it fails at once)
        self.outputs: list[str] = []
        self.interrupted_message: str | None = None  # default: `default_interrupted_message()`
        self.record = {
            "command": " ".join(sys.argv),
            "status": RUNNING,
            "settings": {k: v for k, v in vars(args).items() if k not in NOT_SETTINGS},
            "model": model,
        }
        if world is not None:
            self.record["world_size"] = world.size  # per-rank checkpoints: a resume needs as many processes
        if open:
            self.open()

    def open(self, out: str | None = None, record: dict | None = None):
        """Make (or take) the run directory on rank 0, write the record (`record`, when given,
        replaces the default one), tell every rank where."""
        from bertscope.engine.distributed import broadcast  # torch: see the module's note at `ModelRun`

        path, error = None, None
        if record is not None:
            self.record = record
        if self.is_main:
            try:
                path = str(self._run_dir(out if out is not None else getattr(self.args, "out", None)))
                self.dir = Path(path)
                self.save_record()
            except UserError as e:
                error = str(e)
        if self.world is not None and self.world.size > 1:
            path, error = broadcast(self.world, (path, error))
        if error is not None:
            raise UserError(error)
        self.dir = Path(path)
        return self

    def _run_dir(self, out: str | None) -> Path:
        if out and (Path(out) / "run.json").is_file() and (not self.top_level or getattr(self.args, "resume", None)):
            return Path(out)  # an existing run: this analysis adds its files there (or resumes)
        path = new_run_dir(out)
        self.made_dir = not any(path.iterdir())
        new = {
            "bertscope_version": __version__,
            "model": None,
            "versions": {"python": platform.python_version(), "torch": _version("torch"),
                         "transformers": _version("transformers")},
            "analyses": {},
        }
        if not self.top_level:
            update_json(path / "run.json", lambda run: {**new, **run})  # one written meanwhile is kept
        return path

    def save_record(self):
        """Write the record into run.json (rank 0 only), under the lock."""
        if not self.is_main or self.dir is None:
            return
        path = self.dir / "run.json"

        def update(run):
            run = checked_run(run, path) if run else {}
            if self.top_level:  # the record's own "analyses" ({}) keeps its place, the entries their contents
                return {**run, **self.record, "analyses": run.get("analyses") or {}}
            run.setdefault("analyses", {})[self.name] = self.record
            return run
        update_json(path, update)

    # -- outputs

    def write_csv(self, filename: str, rows: list[dict], columns: tuple[str, ...]) -> Path:
        path = self.dir / filename
        write_csv(path, rows, columns)
        self.outputs.append(filename)
        return path

    def write_text(self, filename: str, text: str) -> Path:
        path = self.dir / filename
        write_text(path, text)
        self.outputs.append(filename)
        return path

    def save_figure(self, fig, filename: str) -> Path | None:
        """Save a matplotlib figure (unless --no-figures) and close it."""
        import matplotlib.pyplot as plt  # here: matplotlib takes a second to import, and `--help` imports this module

        path = None
        if not getattr(self.args, "no_figures", False):
            path = self.dir / filename
            fig.savefig(path, dpi=130, bbox_inches="tight")
            self.outputs.append(filename)
        plt.close(fig)
        return path

    def finish(self, results, report: bool = True):
        """Record the analysis's headline results and outputs in run.json ("complete"), then
        refresh the report (`bertscope.report.writer.refresh_report`: it reads every analysis's
        section, the run directory knows nothing of them)."""
        from bertscope.report.writer import refresh_report  # the report imports the analyses' sections

        self.record.update(status=COMPLETE, results=results, outputs=self.outputs,
                           elapsed_s=round(time.perf_counter() - self.t0, 2))
        self.save_record()
        self.log(f"wrote {', '.join(self.outputs)} to {self.dir}")
        if report and self.is_main:
            refresh_report(self.dir)

    # -- how a run ends when it does not finish

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if kind is None:
            return False
        if issubclass(kind, (KeyboardInterrupt, Interrupted)):
            self._settle(INTERRUPTED)
            if issubclass(kind, KeyboardInterrupt):
                raise Interrupted(self.interrupted_message or self.default_interrupted_message()) from None
        elif issubclass(kind, Exception):
            self._fail(error)
        return False

    def default_interrupted_message(self) -> str:
        if self.resumable and self.dir is not None:
            return (f"interrupted; the finished batches are saved: resume with "
                    f"`bertscope {self.command} --resume {self.dir}`")
        return "interrupted"

    def _settle(self, status: str, **more):
        """run.json says how the run ended (rank 0; a run.json it cannot read is left alone)."""
        if not self.is_main or self.dir is None or self.record.get("status") == COMPLETE:
            return
        self.record.update(status=status, **more)
        try:
            self.save_record()
        except (UserError, OSError) as e:
            logger.warning(f"could not mark {self.dir / 'run.json'} {status}: {e}")

    def _fail(self, error: BaseException):
        """An error before the run completed: remove the directory it made if nothing else is
        there, else mark the entry "failed", so that `--out` there starts afresh."""
        if not self.is_main or self.dir is None or self.record.get("status") == COMPLETE:
            return
        if self.made_dir and self.dir.is_dir() and {p.name for p in self.dir.iterdir()} <= set(RUN_FILES):
            clear_run_dir(self.dir)
            logger.info(f"removed {self.dir}: the run failed before its first result")
            return
        self._settle(FAILED, error=str(error).splitlines()[0] if str(error) else type(error).__name__)

    # -- --resume DIR

    @staticmethod
    def resumed_args(name: str, args: argparse.Namespace, add_arguments=None, keys: tuple[str, ...] | None = None,
                     command: str | None = None) -> argparse.Namespace:
        """The settings recorded for analysis `name` in DIR = `args.resume` (checked against the
        options `add_arguments` declares), over this command line's; DIR is the --out. `keys`:
        the recorded settings taken (default: every one); `RESUME_OWN` (--resume, --quiet,
        --threads, --no-figures) are always this command line's, but a run recorded with --no-figures
        keeps it. A setting taken that this command
        line gives another value is refused in one line (`refuse_changed_settings`), not ignored.
        A model recorded with a Hub commit loads at that commit."""
        record = recorded_run(args.resume, name, command)
        recorded = record["settings"]
        taken = {k: v for k, v in recorded.items()
                 if (keys is None or k in keys) and k not in NOT_SETTINGS and k not in RESUME_OWN}
        if add_arguments is not None:
            parser = settings_parser(add_arguments)
            check_settings(Path(args.resume) / "run.json", recorded, parser)
            given = {k: v for k, v in vars(args).items() if k not in RESUME_OWN}
            defaults = {k: parser.get_default(k) for k in given}
            refuse_changed_settings(args.resume, changed_on_resume(given, defaults, taken), getattr(args, "out", None))
        settings = {**vars(args), **taken, "resume": args.resume, "quiet": args.quiet, "out": args.resume}
        if "no_figures" in vars(args):  # a --no-figures run stays one: the resume adds no figure either
            settings["no_figures"] = bool(args.no_figures or recorded.get("no_figures"))
        settings["revision"] = resumed_revision(record, settings.get("revision"))
        return argparse.Namespace(**settings)


class ModelRun(AnalysisRun):
    """One analysis's run with a model: loaded on every rank (`distributed=True`: under
    torchrun, on the rank's device) before the run directory is made, so a model that does not
    load leaves nothing behind.

    task: the head to load (`bertscope.models.loading.TASKS`); dtype: the model's (default
    --dtype); announce: log the model and the run directory.
    encoders_only: for an analysis defined on encoders' inputs, why (a phrase): a causal model
    is then refused in one line, before the run directory is made.
    length_from: how the user asked for args.max_len tokens when not with --max-len (the subject
    of "... is longer than the model allows": "--seq-len 5000, a sequence of 10001 tokens,").

    torch, the model loader and the distributed helpers are imported inside: `bertscope --help`
    imports every command's module, and through it this one, and must not wait for torch.
    """

    def __init__(self, name: str, args: argparse.Namespace, task: str | None = None, command: str | None = None,
                 dtype: str | None = None, distributed: bool = False, resumable: bool = False,
                 top_level: bool = False, open: bool = True, announce: bool = True,
                 encoders_only: str | None = None, length_from: str | None = None):
        import torch  # these three import torch: see the docstring

        from bertscope.engine.distributed import init_world
        from bertscope.models.loading import load_model

        check_device(args.device, args.backend)
        # dtype: the model's (default: --dtype; finetune keeps float32 weights and autocasts)
        dtype = dtype or getattr(args, "dtype", "float32")
        check_dtype(dtype, args.device)
        if getattr(args, "threads", None):
            torch.set_num_threads(args.threads)
        world = init_world(args.device) if distributed else None
        if world is not None and getattr(args, "resume", None) and not top_level:
            recorded = recorded_run(args.resume, name).get("world_size", 1)
            if recorded != world.size:
                raise UserError(f"{args.resume} was started with {recorded} processes; resume it with the same "
                                f"number (now {world.size})")
        # the device: this rank's under torchrun (`distributed.init_world`); args.device is recorded
        self.loaded = load_model(args.model, device=args.device if world is None else world.device, task=task,
                                 dtype=dtype, revision=getattr(args, "revision", None))
        if encoders_only and self.loaded.architecture.is_causal(self.loaded.model.config):
            raise UserError(f"bertscope {command or name} runs on encoders only ({encoders_only}); "
                            f"{self.loaded.path.name} is a causal {self.loaded.model_type} decoder "
                            "(docs/decoders.md lists what runs on decoders)")
        if args.max_len > self.loaded.max_len:  # said as the user asked for the length (`length_from`)
            raise UserError(f"{length_from or f'--max-len {args.max_len}'} is longer than the model allows "
                            f"({self.loaded.max_len})")
        from bertscope.models.loading import weights_fingerprint

        model = {**self.loaded.record(), "fingerprint": weights_fingerprint(self.loaded.model)}
        if getattr(args, "resume", None):
            check_same_weights(args.resume, name, top_level, model)
        super().__init__(name, args, model=model, command=command, resumable=resumable, world=world,
                         top_level=top_level, open=open)
        torch.manual_seed(args.seed)
        if announce and open:
            self.announce()

    def announce(self):
        loaded = self.loaded
        self.log(f"bertscope {self.announced_as}: model "
                 f"{loaded.origin} ({loaded.n_layers} layers x {loaded.n_heads} heads), run directory {self.dir}")

    def shutdown(self):
        """End the torchrun process group: the sums are all in, only rank 0 has work left."""
        from bertscope.engine.distributed import shutdown  # torch: see ModelRun's docstring

        if self.world is not None:
            shutdown(self.world)


def check_same_weights(run_dir, name: str, top_level: bool, model: dict):
    """A one-line `UserError` when `--resume DIR`'s model is not the one the run started with: its
    weights' fingerprint (`bertscope.models.loading.weights_fingerprint`), recorded in run.json's
    model record, differs from the model loaded now (the folder was replaced by another model, of
    the same shape or not). The sums of two models must never be mixed. A run recorded before
    fingerprints were (none in its record) is resumed with a warning."""
    from bertscope.files import read_run

    path = Path(run_dir) / "run.json"
    if not path.is_file():
        return  # the command's own resume check says so
    run = read_run(path)
    record = run if top_level else run["analyses"].get(name) or {}
    recorded = (record.get("model") or {}).get("fingerprint")
    if recorded is None:
        logger.warning(f"{path} records no fingerprint of the model's weights (a run of an older bertscope): "
                       "the model loaded now is taken to be the run's")
    elif recorded != model["fingerprint"]:
        shape = record.get("model") or {}
        was = f"{shape.get('layers')} layers x {shape.get('heads')} heads"
        now = f"{model.get('layers')} layers x {model.get('heads')} heads"
        raise UserError(f"cannot resume {run_dir}: the weights in {model.get('path')} are not those the run started "
                        f"with (weights fingerprint {model['fingerprint']}, the run's: {recorded}; {now}, the run's: "
                        f"{was}): put the run's model back, or start a new run without --resume")


def _version(package: str) -> str:
    """The installed version of a library, as its own module reports it (imported only here)."""
    return importlib.import_module(package).__version__
