"""The analyses of bertscope, one folder each, and the one registry of what they add.

Every analysis family lives in its own folder with the same role files:

    command.py   its command line: HELP, DESCRIPTION, add_arguments(parser), main(args) -> int
    stats.py     accumulator and maths: arrays in, arrays out; no command line, no files
    plots.py     its figures
    section.py   its part of the report: build(run: RunFiles) -> Section | None
    paper.py     the papers' numbers and statements its section quotes, each with its source
                 (the types, `Number` and `Source`, are the report's: bertscope.report.quotes)
    outputs.py   the names of the files it writes (and the one reader of each), shared by
                 the command that writes them and the section that reads them

This module is the registry: `COMMANDS` feeds the command line (`bertscope.cli.main`), and
`SECTIONS` and `PAPER_SOURCES` the report (`bertscope.report.writer`). All three name modules as
strings, so building the parser or the report imports each analysis only when it is needed, and
nothing registers itself by being imported. A new analysis adds its lines here, and nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass

_ = "bertscope.analyses."


@dataclass(frozen=True)
class Group:
    """A command with subcommands (`bertscope probe NAME`, `bertscope heads WHAT`)."""

    help: str
    description: str
    metavar: str


@dataclass(frozen=True)
class SectionEntry:
    """A section of the report: `name` is its HTML id, `builder` a "module:function"."""

    name: str
    builder: str


GROUPS: dict[str, Group] = {
    "probe": Group(
        help="word-level probes: syntax, coreference, probing classifiers, head clustering (Clark et al. 2019, "
        "sections 4-6)",
        description="Probe what heads do between words, on annotated data (see `bertscope data`). Outputs go to a "
        "run directory as CSV, PNG and an entry in run.json.",
        metavar="PROBE"),
    "heads": Group(
        help="what heads are worth to a fine-tuned model's task or a language model's loss: disable (Kovaleva et "
        "al. 2019, section 4.6); importance, ablate, prune, remove (Michel et al. 2019); attention-grad (Clark et "
        "al. 2019, section 3); induction (Olsson et al. 2022); positions (attention by distance and place in the "
        "context); retrieval (Wu et al. 2024); streaming (Xiao et al. 2024)",
        description="what heads are worth to a fine-tuned model's task or a language model's loss: disable "
        "(Kovaleva et al. 2019, section 4.6); importance, ablate, prune, remove (Michel et al. 2019, with --task lm "
        "on a decoder); attention-grad (Clark et al. 2019, section 3); induction, duplicate-token and "
        "previous-token heads (Olsson et al. 2022); positions: attention by query-key distance and by the key's "
        "place in the context (Liu et al. 2023, Hsieh et al. 2024); retrieval: retrieval heads on needle-in-a-haystack "
        "inputs (Wu et al. 2024); streaming: streaming heads (attention sink + recent window) against retrieval heads "
        "(DuoAttention, Xiao et al. 2024)",
        metavar="WHAT"),
}

# `bertscope COMMAND [SUBCOMMAND]` -> the module that adds its arguments and runs it, in the
# order `bertscope --help` lists them (the core's own commands, data, report, view and
# selftest, follow)
COMMANDS: dict[str, str] = {
    "run": _ + "surface.command",
    "probe syntax": _ + "probes.syntax.command",
    "probe coref": _ + "probes.coref.command",
    "probe classifier": _ + "probes.classifier.command",
    "probe cluster": _ + "probes.cluster.command",
    "compare": _ + "compare.command",
    "cues": _ + "cues.command",
    "features": _ + "features.command",
    "relations": _ + "relations.command",
    "patterns": _ + "patterns.command",
    "sinks": _ + "sinks.command",
    "heads disable": _ + "heads.disable.command",
    "heads ablate": _ + "heads.ablate.command",
    "heads importance": _ + "heads.importance.command",
    "heads prune": _ + "heads.prune.command",
    "heads remove": _ + "heads.remove.command",
    "heads attention-grad": _ + "heads.attention_grad.command",
    "heads induction": _ + "heads.induction.command",
    "heads positions": _ + "heads.positions.command",
    "heads retrieval": _ + "heads.retrieval.command",
    "heads streaming": _ + "heads.streaming.command",
    "finetune": _ + "finetune.command",
    "atlas": _ + "atlas.command",  # and `atlas compare RUN...`, its own subcommand (analyses/atlas/compare.py)
}

# the report's sections, in page order (the report adds its provenance first and the figures
# no section claimed last)
SECTIONS: tuple[SectionEntry, ...] = (
    SectionEntry("surface", _ + "surface.section:build"),
    SectionEntry("syntax", _ + "probes.syntax.section:build"),
    SectionEntry("coref", _ + "probes.coref.section:build"),
    SectionEntry("classifier", _ + "probes.classifier.section:build"),
    SectionEntry("cluster", _ + "probes.cluster.section:build"),
    SectionEntry("compare", _ + "compare.section:build"),
    SectionEntry("cues", _ + "cues.section:build"),
    SectionEntry("per_example", _ + "surface.section:build_per_example"),
    SectionEntry("features", _ + "features.section:build"),
    SectionEntry("relations", _ + "relations.section:build"),
    SectionEntry("patterns", _ + "patterns.section:build"),
    SectionEntry("disable", _ + "heads.disable.section:build"),
    SectionEntry("finetune", _ + "finetune.section:build"),
    SectionEntry("attention_grad", _ + "heads.attention_grad.section:build"),
    SectionEntry("importance", _ + "heads.importance.section:build"),
    SectionEntry("prune", _ + "heads.prune.section:build"),
    SectionEntry("ablate", _ + "heads.ablate.section:build"),
    SectionEntry("sinks", _ + "sinks.section:build"),
    SectionEntry("induction", _ + "heads.induction.section:build"),
    SectionEntry("positions", _ + "heads.positions.section:build"),
    SectionEntry("retrieval", _ + "heads.retrieval.section:build"),
    SectionEntry("streaming", _ + "heads.streaming.section:build"),
    SectionEntry("atlas", _ + "atlas.section:build"),
    SectionEntry("atlas_compare", _ + "atlas.section:build_compare"),
)

# the sources of the papers' numbers the sections quote, each a "module:NAME" of a family's
# paper.py, in the order the report's footer lists them
PAPER_SOURCES: tuple[str, ...] = (
    _ + "surface.paper:SURFACE",
    _ + "probes.syntax.paper:TABLE1",
    _ + "probes.coref.paper:TABLE2",
    _ + "probes.classifier.paper:TABLE3",
    _ + "cues.paper:CUES",
    _ + "finetune.paper:NIVEN_KAO_ARCT",
    _ + "patterns.paper:PATTERNS_SOURCE",
    _ + "features.paper:FEATURES",
    _ + "relations.paper:KOVALEVA_42",
    _ + "relations.paper:KOVALEVA_45",
    _ + "finetune.paper:KOVALEVA_TABLE1",
    _ + "heads.disable.paper:DISABLE",
    _ + "heads.attention_grad.paper:CLARK_GRADIENT",
    _ + "heads.importance.paper:MICHEL_IMPORTANCE",
    _ + "heads.prune.paper:MICHEL_PRUNING",
    _ + "heads.prune.paper:MICHEL_REAL_PRUNING",
    _ + "heads.ablate.paper:MICHEL_ABLATION",
    _ + "sinks.paper:STREAMING",
    _ + "sinks.paper:GU_TABLE1",
    _ + "sinks.paper:MASSIVE",
    _ + "heads.induction.paper:OLSSON_INDUCTION",
    _ + "heads.positions.paper:LOST",
    _ + "heads.positions.paper:FOUND",
    _ + "heads.retrieval.paper:WU_RETRIEVAL",
    _ + "heads.streaming.paper:DUO_ATTENTION",
    _ + "atlas.paper:DUO",
    _ + "atlas.paper:VOITA",
)


# --- what each command asks of the attention kernels (`python -m bertscope.kernels.triton_aot --commands`)
#
# Every module of `COMMANDS` declares `kernel_specs(model) -> {what: StatsSpec}`: the statistics specs it
# hands the engine (its `fold` / `stream_batches` calls), built by the same functions its `main` calls, for
# `model` (a `KernelModel`: what of a loaded model a spec reads); {} when its model never runs inside an
# analysis (the gated variants, gradients and hidden states run torch's SDPA, not the statistics kernel).
# tests/kernels/test_triton_commands.py fails on a command without one.


@dataclass(frozen=True)
class KernelModel:
    """What a command's spec reads of a loaded model, without loading one: its key classes (`classes`,
    `class_names`: the vocabulary's [CLS], [SEP], punctuation, other) and whether it is a decoder
    (causal: `atlas` adds the streaming error and the token relations' induction pass for one)."""

    causal: bool = True
    class_names: tuple[str, ...] = ("cls", "sep", "punct", "other")  # text.token_classes.KEY_CLASSES

    @property
    def classes(self):
        from types import SimpleNamespace

        return SimpleNamespace(n_classes=len(self.class_names), names=self.class_names)


class CommandDefaults:
    """`defaults[dest]`: the default of a command's option (its `add_arguments`), as the command line gives it
    when the option is not passed (None for one without a default); read through argparse's public
    `get_default`. The settings a `kernel_specs` reads."""

    def __init__(self, parser):
        self._parser = parser

    def __getitem__(self, dest: str):
        return self._parser.get_default(dest)


def command_defaults(module) -> CommandDefaults:
    """The defaults of `module`'s options (`CommandDefaults`)."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    module.add_arguments(parser)
    return CommandDefaults(parser)


def kernel_specs(command: str, model: KernelModel) -> dict:
    """{what: StatsSpec} of one command of `COMMANDS` for `model` (its module's `kernel_specs`)."""
    import importlib

    module = importlib.import_module(COMMANDS[command])
    if not hasattr(module, "kernel_specs"):
        raise NotImplementedError(f"{COMMANDS[command]} declares no kernel_specs(model) (analyses/registry.py)")
    return module.kernel_specs(model)
