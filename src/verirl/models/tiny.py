"""The embedded tiny model: a small BPE tokenizer with Qwen's special tokens and a
Qwen2-architecture model, so the code path that trains it is the one that trains real
Qwen models. Both are built deterministically from a seed; `verirl sft` then warm-starts
the model on the built-in task (see configs/tiny_sft.yaml, `make weights`).
"""
from __future__ import annotations

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from verirl.data.tasks import arith_split, reference_response

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # Qwen's ids 151643-151645, here 0-2
TAGS = ["<think>", "</think>", "<answer>", "</answer>"]  # single tokens, as in Qwen3's vocabulary
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# Qwen2's pre-tokenizer split (one digit per token). transformers loads any tokenizer saved
# beside a qwen2 config.json as Qwen2Tokenizer, which imposes exactly this pipeline, so the
# tiny tokenizer is trained with it: what we train is what every later load sees.
QWEN_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
              r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def build_tokenizer(vocab_size: int = 512, seed: int = 0) -> PreTrainedTokenizerFast:
    """Byte-level BPE with Qwen2's normaliser and pre-tokenizer, trained on rendered built-in
    problems; digits are always one token each."""
    train, _ = arith_split(seed, 4000, 0)
    corpus = []
    for p in train:
        corpus.append(f"<|im_start|>user\n{p.messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
                      f"{reference_response(p)}<|im_end|>\n")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE, model_max_length=512,
                                   clean_up_tokenization_spaces=False)


def build_model(tokenizer, seed: int = 0, hidden: int = 128, layers: int = 4, heads: int = 4,
                kv_heads: int = 2, mlp: int = 512) -> Qwen2ForCausalLM:
    """A ~1M-parameter Qwen2 (head dim 32: vLLM rejects 16), tied embeddings, random init from ``seed``."""
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
        tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-6,
        bos_token_id=None, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)
