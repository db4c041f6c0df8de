"""What a head-importance pass costs next to the backward pass one already pays to fine-tune.

    python bench/bench_gates.py                          # batch 32, L = 128, embedded MiniLM, CPU
    python bench/bench_gates.py --device cuda --repeats 20

Three methods on the same batch of real Wikipedia text (`common.packed_segments`:
every segment exactly L tokens, [CLS] a [SEP] b [SEP]), the same loss (the sum of the
pooled output), forward + backward each:

    baseline  AutoModel(attn_implementation="sdpa"), parameters requiring grad as loaded
              (what one fine-tuning step computes, without the optimizer): d loss / d every
              weight.
    gates     bertscope's load_model (attn_implementation="bertscope"), parameters frozen
              (requires_grad False), gates.xi (layers, H) requiring grad: d loss / d xi,
              Michel et al.'s importance pass. Outside an analysis the attention is SDPA
              times xi, so autograd runs through every layer, without the weight gradients.
    frozen    the baseline's sdpa model with its parameters frozen and the input embeddings
              requiring grad: the same backward through the activations as `gates`,
              without bertscope; `gates / frozen` is what the gates themselves cost.

After one warm-up each, the two take turns `--repeats` times (so both see the same load on a
shared machine); reported: the median seconds per pass and the ratios to the baseline, the
issue's target being gates / baseline <= 1.3. The gates' gradient is tested against finite
differences and sum <dL/dO_h, O_h> in tests/models/test_gates.py; here only that xi got a
gradient and no weight did.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch


def batch_inputs(tokenizer, L: int, batch_size: int, device) -> dict:
    from common import packed_segments

    from bertscope.text.segments import collate

    segments = packed_segments(tokenizer, L, batch_size)
    return {k: t.to(device) for k, t in collate(segments, tokenizer.pad_token_id).items()}


def passes(device):
    """(baseline model, bertscope LoadedModel with xi requiring grad)."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    from bertscope.models.loading import default_model_dir, load_model

    hf_logging.disable_progress_bar()
    path = default_model_dir()
    baseline = AutoModel.from_pretrained(path, attn_implementation="sdpa", local_files_only=True).to(device).eval()
    frozen = AutoModel.from_pretrained(path, attn_implementation="sdpa", local_files_only=True).to(device).eval()
    frozen.requires_grad_(False)
    loaded = load_model(path, device=device)
    loaded.model.requires_grad_(False)
    loaded.gates.xi = torch.ones(loaded.n_layers, loaded.n_heads, device=device, requires_grad=True)
    return baseline, frozen, loaded


def step(model, inputs, sync, embeds=False):
    t0 = time.perf_counter()
    if embeds:  # the input embeddings as a leaf that requires grad
        inputs = dict(inputs)
        inputs["inputs_embeds"] = model.embeddings.word_embeddings(inputs.pop("input_ids")).requires_grad_()
    model(**inputs).pooler_output.sum().backward()
    sync()
    return time.perf_counter() - t0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    baseline, frozen, loaded = passes(device)
    inputs = batch_inputs(loaded.tokenizer, args.length, args.batch_size, device)
    models = {"baseline": baseline, "gates": loaded.model, "frozen": frozen}
    times = {name: [] for name in models}
    order = list(models)
    for name in order:  # warm-up
        step(models[name], inputs, sync, embeds=name == "frozen")
    for r in range(args.repeats):
        for name in order[r % 3:] + order[: r % 3]:  # rotated: no method always first
            models[name].zero_grad(set_to_none=True)
            if name == "gates":
                loaded.gates.xi.grad = None
            times[name].append(step(models[name], inputs, sync, embeds=name == "frozen"))

    assert loaded.gates.xi.grad is not None and bool((loaded.gates.xi.grad != 0).any())
    assert all(p.grad is None for p in loaded.model.parameters())
    assert all(p.grad is not None for p in baseline.parameters() if p.requires_grad)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"MiniLM {loaded.n_layers}x{loaded.n_heads}, batch {args.batch_size} x L {args.length}, {device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.repeats} repeats")
    for name in times:
        print(f"  {name:<9} median {med[name]:.3f} s  (all: {' '.join(f'{t:.3f}' for t in times[name])})")
    print(f"  ratio gates / baseline: {med['gates'] / med['baseline']:.2f}  (target <= 1.3);  "
          f"gates / frozen: {med['gates'] / med['frozen']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
