"""Task models: fine-tuning a sequence classifier, evaluating it, and the linear probe on
frozen features. What `bertscope finetune` runs (analyses/finetune/command.py).

Inputs come from the one task encoder (`bertscope.tasks.inputs.encode_task`). A data point is
one token sequence (RTE: text [SEP] hypothesis; polarity: the sentence) or, for ARCT, two: one
per warrant, scored as Niven & Kao did. The model gives one
logit per warrant and the two logits of a data point go through a softmax, so the loss is the
cross-entropy over the pair and the prediction is the warrant with the larger logit. The
first segment is the claim and the reason ("full"); the probes drop parts of it: warrant only
("W"), reason + warrant ("RW"), claim + warrant ("CW").

Batches. At most `max_len` tokens per sequence (longest-first truncation of a pair), padded
per batch to the longest member (dynamic padding). Training batches are cut from seeded
windows sorted by length (less padding, still shuffled); evaluation sorts everything by length.

Training. Our own loop, not transformers' Trainer: Trainer needs `accelerate`, which is not
installed here, and cannot score ARCT's warrant pairs without a custom loss anyway. AdamW
(fused), linear warm-up then linear decay, gradient clipping at 1, dev accuracy after every
epoch and the best epoch's weights kept. Everything that draws random numbers (head init,
dropout, batch order) is seeded, so a run on the CPU is repeatable bit for bit.
"""
from __future__ import annotations

import copy
import logging
import math
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, get_linear_schedule_with_warmup

from bertscope.models.attention import ATTN_IMPLEMENTATION
from bertscope.models.loading import load_model, wrap_model
from bertscope.tasks.inputs import EncodedTask

logger = logging.getLogger(__name__)

WINDOW_BATCHES = 50  # training batches sorted by length together


def labelled_batch(data: EncodedTask, examples, pad_id: int, with_types: bool, device="cpu") -> dict:
    """One padded batch of `examples` (indices): the rows' inputs (S, L), S = B or 2B, and the
    examples' labels (B,)."""
    batch = data.batch(examples, pad_id, device, with_types=with_types)
    return batch | {"labels": torch.as_tensor(data.labels[list(examples)], dtype=torch.long).to(device)}


def train_batches(data: EncodedTask, batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffled batches of data-point indices, sorted by length within windows of batches."""
    order = list(range(data.n_examples))
    rng.shuffle(order)
    lengths = data.lengths()
    batches = []
    window = batch_size * WINDOW_BATCHES
    for w in range(0, len(order), window):
        chunk = sorted(order[w:w + window], key=lengths.__getitem__)
        batches += [chunk[b:b + batch_size] for b in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def eval_batches(data: EncodedTask, batch_size: int) -> list[list[int]]:
    """Batches of data-point indices, everything sorted by length (least padding)."""
    order = sorted(range(data.n_examples), key=data.lengths().__getitem__)
    return [order[b:b + batch_size] for b in range(0, len(order), batch_size)]


def point_logits(model, batch: dict, pairwise: bool) -> torch.Tensor:
    """(B, C) logits of the data points: the classes, or ARCT's two warrants."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**inputs).logits  # (S, C)
    return logits.view(-1, 2) if pairwise else logits  # ARCT: (2B, 1) -> (B, 2)


def point_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The training loss: cross-entropy of the data points' (B, C) logits (the classes, or ARCT's
    softmax over its warrants), in float32 at least whatever the autocast (float64 stays float64);
    reduction "none" gives (B,)."""
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return torch.nn.functional.cross_entropy(logits, labels, reduction=reduction)


def autocast(precision: str, device):
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


# ----------------------------------------------------------------------------- metrics

def metrics(pred: np.ndarray, gold: np.ndarray, f1: bool) -> dict:
    """Accuracy and, for binary tasks with a positive class (RTE, polarity), F1 of class 1."""
    out = {"accuracy": float((pred == gold).mean()) if len(gold) else float("nan"), "n": len(gold)}
    if f1:
        tp = int(((pred == 1) & (gold == 1)).sum())
        fp, fn = int(((pred == 1) & (gold == 0)).sum()), int(((pred == 0) & (gold == 1)).sum())
        out["f1"] = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
    return out


@torch.no_grad()
def predict(model, data: EncodedTask, batch_size: int, pad_id: int, with_types: bool, precision="fp32",
            device="cpu", progress=None) -> np.ndarray:
    """Predicted class (or warrant) of every data point, in data order."""
    was_training = model.training
    model.eval()
    pred = np.zeros(data.n_examples, dtype=np.int64)
    batches = eval_batches(data, batch_size)
    for idx in (progress(batches) if progress else batches):
        batch = labelled_batch(data, idx, pad_id, with_types, device)
        with autocast(precision, device):
            logits = point_logits(model, batch, data.pairwise)  # (B, C)
        pred[idx] = logits.argmax(-1).cpu().numpy()
    model.train(was_training)
    return pred


# ----------------------------------------------------------------------------- training

@dataclass
class TrainConfig:
    epochs: int = 3
    batch_size: int = 32
    lr: float = 5e-5
    warmup: float = 0.1  # fraction of all steps
    weight_decay: float = 0.01
    clip: float = 1.0
    precision: str = "fp32"  # or "bf16": autocast to bfloat16 (fp32 weights and optimizer)
    head_lr: float | None = None  # peak lr of the task head (outside the encoder); None: lr
    patience: int | None = None  # stop after this many epochs without a better dev accuracy; None: never
    device: str = "cpu"


@dataclass
class TrainResult:
    best_epoch: int
    best_dev: float
    history: list[dict] = field(default_factory=list)  # per epoch: loss, dev accuracy, seconds
    seconds: float = 0.0


def make_optimizer(model, cfg: TrainConfig):
    """AdamW (fused on CPU/CUDA), weight decay on matrices only (not biases and LayerNorm); with
    cfg.head_lr the task head (every parameter outside `model.base_model_prefix`: MiniLM's
    classifier) gets its own peak rate, the encoder cfg.lr. The schedule scales every group alike."""
    prefix = getattr(model, "base_model_prefix", "")
    groups: dict[tuple, list] = {}
    for name, p in model.named_parameters():
        head = cfg.head_lr is not None and not name.startswith(prefix + ".")
        decay = cfg.weight_decay if p.ndim >= 2 else 0.0
        groups.setdefault((cfg.head_lr if head else cfg.lr, decay), []).append(p)
    fused = torch.device(cfg.device).type in ("cpu", "cuda")
    return torch.optim.AdamW([{"params": ps, "lr": lr, "weight_decay": wd} for (lr, wd), ps in groups.items()],
                             lr=cfg.lr, fused=fused)


def linear_schedule(optimizer, cfg: TrainConfig, steps_per_epoch: int):
    """BERT's schedule, transformers' `get_linear_schedule_with_warmup`: the lr rises linearly from 0
    over the first round(cfg.warmup * total) steps (at least 1) to the peak, then decays linearly to 0
    at the last step; total = steps_per_epoch * cfg.epochs, so the decay depends on the epochs asked
    for (the best epoch of a 10-epoch run is not a run of that many epochs)."""
    total = steps_per_epoch * cfg.epochs
    return get_linear_schedule_with_warmup(optimizer, max(1, round(cfg.warmup * total)), total)


def fine_tune(model, train: EncodedTask, dev: EncodedTask, cfg: TrainConfig, seed: int, pad_id: int, with_types: bool,
              progress=None, log=logger.info, desc="fine-tune") -> TrainResult:
    """Train `model` in place for cfg.epochs (fewer with cfg.patience: stopped once the best dev epoch is
    cfg.patience epochs old; the lr schedule still spans cfg.epochs, so such a run equals the first
    epochs of the full one); afterwards it holds the weights of the best dev epoch."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    optimizer = make_optimizer(model, cfg)
    steps_per_epoch = math.ceil(train.n_examples / cfg.batch_size)
    scheduler = linear_schedule(optimizer, cfg, steps_per_epoch)
    best = TrainResult(best_epoch=0, best_dev=-1.0)
    best_state = None
    t0 = time.perf_counter()
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        batches = train_batches(train, cfg.batch_size, rng)
        bar = progress(batches, f"{desc} epoch {epoch}/{cfg.epochs}") if progress else batches
        losses = []
        te = time.perf_counter()
        for idx in bar:
            batch = labelled_batch(train, idx, pad_id, with_types, cfg.device)
            with autocast(cfg.precision, cfg.device):
                logits = point_logits(model, batch, train.pairwise)  # (B, C)
            loss = point_loss(logits, batch["labels"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
        dev_pred = predict(model, dev, cfg.batch_size, pad_id, with_types, cfg.precision, cfg.device)
        dev_acc = metrics(dev_pred, dev.labels, f1=False)["accuracy"]
        best.history.append({"epoch": epoch, "train_loss": float(np.mean(losses)), "dev_accuracy": dev_acc,
                             "seconds": round(time.perf_counter() - te, 1)})
        log(f"  {desc} epoch {epoch}: train loss {np.mean(losses):.4f}, dev accuracy {dev_acc:.4f} "
            f"({time.perf_counter() - te:.0f} s)")
        if dev_acc > best.best_dev:  # ties keep the earlier epoch
            best.best_epoch, best.best_dev = epoch, dev_acc
            best_state = copy.deepcopy(model.state_dict())
        if cfg.patience is not None and epoch - best.best_epoch >= cfg.patience and epoch < cfg.epochs:
            log(f"  {desc}: no better dev accuracy for {cfg.patience} epochs, stopping after epoch {epoch} "
                f"(the schedule was laid out for {cfg.epochs})")
            break
    model.load_state_dict(best_state)
    model.eval()
    best.seconds = round(time.perf_counter() - t0, 1)
    return best


# ----------------------------------------------------------------------------- models

def classifier_model(path, num_labels: int, init: str, seed: int, device="cpu", revision: str | None = None):
    """A sequence classifier with `num_labels` outputs (1 for ARCT's per-warrant logit).

    init "pretrained": the checkpoint's encoder; a head it lacks is drawn with `seed`
    (each seed its own head, not load_model's fixed one). init "random": every weight,
    embeddings included, drawn as the architecture initialises them (normal with std
    config.initializer_range, LayerNorm 1/0, biases 0), seeded: the paper's "normal distr." column.
    """
    loaded = load_model(path, device=device, task="sequence-classification", num_labels=num_labels, revision=revision)
    if init == "pretrained":
        if loaded.head_initialised:
            reset_head(loaded.model, seed)
        return loaded
    if init != "random":
        raise ValueError(f"unknown init {init!r}")
    config = copy.deepcopy(loaded.model.config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config, attn_implementation=ATTN_IMPLEMENTATION)
    fresh = wrap_model(model.to(device).eval(), loaded.tokenizer, loaded.path)
    fresh.source = loaded.source
    return fresh


def reset_head(model, seed: int):
    """Draw the task head's Linear layers anew: normal(0, initializer_range), bias 0."""
    std = model.config.initializer_range
    head = [m for n, m in model.named_modules() if not n.startswith(model.base_model_prefix)
            and isinstance(m, torch.nn.Linear)]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for m in head:
            torch.nn.init.normal_(m.weight, std=std)
            torch.nn.init.zeros_(m.bias)


# ----------------------------------------------------------------------------- linear probe

@torch.no_grad()
def cls_features(encoder, data: EncodedTask, batch_size: int, pad_id: int, with_types: bool, device="cpu",
                 progress=None) -> np.ndarray:
    """Final-layer [CLS] vector of every sequence of the frozen encoder: (N, S, D), S = 1 or 2."""
    encoder.eval()
    out = None
    batches = eval_batches(data, batch_size)
    for idx in (progress(batches) if progress else batches):
        batch = data.batch(idx, pad_id, device, with_types=with_types)
        hidden = encoder(**batch).last_hidden_state[:, 0]  # (S, D)
        hidden = hidden.float().cpu().numpy().reshape(len(idx), -1, hidden.shape[-1])  # (B, S, D)
        if out is None:
            out = np.zeros((data.n_examples, hidden.shape[1], hidden.shape[2]), dtype=np.float32)
        out[idx] = hidden
    return out


def probe_inputs(features: np.ndarray, labels, pairwise: bool):
    """Logistic-regression inputs. ARCT: a linear logit per warrant with a softmax over the two
    is logistic regression on the difference h(w1) - h(w0); both orders are given, so the
    probe cannot learn a preference for a position."""
    y = np.asarray(labels)
    if not pairwise:
        return features[:, 0], y
    diff = features[:, 1] - features[:, 0]  # (N, D)
    return np.concatenate([diff, -diff]), np.concatenate([y, 1 - y])


def linear_probe(train_x, train_y, dev_x, dev_y, pairwise: bool, grid=(0.01, 0.1, 1.0, 10.0)):
    """Standardised features, logistic regression, C picked by dev accuracy from `grid`.
    Returns (predict function on features, chosen C, dev accuracy)."""
    # scikit-learn here: its start-up (over a second) is paid only by the commands that fit a probe, not by every
    # command that imports this module (heads importance, heads attention-grad, finetune)
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = probe_inputs(train_x, train_y, pairwise)
    best = None
    for C in grid:
        clf = make_pipeline(StandardScaler(with_mean=not pairwise), LogisticRegression(
            C=C, max_iter=3000, fit_intercept=not pairwise))
        clf.fit(X, y)
        acc = float((probe_predict(clf, dev_x, pairwise) == np.asarray(dev_y)).mean())
        if best is None or acc > best[2]:
            best = (clf, C, acc)
    clf, C, acc = best
    return (lambda x: probe_predict(clf, x, pairwise)), C, acc


def probe_predict(clf, features: np.ndarray, pairwise: bool) -> np.ndarray:
    X = features[:, 1] - features[:, 0] if pairwise else features[:, 0]
    return clf.predict(X).astype(np.int64)
