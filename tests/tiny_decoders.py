"""Tiny random models with a word-level tokenizer, saved as checkpoint folders: what the tests
of decoder analyses load with `--model` (fixtures `tiny_llama_lm_dir` and `tiny_gemma3_lm_dir` in
conftest.py). Each folder holds the causal-LM model (its base model loads from it too) and a
tokenizer that puts a BOS in front of every text and has no [CLS] or [SEP].

`family_config(model_type)` is the tiny config of every family of the architecture table
(`bertscope.models.tiny.tiny_config`: 2 layers, 4 query heads, 2 key/value heads where the family
groups them, a window small enough to bite where the family has one) sized to the word
tokenizer. `save_family` saves one with the word tokenizer its template calls for ([CLS] A [SEP],
<s> A </s> or a BOS in front): tests/test_families.py runs every family through every command
from them."""
from __future__ import annotations

import torch

WORDS = "the cat sat on a mat dog ran far away and then came back home quickly it was happy".split()
TEXTS = ["The cat sat on a mat .", "A dog ran far away , and then came back home quickly .",
         "It was happy .", "The dog sat on the cat , and it was happy .", "Then the cat ran home ."]
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", ".", ","]


ENCODER_SPECIALS = ["[CLS]", "[SEP]", "[MASK]"]  # after the words: the decoders' ids stay as they were


def word_tokenizer(template: str = "bos"):
    """Lower-cased words, "." and ","; `template` "bos": a BOS added in front ("<s> $A"), no [CLS]
    or [SEP]; "cls": BERT's "[CLS] $A [SEP]" (pairs "[CLS] $A [SEP] $B [SEP]"); "roberta":
    "<s> $A </s>" (pairs "<s> $A </s> </s> $B </s>")."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS + (ENCODER_SPECIALS if template == "cls" else []))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    names = dict(unk_token="<unk>", pad_token="<pad>")
    if template == "bos":
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B:1",
                                                           special_tokens=[("<s>", 1)])
        names.update(bos_token="<s>", eos_token="</s>")
    elif template == "cls":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        names.update(cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    elif template == "roberta":
        tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                           special_tokens=[("<s>", 1), ("</s>", 2)])
        names.update(bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>")
    else:
        raise ValueError(template)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **names)


# 2 layers, 4 query heads sharing 2 key/value heads
CONFIG = dict(vocab_size=len(SPECIALS) + len(WORDS), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.4,
              bos_token_id=1, eos_token_id=2, pad_token_id=3)


def llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(**CONFIG)


def gemma3_config():
    """A sliding-window layer (4 keys: itself and 3 before) then a global one."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**CONFIG, head_dim=8, sliding_window=4, query_pre_attn_scalar=12,
                            layer_types=["sliding_attention", "full_attention"])


def save_tiny(path, config, causal_lm: bool = False, seed: int = 0, tokenizer=None):
    """Save a random model of `config` (its base model, or with `causal_lm` the model with its LM
    head) and a tokenizer (default: the word tokenizer with a BOS) into `path`; returns `path`."""
    from transformers import AutoModel, AutoModelForCausalLM

    torch.manual_seed(seed)
    (AutoModelForCausalLM if causal_lm else AutoModel).from_config(config).save_pretrained(path)
    (tokenizer or word_tokenizer()).save_pretrained(path)
    return path


# --- a tiny model of every family of the table --------------------------------------------------

def family_template(model_type: str) -> str:
    """The word tokenizer's template for a family: a decoder's BOS, RoBERTa's <s> A </s>, BERT's [CLS] A [SEP]."""
    from bertscope.models.architectures import ARCHITECTURES

    arch = ARCHITECTURES[model_type]
    if arch.causal:
        return "bos"
    return "roberta" if arch.template.startswith("<s>") else "cls"


def family_config(model_type: str, vocab_size: int | None = None):
    """`bertscope.models.tiny.tiny_config` of `model_type`, by default with the vocabulary of the
    family's word tokenizer."""
    from bertscope.models.tiny import tiny_config

    return tiny_config(model_type, vocab_size or len(word_tokenizer(family_template(model_type)).get_vocab()))


def save_family(path, model_type: str, seed: int = 0):
    """Save a tiny random model of `model_type` and its word tokenizer into `path`: a decoder with
    its LM head (its base model loads from it too), an encoder bare. Returns `path`."""
    from bertscope.models.architectures import ARCHITECTURES

    tokenizer = word_tokenizer(family_template(model_type))
    config = family_config(model_type, len(tokenizer.get_vocab()))
    return save_tiny(path, config, causal_lm=ARCHITECTURES[model_type].causal, seed=seed, tokenizer=tokenizer)
