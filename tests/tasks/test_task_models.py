"""load_model(task=...): task heads from the checkpoint, or initialised with a fixed seed, and
always through bertscope's attention function (statistics and gates work the same)."""
from __future__ import annotations

import pytest
import torch
from conftest import TINY_HEADS, TINY_LAYERS, tiny_config
from transformers import AutoModelForSequenceClassification

from bertscope.errors import UserError
from bertscope.kernels.spec import StatsSpec
from bertscope.models.attention import HeadProbe
from bertscope.models.loading import HEAD_SEED, load_model

pytestmark = pytest.mark.usefixtures("single_thread")

SPEC = StatsSpec(offsets=(-1, 0, 1), n_key_classes=4, class_mass=True, entropy=True, argmax=True)


def encode(loaded, texts=("The cat sat on the mat.", "Hello, world, again and again.")):
    inputs = dict(loaded.tokenizer(list(texts), padding=True, return_tensors="pt"))
    if not loaded.takes_token_types:
        inputs.pop("token_type_ids", None)
    return inputs


@pytest.fixture(scope="module")
def minilm_classifier(minilm_path):
    return load_model(minilm_path, task="sequence-classification", num_labels=3)


def test_minilm_gets_a_seeded_classification_head(minilm_path, minilm_classifier):
    loaded = minilm_classifier
    assert loaded.task == "sequence-classification" and loaded.head_initialised
    assert f"seed {HEAD_SEED}" in loaded.head_note and "classifier.weight" in loaded.head_note
    assert (loaded.n_layers, loaded.n_heads) == (6, 12)
    assert loaded.model.config._attn_implementation == "bertscope" and not loaded.model.training
    torch.manual_seed(123)  # the global RNG must not matter: the head has its own seed
    again = load_model(minilm_path, task="sequence-classification", num_labels=3)
    assert torch.equal(again.model.classifier.weight, loaded.model.classifier.weight)
    assert loaded.model.classifier.weight.shape == (3, 384)
    # the encoder is MiniLM's own: the same hidden states as the bare model
    bare = load_model(minilm_path)
    assert not bare.head_initialised and bare.task is None and bare.head_note == ""
    inputs = encode(loaded)
    with torch.no_grad():
        hidden = loaded.model.bert(**inputs).last_hidden_state
        assert torch.equal(hidden, bare.model(**inputs).last_hidden_state)
        assert loaded.model(**inputs).logits.shape == (2, 3)


def test_gates_and_statistics_work_through_the_task_head(minilm_classifier):
    loaded = minilm_classifier
    inputs = encode(loaded)
    probe = HeadProbe(loaded.n_layers, loaded.n_heads, SPEC)
    seen = []
    with torch.no_grad():
        logits = loaded.model(**inputs).logits
        with probe.active(loaded.class_table[inputs["input_ids"]], lambda layer, s, kv: seen.append(layer)):
            torch.testing.assert_close(loaded.model(**inputs).logits, logits, atol=1e-5, rtol=1e-5)
    assert seen == list(range(6))
    loaded.gates.requires_grad_()
    try:
        loss = torch.nn.functional.cross_entropy(loaded.model(**inputs).logits, torch.tensor([0, 2]))
        loss.backward()
        assert loaded.gates.xi.grad.shape == (6, 12) and bool((loaded.gates.xi.grad != 0).all())
    finally:
        loaded.gates.reset()


def test_minilm_masked_lm(minilm_path):
    loaded = load_model(minilm_path, task="masked-lm")
    assert loaded.task == "masked-lm" and loaded.head_initialised and "cls.predictions" in loaded.head_note
    assert (loaded.n_layers, loaded.n_heads) == (6, 12)
    inputs = encode(loaded)
    with torch.no_grad():
        assert loaded.model(**inputs).logits.shape[-1] == loaded.model.config.vocab_size


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
def test_a_fine_tuned_checkpoint_loads_back_with_its_head(tmp_path, minilm_tokenizer, kind):
    torch.manual_seed(0)
    config = tiny_config(kind, minilm_tokenizer)
    config.num_labels = 3
    model = AutoModelForSequenceClassification.from_config(config).eval()
    model.save_pretrained(tmp_path)
    minilm_tokenizer.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, task="sequence-classification")
    assert not loaded.head_initialised and loaded.head_note == ""
    assert (loaded.model_type, loaded.n_layers, loaded.n_heads) == (kind, TINY_LAYERS, TINY_HEADS)
    assert loaded.model.config._attn_implementation == "bertscope"
    inputs = encode(loaded)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(**inputs).logits, model(**inputs).logits, atol=1e-5, rtol=1e-5)
    assert load_model(tmp_path, task="sequence-classification", num_labels=3).model.num_labels == 3
    with pytest.raises(UserError, match="has 3 labels, not 2") as info:
        load_model(tmp_path, task="sequence-classification", num_labels=2)
    assert "\n" not in str(info.value)


def test_task_user_errors(tiny_checkpoint):
    with pytest.raises(UserError, match="unknown task 'qa'"):
        load_model(tiny_checkpoint, task="qa")
    with pytest.raises(UserError, match="num_labels is an option of task 'sequence-classification'"):
        load_model(tiny_checkpoint, task="masked-lm", num_labels=2)
    with pytest.raises(UserError, match="num_labels must be >= 1"):
        load_model(tiny_checkpoint, task="sequence-classification", num_labels=0)
