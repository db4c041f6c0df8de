"""The teacher-forced retrieval score (`score_haystack`, one forward pass per haystack) against
Wu et al.'s decode-time score, run as they run it: greedy decoding with `output_attentions` on
each decode row (the eager loop of retrieval_decode.py).

- Tiny random decoders of every causal family of the architecture table: a random model does
  not answer a real needle, so the reference answer is the model's own greedy continuation
  (decoded first, up to and including the stop token). Then the teacher-forced pass reads
  exactly the decode steps, and the hit counts are equal per head, on every backend.
- Where the reference answer leaves the greedy output at step k, the two differ, and the test
  shows why: the row of step k is scored against the reference token, not the produced one.
- The real SmolLM2-135M-Instruct on Wu et al.'s San Francisco needle (a few short haystacks):
  equal where the model answers.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from retrieval_decode import (
    decode_score,
    newline_stop,
    rouge1_recall,
    teacher_forced_eager,
    wu_answered,
    wu_needle_span,
)

from bertscope.analyses.heads.retrieval.haystack import Haystack, HaystackBuilder, corpus_texts, load_needles
from bertscope.analyses.heads.retrieval.stats import score_haystack
from bertscope.kernels.backends import BACKENDS
from bertscope.models.architectures import ARCHITECTURES

pytestmark = pytest.mark.usefixtures("single_thread")

CAUSAL = tuple(t for t, arch in sorted(ARCHITECTURES.items()) if arch.causal)  # every decoder family
TINY_STOP = 4  # "." of the word tokenizer (tests/tiny_decoders.py): decoding stops on it
TINY_MAX_NEW = 10


class Tiny:
    """One tiny family: the model as transformers runs it (eager, for the decode loop) and as
    bertscope loads it (for `score_haystack`), from the same folder; and the token alphabet the
    haystacks are drawn from."""

    def __init__(self, path):
        from transformers import AutoModelForCausalLM

        from bertscope.models.loading import load_model

        self.eager = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        self.loaded = load_model(path, task="causal-lm")
        self.vocab = vocab = self.eager.config.vocab_size
        # A random model copies a prompt token only by chance: prompts drawn from the tokens it
        # produces itself (weighted by how often) make its argmax keys hold the produced token
        # often enough that the hit counts compared are not all zero.
        rng = np.random.default_rng(0)
        own = decode_score(self.eager, [1, *rng.integers(5, vocab, size=20).tolist()], (1, 2),
                           stop=lambda t: False, max_new_tokens=20).generated
        counts = Counter(own)
        self.alphabet = list(counts)
        self.weights = np.array([counts[t] for t in self.alphabet], dtype=float) / len(own)

    def case(self, seed: int, uniform: bool = False) -> tuple[list[int], tuple[int, int]]:
        """(prompt, needle span): a BOS and 6-39 tokens of the alphabet (`uniform`: of the whole
        vocabulary but the special tokens); the needle ends within two tokens of the prompt's
        end, so that the windowed layers (3 keys) can reach it."""
        rng = np.random.default_rng(seed)
        n = int(rng.integers(6, 40))
        tokens = rng.integers(5, self.vocab, size=n) if uniform else rng.choice(self.alphabet, size=n, p=self.weights)
        prompt = [1, *(int(t) for t in tokens)]
        end = int(rng.integers(n - 2, n + 2))
        return prompt, (int(rng.integers(1, end)), end)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_decoders import save_family

    made = {}

    def get(model_type: str) -> Tiny:
        if model_type not in made:
            made[model_type] = Tiny(save_family(tmp_path_factory.mktemp(f"tiny-{model_type}"), model_type))
        return made[model_type]
    return get


def own_answer_haystack(prompt, needle, generated) -> Haystack:
    """The teacher-forced input whose reference answer is the model's own greedy output."""
    ids = tuple(prompt) + tuple(generated)
    return Haystack(input_ids=ids, needle=needle, answer=(len(prompt), len(ids)), length=len(ids), depth=0,
                    needle_name="own")


def test_every_causal_family_is_checked():
    """The families come from the architecture table; the table holds the two the issue names."""
    assert {"llama", "gemma3_text"} <= set(CAUSAL)


@pytest.mark.parametrize("model_type", CAUSAL)
def test_teacher_forced_equals_decode_on_the_models_own_answer(tiny, model_type):
    """Per head, the hits of one teacher-forced pass equal Wu et al.'s decode-time hits when the
    reference answer is what greedy decoding produces, stop token included (Wu et al.'s loop
    scores the stop step, then breaks), on every backend; the model's predictions at the answer
    rows are the tokens decoded."""
    t = tiny(model_type)
    total = 0
    for seed in range(12):
        prompt, needle = t.case(seed)
        dec = decode_score(t.eager, prompt, needle, stop=lambda tok: tok == TINY_STOP, max_new_tokens=TINY_MAX_NEW)
        hay = own_answer_haystack(prompt, needle, dec.generated)
        for backend in ("eager", "chunked"):
            got = score_haystack(t.loaded, hay, backend=backend)
            assert got.copied and got.predicted == dec.generated, (seed, backend)
            np.testing.assert_array_equal(got.hits, dec.hits, err_msg=f"seed {seed}, {backend}")
            np.testing.assert_allclose(got.score, dec.score)
        total += int(dec.hits.sum())
    assert total > 0  # the equality compared real hits, not zeros


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), model_type=st.sampled_from(["llama", "gemma3_text", "gpt2"]))
def test_teacher_forced_equals_decode_triton(tiny, seed, model_type):
    """The same equality through the Triton kernels (interpreted on the CPU), on drawn haystacks."""
    assert "triton" in BACKENDS
    t = tiny(model_type)
    prompt, needle = t.case(seed)
    dec = decode_score(t.eager, prompt, needle, stop=lambda tok: tok == TINY_STOP, max_new_tokens=6)
    got = score_haystack(t.loaded, own_answer_haystack(prompt, needle, dec.generated), backend="triton")
    assert got.copied
    np.testing.assert_array_equal(got.hits, dec.hits)


def test_gemma3_window_layer_hits_through_its_sliding_cache(tiny):
    """Gemma-3's sliding layer keeps only its last keys in the decode cache, so a decode row is
    shorter than the context: the loop maps its argmax back to absolute positions. A case where
    that layer hits, with a row shorter than the context, checks the mapping against the pass."""
    t = tiny("gemma3_text")
    window = t.eager.config.sliding_window
    layer = t.eager.config.layer_types.index("sliding_attention")
    for seed in range(40):
        prompt, needle = t.case(seed)
        dec = decode_score(t.eager, prompt, needle, stop=lambda tok: tok == TINY_STOP, max_new_tokens=TINY_MAX_NEW)
        if dec.hits[layer].sum() and len(prompt) > window:
            got = score_haystack(t.loaded, own_answer_haystack(prompt, needle, dec.generated), backend="chunked")
            np.testing.assert_array_equal(got.hits, dec.hits)
            assert dec.keys[:, layer].min() >= len(prompt) - window  # inside the window, absolute positions
            return
    pytest.fail("no case made the sliding layer hit")


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_a_wrong_reference_token_at_step_k_makes_the_scores_differ(tiny, model_type):
    """The model does not answer: the reference answer is the greedy output with token k
    replaced by the token of the needle that a head attends to at that step. Then
    - rows before k are the decode steps (same prefix): their hits are equal;
    - row k has the same argmax keys but is scored against the reference token, so that head hits
      in the teacher-forced pass and not in decoding (the model produced another token);
    - rows after k see the reference prefix, decode steps see the model's own: their keys differ;
    - the pass says so: not copied, first wrong prediction at k (the token decoding produced)."""
    t = tiny(model_type)
    for seed in range(40):
        prompt, needle = t.case(seed, uniform=True)  # needle tokens other than the ones produced
        dec = decode_score(t.eager, prompt, needle, stop=lambda tok: False, max_new_tokens=TINY_MAX_NEW)
        ids = np.asarray(list(prompt) + list(dec.generated))
        # a step 0 < k < last, a head whose argmax key at k is in the needle and holds another token than produced
        found = [(k, layer, head) for k in range(1, len(dec.generated) - 1)
                 for layer, head in zip(*np.nonzero((dec.keys[k] >= needle[0]) & (dec.keys[k] < needle[1])))
                 if ids[dec.keys[k, layer, head]] != dec.generated[k]]
        if found:
            break
    else:
        pytest.fail("no case with a head attending into the needle at a wrong token")
    k, layer, head = found[0]
    reference = list(dec.generated)
    reference[k] = int(ids[dec.keys[k, layer, head]])
    hay = own_answer_haystack(prompt, needle, reference)
    got = score_haystack(t.loaded, hay, backend="chunked")
    assert not got.copied
    assert got.predicted[:k + 1] == dec.generated[:k + 1]  # right up to k; at k the model predicts its own token
    # rows before k: equal (the pass cut to the first k answer tokens, against the first k steps)
    before = score_haystack(t.loaded, own_answer_haystack(prompt, needle, reference[:k]), backend="chunked")
    np.testing.assert_array_equal(before.hits, dec.step_hits[:k].sum(0))
    # row k: the same keys as step k, scored against the reference token
    eager = teacher_forced_eager(t.eager, hay.input_ids, needle, hay.answer)
    np.testing.assert_array_equal(eager.keys[k], dec.keys[k])
    np.testing.assert_array_equal(eager.hits, got.hits)  # the pass is its eager definition here too
    assert not dec.step_hits[k, layer, head]
    row_k = (eager.keys[k] >= needle[0]) & (eager.keys[k] < needle[1]) & (ids[eager.keys[k]] == reference[k])
    assert row_k[layer, head]
    # rows after k read the reference prefix: the teacher-forced hits are rows < k (the decode
    # steps), row k, and those rows; the totals differ from decoding's
    after = slice(k + 1, len(reference))
    rows_after = (eager.keys[after] >= needle[0]) & (eager.keys[after] < needle[1]) \
        & (ids[eager.keys[after]] == np.asarray(reference[after])[:, None, None])
    np.testing.assert_array_equal(got.hits, before.hits + row_k + rows_after.sum(0))
    assert not np.array_equal(got.hits, dec.hits)


def test_rouge1_recall_is_wu_et_al_s_criterion():
    real = "eat a sandwich and sit in Dolores Park on a sunny day"
    assert rouge1_recall(real, "The best thing to do in San Francisco is to eat a sandwich and sit in Dolores "
                               "Park on a sunny day.") == 100
    assert rouge1_recall(real, "Eat a sandwich.") == pytest.approx(100 * 3 / 12)  # its one "a" counts once
    assert not wu_answered(real, "eat a sandwich and sit in")  # 6 of 12: not above half
    assert wu_answered(real, "eat a sandwich and sit in Dolores")


def test_wu_needle_span_can_start_early():
    """Wu et al.'s `find_needle_idx` accepts the first window covering more than 90% of the
    phrase's token set: with more than ten distinct tokens, the window one token early."""
    phrase = list(range(100, 112))  # 12 distinct tokens
    prompt = [1, 2, 3, 4, 5, *phrase, 6, 7]
    assert wu_needle_span(prompt, phrase) == (4, 16)  # the exact span is (5, 17)
    assert wu_needle_span(prompt, phrase[:9]) == (5, 14)  # 9 distinct tokens: exact


# --- the real SmolLM2 -------------------------------------------------------------------------

REAL_LENGTHS = ((512, 50), (1024, 20))  # (tokens, depth %): short haystacks, the test stays near a minute


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    from transformers import AutoModelForCausalLM

    from bertscope.models.loading import load_model

    eager = AutoModelForCausalLM.from_pretrained(smollm2_dir, attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    return eager, load_model(smollm2_dir, task="causal-lm")


def test_smollm2_teacher_forced_equals_decode_where_it_answers(smollm2, wiki):
    """Wu et al.'s San Francisco needle in Wikipedia haystacks, the chat prompt (SmolLM2 is an
    instruct model). Decoding stops at a newline or at the end-of-turn token (the model ends its
    answer with <|im_end|>; Wu et al.'s loop, stopping at newlines only, would decode on).

    Where greedy decoding gives the reference answer, the hits are equal per head; the steps
    after the answer (the stop token) hold no needle token, so they cannot hit. Where it does not
    (at 512 tokens SmolLM2 says "... is to eat a sandwich ...": ROUGE-1 recall 100, so Wu et al.
    count it; the pass does not), the pass says so at the first token that leaves the reference,
    its rows before that token are the decode steps (equal hits), and from that row on it reads
    the reference while decoding reads the model's own words: the hits differ. Given the model's
    own greedy answer as the reference instead, the pass equals Wu et al.'s score there too."""
    eager, loaded = smollm2
    needle = next(n for n in load_needles() if n.name == "san-francisco")
    builder = HaystackBuilder(loaded.tokenizer, corpus_texts("wiki"), prompt="chat")
    stop = newline_stop(loaded.tokenizer)
    answered = differs = 0
    for length, depth in REAL_LENGTHS:
        hay = builder.build(needle, length, depth)
        prompt = hay.input_ids[:hay.answer[0]]
        reference = hay.input_ids[hay.answer[0]:]
        dec = decode_score(eager, prompt, hay.needle, stop=stop)
        got = score_haystack(loaded, hay, backend="chunked")
        response = loaded.tokenizer.decode(dec.generated, skip_special_tokens=True)
        n = len(reference)
        if dec.generated[:n] == reference:  # greedy decoding gives the reference answer
            answered += 1
            assert wu_answered(needle.answer, response)
            assert got.copied and got.predicted == reference
            np.testing.assert_array_equal(got.hits, dec.step_hits[:n].sum(0), err_msg=f"L={length}")
            assert not set(dec.generated[n:]) & set(hay.input_ids[hay.needle[0]:hay.needle[1]]), response
            np.testing.assert_array_equal(got.hits, dec.hits)
            assert got.hits.sum() > 0
            continue
        k = next(i for i, (a, b) in enumerate(zip(dec.generated, reference)) if a != b)
        assert not got.copied and got.predicted[:k + 1] == dec.generated[:k + 1], response
        if k:
            cut = replace(hay, input_ids=hay.input_ids[:hay.answer[0] + k], answer=(hay.answer[0], hay.answer[0] + k),
                          length=hay.answer[0] + k)
            np.testing.assert_array_equal(score_haystack(loaded, cut, backend="chunked").hits,
                                          dec.step_hits[:k].sum(0))
        assert not np.array_equal(got.hits, dec.hits), response
        differs += 1
        # with the model's own greedy answer (stop token included) as the reference, the pass is Wu et al.'s score
        ids = prompt + dec.generated
        own = score_haystack(loaded, replace(hay, input_ids=ids, answer=(len(prompt), len(ids)), length=len(ids)),
                             backend="chunked")
        assert own.copied and wu_answered(needle.answer, response)
        np.testing.assert_array_equal(own.hits, dec.hits)
    assert answered and differs, (answered, differs)  # both cases shown
