"""Tiny random decoders with a word-level tokenizer, saved as checkpoint folders: what the tests
of decoder analyses load with `--model` (fixtures `tiny_llama_lm_dir` and `tiny_gemma3_lm_dir` in
conftest.py). Each folder holds the causal-LM model (its base model loads from it too) and a
tokenizer that puts a BOS in front of every text and has no [CLS] or [SEP]."""
from __future__ import annotations

import torch

WORDS = "the cat sat on a mat dog ran far away and then came back home quickly it was happy".split()
TEXTS = ["The cat sat on a mat .", "A dog ran far away , and then came back home quickly .",
         "It was happy .", "The dog sat on the cat , and it was happy .", "Then the cat ran home ."]
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", ".", ","]


def word_tokenizer():
    """Lower-cased words, "." and ",", a BOS added in front ("<s> $A"), no [CLS] or [SEP]."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B:1",
                                                       special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")


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


def save_tiny(path, config, causal_lm: bool = False, seed: int = 0):
    """Save a random model of `config` (its base model, or with `causal_lm` the model with its LM
    head) and the word tokenizer into `path`; returns `path`."""
    from transformers import AutoModel, AutoModelForCausalLM

    torch.manual_seed(seed)
    (AutoModelForCausalLM if causal_lm else AutoModel).from_config(config).save_pretrained(path)
    word_tokenizer().save_pretrained(path)
    return path
