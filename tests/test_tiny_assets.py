"""The shipped tiny model: Qwen's special tokens, a chat template, and a deterministic rebuild."""
import torch

from verirl.models.tiny import build_model, build_tokenizer


def test_shipped_tokenizer_has_qwen_specials_and_template(tiny):
    tok = tiny.tokenizer
    for i, t in enumerate(("<|endoftext|>", "<|im_start|>", "<|im_end|>")):  # Qwen's 151643-151645, here 0-2
        assert tok.convert_tokens_to_ids(t) == i and tok(t, add_special_tokens=False)["input_ids"] == [i]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = tok.apply_chat_template([{"role": "user", "content": "1 + 2 = ?"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\n1 + 2 = ?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_ids_to_tokens(tok("12345", add_special_tokens=False)["input_ids"]) == list("12345")
    assert tok.convert_tokens_to_ids("<|im_end|>") in tiny.stop_ids


def test_tokenizer_rebuild_is_deterministic_and_matches_shipped(tiny):
    a, b = build_tokenizer(seed=0), build_tokenizer(seed=0)
    assert a.get_vocab() == b.get_vocab() == tiny.tokenizer.get_vocab()


def test_model_init_is_deterministic(tiny):
    m1, m2 = build_model(tiny.tokenizer, seed=0), build_model(tiny.tokenizer, seed=0)
    for (n, p), (_, q) in zip(m1.named_parameters(), m2.named_parameters()):
        assert torch.equal(p, q), n
    assert type(m1).__name__ == "Qwen2ForCausalLM"
    assert sum(p.numel() for p in tiny.model.parameters()) < 5_000_000  # ships under ~20 MB
