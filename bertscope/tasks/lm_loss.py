"""The language-modelling loss of a decoder, with the LM head applied in chunks of positions.

The next-token loss of a sequence is the mean over its positions t of -log p(x_{t+1} | x_<=t).
A decoder's head maps each hidden state to logits over the whole vocabulary: at L positions
that is an (L, V) tensor, 8.6 G floats for Gemma-3-270M at 32k tokens (V = 262,144). Here the
base model runs once (through bertscope's attention, so head gates and every layout work as in
any analysis) and the head runs on `chunk` positions at a time:

    hidden (B, L, d) -> valid positions (N, d) -> N / chunk pieces of (chunk, V) logits

Under autograd each piece is checkpointed (`torch.utils.checkpoint`): backward recomputes its
logits instead of keeping them, so a backward pass holds one (chunk, V) piece at a time too,
and the gradient that reaches the head gates (`bertscope.models.gates`) is exact.

`loaded` comes from `load_model(..., task="causal-lm")`: the base model (`model.base_model`,
where the gates hang) and its output embeddings (`get_output_embeddings`, tied to the input
embeddings in SmolLM2 and Gemma-3). A model whose config soft-caps its final logits (Gemma-2's
`final_logit_softcapping`) gets the same cap, tanh(z / c) * c, as its own forward applies.

Positions: inputs are padded on the right (as the engine pads decoders) and each row's
positions count from 0; the target of position t is token t + 1 of the same row, and a row of
n real tokens has n - 1 targets.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

LOGITS_BUDGET = 1 << 25  # logits held at once: 32 M floats (128 MB in fp32), whatever the vocabulary


@dataclass
class TokenLosses:
    """Per-target next-token losses of a batch.

    loss:  (B, L - 1) float32, -log p(x_{t+1} | x_<=t); 0 where `valid` is False
    valid: (B, L - 1) bool, True where token t + 1 is a real token (right padding)
    """

    loss: torch.Tensor
    valid: torch.Tensor

    def per_sequence(self) -> torch.Tensor:
        """(B,) mean loss over each row's targets (0 for a row of one token)."""
        n = self.valid.sum(1)  # (B,)
        return self.loss.sum(1) / n.clamp(min=1)

    @property
    def n_targets(self) -> int:
        return int(self.valid.sum())


def lm_head(loaded):
    """(output embedding module, logit soft-cap or None) of a model loaded with task "causal-lm"."""
    head = loaded.model.get_output_embeddings() if hasattr(loaded.model, "get_output_embeddings") else None
    if head is None or loaded.task != "causal-lm":
        raise ValueError("the language-modelling loss needs a model loaded with task='causal-lm'")
    return head, getattr(loaded.model.config, "final_logit_softcapping", None)


def chunk_size(vocab_size: int, budget: int = LOGITS_BUDGET) -> int:
    """Positions per piece of logits: `budget` floats over the vocabulary, at least 1."""
    return max(1, budget // max(1, vocab_size))


def _piece_loss(head, softcap, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(n,) float32 losses of n positions: hidden (n, d), targets (n,)."""
    logits = head(hidden).float()  # (n, V)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits, targets, reduction="none")


def head_losses(loaded, hidden: torch.Tensor, targets: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """(N,) float32 losses of hidden states (N, d) against target ids (N,), `chunk` positions at
    a time (default: `chunk_size` of the vocabulary); checkpointed when a gradient will flow."""
    head, softcap = lm_head(loaded)
    chunk = chunk or chunk_size(head.weight.shape[0])
    grad = torch.is_grad_enabled() and (hidden.requires_grad or head.weight.requires_grad)
    pieces = []
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start:start + chunk], targets[start:start + chunk]  # (n, d), (n,)
        if grad:
            pieces.append(checkpoint(_piece_loss, head, softcap, h, t, use_reentrant=False))
        else:
            pieces.append(_piece_loss(head, softcap, h, t))
    return torch.cat(pieces) if pieces else hidden.new_zeros(0, dtype=torch.float32)


def token_losses(loaded, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 chunk: int | None = None) -> TokenLosses:
    """Next-token losses of a right-padded batch.

    Args:
        loaded: a decoder loaded with task "causal-lm" (gates set on `loaded.gates` apply).
        input_ids: (B, L) token ids.
        attention_mask: (B, L) 1 for real tokens, 0 for right padding (None: all real).
        chunk: positions per piece of logits (default: `chunk_size` of the vocabulary).
    Returns:
        `TokenLosses` (B, L - 1): differentiable with respect to the gates when grad is enabled.
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    base = loaded.model.base_model
    hidden = base(input_ids=input_ids, attention_mask=attention_mask, **loaded.forward_options
                  ).last_hidden_state  # (B, L, d), after the final norm
    valid = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()  # (B, L - 1): target t + 1 is real
    losses = head_losses(loaded, hidden[:, :-1][valid], input_ids[:, 1:][valid], chunk)  # (N,)
    loss = hidden.new_zeros(valid.shape, dtype=torch.float32).masked_scatter(valid, losses)  # (B, L - 1)
    return TokenLosses(loss=loss, valid=valid)
