"""Data files as a user has them: the on-the-fly cache follows their content, preprocessed
Parquet is checked against the tokenizer, and files that are not UTF-8 are named, line and all."""
import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import verirl.data.preprocess as preprocess_module
from verirl.data.dataset import load_prompts
from verirl.data.load import RowError
from verirl.data.preprocess import PreprocessConfig, preprocess
from verirl.core.errors import ConfigError, DataError
from verirl.models.load import resolve_path

ROWS = [{"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(6)]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _options(**kw):
    base = dict(prompt_type="mine", templates_file="", handler_name="instruction", map_keys={},
                additional_keys=["labels"], max_prompt_length=512, too_long="error")
    base.update(kw)
    return base


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """A private cache, and a count of the times load_prompts really preprocesses."""
    monkeypatch.setenv("VERIRL_CACHE", str(tmp_path / "cache"))
    calls = []
    real = preprocess_module.preprocess

    def counting(cfg, console=None):
        calls.append(cfg.output_prefix)
        return real(cfg, console)

    monkeypatch.setattr(preprocess_module, "preprocess", counting)
    return calls


def _template(path, user_slot):
    path.write_text(json.dumps([{"name": "mine", "format_user": {"slots": [user_slot]}}]))


def _texts(loaded, tokenizer):
    return [tokenizer.decode(p.ids) for p in loaded.prompts]


# --- the cache of raw files preprocessed on the fly -------------------------------------------------

def test_cache_follows_the_templates_file_content(tmp_path, counted, tiny):
    src = _jsonl(tmp_path / "raw.jsonl", ROWS)
    tf = tmp_path / "templates.json"
    _template(tf, "Q: {{content}}\nA:")
    first = load_prompts(str(src), "tiny", **_options(templates_file=str(tf)))
    assert _texts(first, tiny.tokenizer)[0] == "Q: What is 0 + 1?\nA:"
    again = load_prompts(str(src), "tiny", **_options(templates_file=str(tf)))
    assert len(counted) == 1 and [p.ids for p in again.prompts] == [p.ids for p in first.prompts]  # a cache hit
    cached = sorted(p.name for p in (tmp_path / "cache" / "data").iterdir())
    assert len(cached) == 2 and cached[0].startswith("raw-") and cached[0].endswith(".manifest.json")

    _template(tf, "Question: {{content}}\nAnswer:")  # edit the template, nothing else
    edited = load_prompts(str(src), "tiny", **_options(templates_file=str(tf)))
    assert len(counted) == 2
    assert _texts(edited, tiny.tokenizer)[0] == "Question: What is 0 + 1?\nAnswer:"


def test_cache_follows_the_data_content_not_its_size_and_mtime(tmp_path, counted):
    src = _jsonl(tmp_path / "raw.jsonl", ROWS)
    before = load_prompts(str(src), "tiny", **_options(prompt_type="qwen"))
    st = src.stat()
    text = src.read_text()
    src.write_text(text.replace('"answer": "7"', '"answer": "8"'))  # same size
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime
    assert src.stat().st_size == st.st_size
    after = load_prompts(str(src), "tiny", **_options(prompt_type="qwen"))
    assert len(counted) == 2
    assert [p.label for p in before.prompts][3] == "7" and [p.label for p in after.prompts][3] == "8"


def test_cache_follows_the_tokenizer_files(tmp_path, counted):
    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        shutil.copy(os.path.join(resolve_path("tiny"), name), tok / name)
    src = _jsonl(tmp_path / "raw.jsonl", ROWS)
    first = load_prompts(str(src), str(tok), **_options(prompt_type="tokenizer"))
    jinja = tok / "chat_template.jinja"
    jinja.write_text(jinja.read_text().replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\nSure:'"))
    second = load_prompts(str(src), str(tok), **_options(prompt_type="tokenizer"))
    assert len(counted) == 2
    assert len(second.prompts[0].ids) > len(first.prompts[0].ids)


def test_a_cache_entry_without_its_manifest_is_not_used(tmp_path, counted):
    """The manifest is written last: a parquet alone is a run that died half way."""
    src = _jsonl(tmp_path / "raw.jsonl", ROWS)
    load_prompts(str(src), "tiny", **_options(prompt_type="qwen"))
    (manifest,) = (tmp_path / "cache" / "data").glob("*.manifest.json")
    manifest.unlink()
    loaded = load_prompts(str(src), "tiny", **_options(prompt_type="qwen"))
    assert len(counted) == 2 and loaded.stop_words == ["<|im_end|>"]


# --- preprocessed Parquet checked against the tokenizer ---------------------------------------------

@pytest.mark.parametrize("ids,match", [
    ([[1, 2, 3], [5, 10 ** 6, 7]], r"row 1: token id 1000000 is outside the vocabulary of the tokenizer 'tiny'"),
    ([[1, 2, 3], [4], [-3, 2]], r"row 2: token id -3 is outside the vocabulary"),
    ([[1, 2, 3], []], r"row 1: 'prompt_ids' is empty"),
    ([[1, 2, 3], None], r"row 1: 'prompt_ids' is empty"),
])
def test_preprocessed_parquet_with_bad_ids_is_named(tmp_path, ids, match):
    f = tmp_path / "pre.parquet"
    pq.write_table(pa.table({"prompt_ids": pa.array(ids, pa.list_(pa.int64())),
                             "labels": [str(i) for i in range(len(ids))]}), f)
    with pytest.raises(DataError, match=match) as e:
        load_prompts(str(f), "tiny", **_options(prompt_type="qwen"))
    assert str(f) in str(e.value) and "Re-run `verirl preprocess`" in str(e.value)
    assert "tokenizer_name_or_path=tiny" in str(e.value)


def test_preprocessed_parquet_in_vocabulary_loads(tmp_path, tiny):
    f = tmp_path / "pre.parquet"
    last = len(tiny.tokenizer) - 1
    pq.write_table(pa.table({"prompt_ids": [[0, 1, last]], "labels": ["1"]}), f)
    assert load_prompts(str(f), "tiny", **_options(prompt_type="qwen")).prompts[0].ids == [0, 1, last]


# --- files that are not UTF-8 -----------------------------------------------------------------------

def _cfg(tmp_path, src, **kw):
    return PreprocessConfig(input=str(src), output_prefix=str(tmp_path / "o" / "train"), prompt_type="qwen", **kw)


def test_non_utf8_jsonl_names_the_line(tmp_path):
    src = tmp_path / "raw.jsonl"
    src.write_bytes(json.dumps(ROWS[0]).encode() + b"\n" + '{"problem": "caf\u00e9?", "answer": "1"}\n'.encode("latin-1")
                    + json.dumps(ROWS[1]).encode() + b"\n")
    with pytest.raises(RowError, match=r"raw.jsonl line 2: not valid UTF-8 \(byte 0xe9 at column 17\).*"
                                       r"save the file as UTF-8"):
        preprocess(_cfg(tmp_path, src))
    m = preprocess(_cfg(tmp_path, src, on_bad_row="skip"))
    assert (m["rows_read"], m["rows_written"], m["skipped_by_reason"]) == (3, 2, {"not_utf8": 1})


def test_non_utf8_json_names_the_line_and_offset(tmp_path):
    src = tmp_path / "raw.json"
    body = json.dumps(ROWS[:2], indent=1).replace("What is 1", "Qu\u00e9 es 1")
    src.write_bytes(body.encode("latin-1"))
    offset = body.encode("latin-1").index(b"\xe9")
    line = body[: body.index("\u00e9")].count("\n") + 1
    with pytest.raises(RowError, match=rf"raw.json line {line}: not valid UTF-8 \(byte 0xe9 at byte offset "
                                       rf"{offset} of the file\)"):
        preprocess(_cfg(tmp_path, src))


def test_non_utf8_data_when_training_from_raw_files(tmp_path, monkeypatch):
    monkeypatch.setenv("VERIRL_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "raw.jsonl"
    src.write_bytes(json.dumps(ROWS[0]).encode() + b"\n" + b'{"problem": "\xff\xfe", "answer": "1"}\n')
    with pytest.raises(DataError, match=r"raw.jsonl line 2: not valid UTF-8"):
        load_prompts(str(src), "tiny", **_options(prompt_type="qwen"))


def test_utf16_file_is_called_utf16_and_utf8_bom_is_fine(tmp_path):
    src = tmp_path / "raw.jsonl"
    src.write_bytes("".join(json.dumps(r) + "\n" for r in ROWS[:2]).encode("utf-16"))
    with pytest.raises(RowError, match=r"raw.jsonl line 1: not valid UTF-8.*UTF-16"):
        preprocess(_cfg(tmp_path, src))
    src.write_bytes("".join(json.dumps(r) + "\n" for r in ROWS[:2]).encode("utf-8-sig"))
    assert preprocess(_cfg(tmp_path, src))["rows_written"] == 2
    (tmp_path / "raw.json").write_bytes(json.dumps(ROWS[:2]).encode("utf-8-sig"))
    assert preprocess(_cfg(tmp_path, tmp_path / "raw.json"))["rows_written"] == 2


def test_non_utf8_templates_file_is_a_config_error(tmp_path):
    from verirl.data.templates import get_template
    tf = tmp_path / "templates.json"
    tf.write_bytes('[{"name": "mine",\n "default_system": "Tu es un assistant d\u00e9vou\u00e9."}]'.encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"templates file '{tf}' line 2: not valid UTF-8.*Save it as UTF-8"):
        get_template("mine", tf)


# --- labels are text; empty files; rows named in the user's file ------------------------------------

def test_number_labels_among_strings_become_text(tmp_path, monkeypatch):
    """GSM8K-style files mix integer and string answers: each label is its text."""
    monkeypatch.setenv("VERIRL_CACHE", str(tmp_path / "cache"))
    src = _jsonl(tmp_path / "raw.jsonl", [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": 4},
                                          {"problem": "half?", "answer": 0.5}, {"problem": "ok?", "answer": True}])
    loaded = load_prompts(str(src), "tiny", **_options(prompt_type="qwen"))
    assert [p.label for p in loaded.prompts] == ["2", "4", "0.5", "True"]


@pytest.mark.parametrize("label,shown", [([1, 2], r"a list \[1, 2\]"), ({"a": 1}, r"a dict \{\"a\": 1\}"),
                                         (None, "null")])
def test_a_list_dict_or_null_label_is_refused_naming_the_row(tmp_path, label, shown):
    src = _jsonl(tmp_path / "raw.jsonl", [ROWS[0], {"problem": "x?", "answer": label}, ROWS[1]])
    with pytest.raises(RowError, match=rf"raw.jsonl row 1: label key 'answer' \(map_keys.response\) is {shown}; "):
        preprocess(_cfg(tmp_path, src))
    m = preprocess(_cfg(tmp_path, src, on_bad_row="skip"))
    assert m["rows_written"] == 2 and m["skipped_by_reason"] == {"bad_label": 1}


def test_a_null_label_in_a_preprocessed_parquet_is_refused(tmp_path):
    f = tmp_path / "pre.parquet"
    pq.write_table(pa.table({"prompt_ids": [[1, 2], [3, 4]], "labels": ["1", None]}), f)
    with pytest.raises(DataError, match=r"pre.parquet row 1: label null is not one text or number"):
        load_prompts(str(f), "tiny", **_options(prompt_type="qwen"))


@pytest.mark.parametrize("name,content", [("empty.jsonl", ""), ("blank.jsonl", "\n\n"), ("empty.json", "[]")])
def test_an_empty_file_is_called_empty(tmp_path, monkeypatch, name, content):
    monkeypatch.setenv("VERIRL_CACHE", str(tmp_path / "cache"))
    src = tmp_path / name
    src.write_text(content)
    with pytest.raises(DataError, match=rf"data '{src}' is empty: {src} holds no rows"):
        preprocess(_cfg(tmp_path, src))
    assert not (tmp_path / "o" / "train.parquet").exists()
    with pytest.raises(DataError, match=rf"is empty: {src} holds no rows"):
        load_prompts(str(src), "tiny", **_options(prompt_type="qwen"))


def test_a_too_long_prompt_is_named_in_the_users_file(tmp_path, monkeypatch):
    monkeypatch.setenv("VERIRL_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "raw"
    folder.mkdir()
    _jsonl(folder / "a.jsonl", ROWS[:3])
    _jsonl(folder / "b.jsonl", ROWS[:1] + [{"problem": "word " * 300, "answer": "1"}])
    with pytest.raises(DataError, match=rf"^{folder / 'b.jsonl'} row 1: prompt is \d+ tokens, over "
                                        r"data.max_prompt_length=64"):
        load_prompts(str(folder), "tiny", **_options(prompt_type="qwen", max_prompt_length=64))


def test_cli_eval_and_preprocess_take_mixed_labels_and_call_an_empty_file_empty(tmp_path, monkeypatch, capsys):
    from verirl.cli import main

    monkeypatch.setenv("VERIRL_CACHE", str(tmp_path / "cache"))
    src = _jsonl(tmp_path / "raw.jsonl", [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": 4}])
    out = tmp_path / "res.json"
    assert main(["eval", "--data", str(src), "--n", "0", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["overall"]["prompts"] == 2
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["preprocess", f"input={tmp_path / 'empty.jsonl'}", f"output_prefix={tmp_path / 'o'}"]) == 2
    assert "is empty" in capsys.readouterr().err


def test_a_kept_key_of_mixed_types_is_named(tmp_path):
    src = _jsonl(tmp_path / "raw.jsonl", [{**ROWS[0], "task": "add"}, {**ROWS[1], "task": 7}])
    with pytest.raises(DataError, match=r"key 'task' \(dataset_additional_keys\) holds values of several types "
                                        r"\(int, str\)"):
        preprocess(_cfg(tmp_path, src, dataset_additional_keys=["labels", "task"]))
