"""The paper's pattern classifier: a CNN with 8 convolutional layers and ReLU (Kovaleva et
al. 2019, section 4.1), trained on attention maps resized to a fixed grid.

The paper gives only "8 convolutional layers and ReLU activation functions". bertscope's
concrete choice: 3x3 convolutions with padding 1, channels 8, 8, 16, 16, 32, 32, 64, 64,
batch normalisation and a ReLU after each (without it, training an 8-layer plain stack
from scratch on a few hundred maps diverged or stalled for some learning rates) and a 2x2
max-pool after every second one (a 32 x 32 map becomes 2 x 2),
then one linear layer on the flattened 64 x 2 x 2 features (where a stripe lies is
what tells Vertical from Diagonal, so the position is kept) to the five types.

Maps are resized to GRID x GRID by area averaging (`resize_map`: an L x L map of any
length becomes one picture; maps shorter than the grid are repeated) and divided by their
maximum, so the picture shows where attention is, as the paper's figures do, whatever L.

Labels file (`save_labels` / `load_labels`): an .npz with
    maps    (N, GRID, GRID) float16, resized and max-normalised maps
    labels  (N,) int64, an index into `types`
    types   the type names (analyses.patterns.TYPES)
    source  (N, 3) int64 (segment, layer, head) of each map, from 1 for layer and head
            (-1 where the map was not from a model, e.g. generated)
    meta    JSON text: where the maps came from (model, data, labeller)
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bertscope.analyses.patterns.stats import TYPES
from bertscope.files import write_npz

GRID = 32
CHANNELS = (8, 8, 16, 16, 32, 32, 64, 64)


class PatternCNN(nn.Module):
    """8 conv layers with ReLU (the paper's), pooled every second layer, then a linear classifier."""

    def __init__(self, n_types: int = len(TYPES), channels=CHANNELS, grid: int = GRID):
        super().__init__()
        layers, c_in = [], 1
        for i, c in enumerate(channels):
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU()]
            if i % 2 == 1:
                layers.append(nn.MaxPool2d(2))
            c_in = c
        self.features = nn.Sequential(*layers)
        side = grid // 2 ** (len(channels) // 2)
        self.head = nn.Linear(c_in * side * side, n_types)  # flattened: where a stripe lies matters

    def forward(self, x):  # x: (N, 1, GRID, GRID)
        return self.head(self.features(x).flatten(1))  # (N, n_types)


def resize_map(p: np.ndarray | torch.Tensor, grid: int = GRID) -> np.ndarray:
    """(grid, grid) float32: an (L, L) map averaged over areas, then divided by its maximum."""
    t = torch.as_tensor(np.asarray(p, dtype=np.float32))[None, None]  # (1, 1, L, L)
    if t.shape[-1] < grid:  # repeat rows/columns first, so every output cell covers whole tokens
        t = torch.nn.functional.interpolate(t, size=(grid * t.shape[-1], grid * t.shape[-1]), mode="nearest")
    out = torch.nn.functional.adaptive_avg_pool2d(t, grid)[0, 0]  # (grid, grid)
    return (out / out.max().clamp_min(1e-12)).numpy()


# ----------------------------------------------------------------------------- labels files


def save_labels(path, maps: np.ndarray, labels: np.ndarray, source: np.ndarray | None = None, meta: dict | None = None):
    path = Path(path)
    source = np.full((len(labels), 3), -1, dtype=np.int64) if source is None else np.asarray(source, dtype=np.int64)
    write_npz(path, compressed=True, maps=np.asarray(maps, dtype=np.float16),
              labels=np.asarray(labels, dtype=np.int64), types=np.array(TYPES), source=source,
              meta=json.dumps(meta or {}))


def load_labels(path) -> tuple[np.ndarray, np.ndarray, dict]:
    """(maps (N, G, G) float32, labels (N,) int64, meta); a ValueError for a malformed file."""
    try:
        with np.load(path) as f:
            maps, labels, types = f["maps"].astype(np.float32), f["labels"].astype(np.int64), tuple(f["types"])
            meta = json.loads(str(f["meta"])) if "meta" in f else {}
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"{path} is not a labels file (.npz with maps, labels, types): {e}") from None
    if types != TYPES:
        raise ValueError(f"{path} labels the types {types}, not {TYPES}")
    if maps.ndim != 3 or maps.shape[1] != maps.shape[2] or len(maps) != len(labels):
        raise ValueError(f"{path}: maps must be (N, G, G) with one label each, got {maps.shape} and {labels.shape}")
    if len(labels) and not (0 <= labels.min() and labels.max() < len(TYPES)):
        raise ValueError(f"{path}: labels must be 0..{len(TYPES) - 1}")
    return maps, labels, meta


# ----------------------------------------------------------------------------- generated maps


def synthetic_map(kind: str, n_a: int, n_b: int, rng: np.random.Generator) -> np.ndarray:
    """An (L, L) map of one type for `[CLS] a.. [SEP] b.. [SEP]`, noisy so no two are alike."""
    L = n_a + n_b + 3
    seps = [n_a + 1, L - 1]
    noise = rng.random((L, L)) * 0.3
    p = np.zeros((L, L))
    i = np.arange(L)
    if kind in ("Vertical", "Vertical+Diagonal"):
        p[:, seps] += rng.uniform(0.5, 1.0, size=(L, 1))
        p[:, 0] += rng.uniform(0.0, 0.3)
    if kind in ("Diagonal", "Vertical+Diagonal"):
        step = rng.choice([-1, 1])
        p[i, np.clip(i + step, 0, L - 1)] += 1.0 if kind == "Diagonal" else rng.uniform(0.6, 1.0)
    if kind == "Block":
        part = np.where(i <= n_a + 1, 0, 1)
        p += (part[:, None] == part[None, :]) * rng.uniform(0.5, 1.0, size=(L, L))
    if kind == "Heterogeneous":
        p += rng.random((L, L)) ** 8 * 3  # a few scattered peaks
    p = p + noise * p.max() * 0.2
    return p / p.sum(-1, keepdims=True)


def synthetic_set(n: int, seed: int, grid: int = GRID) -> tuple[np.ndarray, np.ndarray]:
    """n resized generated maps, balanced over the types, and their labels."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % len(TYPES)
    maps = np.stack([resize_map(synthetic_map(TYPES[k], int(rng.integers(5, 40)), int(rng.integers(5, 40)), rng), grid)
                     for k in labels])
    return maps, labels


# ----------------------------------------------------------------------------- training


def split_indices(n: int, held_out: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    cut = n - max(1, int(round(held_out * n)))
    return np.sort(order[:cut]), np.sort(order[cut:])


def train_cnn(maps: np.ndarray, labels: np.ndarray, epochs: int = 8, batch_size: int = 64, lr: float = 3e-3,
              seed: int = 0, progress: bool = False, balanced: bool = False) -> PatternCNN:
    """Adam with a one-cycle schedule on cross entropy; `balanced` weighs each type by the
    inverse of its frequency (labels are unbalanced: Heterogeneous dominates rule labels on
    MiniLM, Vertical the paper's hand labels), which trades majority-type accuracy for
    minority-type recall."""
    torch.manual_seed(seed)
    model = PatternCNN()
    x = torch.from_numpy(np.asarray(maps, dtype=np.float32))[:, None]  # (N, 1, G, G)
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64))  # (N,)
    counts = torch.bincount(y, minlength=len(TYPES)).double()
    weight = torch.where(counts > 0, counts.sum() / (len(TYPES) * counts.clamp_min(1)), 0.0).float()
    loss_fn = nn.CrossEntropyLoss(weight=weight if balanced else None)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    steps = epochs * math.ceil(len(y) / batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    model.train()
    with tqdm(total=steps, disable=not progress, desc="train CNN", unit="step") as bar:
        for _ in range(epochs):
            for idx in torch.randperm(len(y), generator=gen).split(batch_size):
                opt.zero_grad()
                loss = loss_fn(model(x[idx]), y[idx])
                loss.backward()
                opt.step()
                sched.step()
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
    return model.eval()


@torch.no_grad()
def predict(model: PatternCNN, maps: np.ndarray, batch_size: int = 512) -> np.ndarray:
    x = torch.from_numpy(np.asarray(maps, dtype=np.float32))[:, None]  # (N, 1, G, G)
    return torch.cat([model(x[i:i + batch_size]).argmax(-1) for i in range(0, len(x), batch_size)]).numpy()


def scores(truth: np.ndarray, pred: np.ndarray) -> dict:
    """Accuracy, macro and weighted F1, Cohen's kappa (sklearn), per-type F1 and the confusion matrix."""
    # scikit-learn here: `bertscope patterns --help` imports this module and must not wait for it (~1 s)
    from sklearn.metrics import cohen_kappa_score, confusion_matrix, f1_score

    labels = list(range(len(TYPES)))
    return dict(n=int(len(truth)), accuracy=float((truth == pred).mean()),
                f1_macro=float(f1_score(truth, pred, labels=labels, average="macro", zero_division=0)),
                f1_weighted=float(f1_score(truth, pred, labels=labels, average="weighted", zero_division=0)),
                kappa=float(cohen_kappa_score(truth, pred, labels=labels)),
                f1_per_type=dict(zip(TYPES, map(float, f1_score(truth, pred, labels=labels, average=None,
                                                                   zero_division=0)))),
                confusion=confusion_matrix(truth, pred, labels=labels).tolist(),
                truth_counts=dict(zip(TYPES, map(int, np.bincount(truth, minlength=len(TYPES))))))


def save_model(model: PatternCNN, path, meta: dict):
    torch.save({"state_dict": model.state_dict(), "types": TYPES, "grid": GRID, "channels": CHANNELS,
                "meta": meta}, path)


def load_model(path) -> PatternCNN:
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = PatternCNN(len(state["types"]), tuple(state["channels"]), state["grid"])
    model.load_state_dict(state["state_dict"])
    return model.eval()
