"""The embedded tiny model: a small BPE tokenizer with Qwen's special tokens and a
Qwen2-architecture model, so the code path that trains it is the one that trains real
Qwen models. Both are built deterministically from a seed; `verirl sft` then warm-starts
the model on the built-in task (see configs/tiny_sft.yaml, `make weights`).

``tiny-tools`` (`build_tools_tokenizer`, configs/tiny_tools_sft.yaml): the same construction and model,
its tokenizer trained on calculator episodes, with Qwen2.5's tool-call markers as single tokens and a
chat template that renders tool messages as Qwen2.5's does (docs/tiny-model.md).

``tiny-moe`` (`build_moe_model`, configs/tiny_moe_sft.yaml): the tiny tokenizer and a ~1.8M-parameter
Qwen3-MoE (8 experts, top-2, every layer sparse), so the mixture-of-experts path runs on a CPU (docs/moe.md).
"""
from __future__ import annotations

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from verirl.data.tasks import arith_split, arith_tools_split, reference_response, reference_turns

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
    return _bpe(corpus, TAGS, CHAT_TEMPLATE, vocab_size)


def _bpe(corpus: list[str], tags: list[str], chat_template: str, vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``corpus`` with Qwen2's normaliser and pre-tokenizer, Qwen's special
    tokens and ``tags`` as single non-special tokens."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in tags])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=chat_template, model_max_length=512,
                                   clean_up_tokenization_spaces=False)


# ----------------------------------------------------------------------------- tiny-tools
# The tiny tokenizer's construction, trained on calculator episodes of the arith_tools task, with
# Qwen2.5's tool-call markers as single non-special tokens (they survive decode(skip_special_tokens=True),
# so the tool-call parser sees them). Its turns end at <|im_end|> or right after </tool_call>.
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
# Qwen2.5's shape: a tool message is a user turn wrapped in <tool_response>, consecutive ones share one
# user turn (one per line). ``tools=`` is not rendered: the model knows its one tool, the calculator.
TOOLS_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user\\n' }}"
    "{%- else %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_response>' + message['content'] + '</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tools_tokenizer(vocab_size: int = 512, seed: int = 0) -> PreTrainedTokenizerFast:
    """The tiny-tools tokenizer: the tiny tokenizer's construction trained on rendered calculator
    episodes (prompt, call, tool response, answer), with `TOOL_TAGS` as single tokens."""
    train, _ = arith_tools_split(seed, 4000, 0)
    corpus = []
    for p in train:
        call, result, answer = reference_turns(p)
        corpus.append(f"<|im_start|>user\n{p.messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
                      f"{call['content']}<|im_end|>\n<|im_start|>user\n<tool_response>{result['content']}"
                      f"</tool_response><|im_end|>\n<|im_start|>assistant\n{answer['content']}<|im_end|>\n")
    return _bpe(corpus, TAGS + TOOL_TAGS, TOOLS_CHAT_TEMPLATE, vocab_size)


def tools_stop_ids(tokenizer) -> list[int]:
    """tiny-tools' stop ids: pad, <|im_end|> and </tool_call> (a turn that calls a tool ends with the call)."""
    return sorted({tokenizer.pad_token_id, *tokenizer.convert_tokens_to_ids(["<|im_end|>", "</tool_call>"])})


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


def moe_config(tokenizer, hidden: int = 128, layers: int = 4, heads: int = 4, kv_heads: int = 2,
               experts: int = 8, top_k: int = 2, expert_mlp: int = 128) -> Qwen3MoeConfig:
    """tiny-moe's config: a Qwen3-MoE (head dim 32, q/k norms), every layer sparse, top-k weights
    renormalised, tied embeddings."""
    return Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
        num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=expert_mlp, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.0, output_router_logits=False,
        max_position_embeddings=512, tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-6,
        bos_token_id=None, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )


def build_moe_model(tokenizer, seed: int = 0, **shape) -> Qwen3MoeForCausalLM:
    """tiny-moe: `moe_config` (``shape`` overrides its sizes), random init from ``seed``."""
    config = moe_config(tokenizer, **shape)
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(config)
