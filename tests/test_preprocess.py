"""`verirl preprocess`: handlers, templates, bad rows, workers, and training from the output."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verirl.data.load import RowError
from verirl.data.preprocess import PreprocessConfig, preprocess


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [{"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1), "task": "add" if i % 2 else "other",
         "data_source": "toy"} for i in range(40)]


def _cfg(tmp_path, input, **kw):
    base = dict(input=str(input), output_prefix=str(tmp_path / "out" / "train"), tokenizer_name_or_path="tiny",
                prompt_type="qwen", dataset_additional_keys=["labels", "task", "data_source"])
    base.update(kw)
    return PreprocessConfig(**base)


def test_instruction_handler_writes_parquet_and_manifest(tmp_path, tiny):
    src = _jsonl(tmp_path / "raw.jsonl", ROWS)
    m = preprocess(_cfg(tmp_path, src, map_keys={"prompt": "problem", "response": "answer"}))
    assert (m["rows_read"], m["rows_written"], m["rows_skipped"]) == (40, 40, 0)
    assert m["stop_words"] == ["<|im_end|>"] and m["replace_eos"] is True
    rows = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    r = rows[3]
    expected = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 3 + 4?"
                "<|im_end|>\n<|im_start|>assistant\n")
    assert r["prompt"] == expected
    assert r["prompt_ids"] == tiny.tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert (r["labels"], r["task"], r["data_source"]) == ("7", "add", "toy")
    assert json.loads((tmp_path / "out" / "train.manifest.json").read_text())["rows_written"] == 40


def test_query_and_system_fields_and_nested_keys(tmp_path):
    src = _jsonl(tmp_path / "raw.jsonl", [{"q": {"text": "Add them:"}, "nums": "3 4", "sys": "Be brief.",
                                            "sol": {"final": "7"}}])
    preprocess(_cfg(tmp_path, src, dataset_additional_keys=["labels"],
                    map_keys={"prompt": "q.text", "query": "nums", "system": "sys", "response": "sol.final"}))
    r = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()[0]
    assert r["prompt"].startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAdd them:\n3 4<|im_end|>")
    assert r["labels"] == "7"


def test_verl_parquet_handler(tmp_path):
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{i} + 1 = ?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
             "extra_info": {"index": i, "split": "train"}} for i in range(5)]
    src = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    m = preprocess(_cfg(tmp_path, src, handler_name="VerlParquetHandler", prompt_type="tokenizer",
                        dataset_additional_keys=["labels", "task", "data_source", "extra_info"]))
    assert m["rows_written"] == 5
    r = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()[2]
    assert r["prompt"] == "<|im_start|>user\n2 + 1 = ?<|im_end|>\n<|im_start|>assistant\n"
    assert (r["labels"], r["task"], r["data_source"]) == ("3", "math", "openai/gsm8k")
    assert json.loads(r["extra_info"]) == {"index": 2, "split": "train"}


def test_verl_rows_keep_source_and_ability_by_default_and_train_with_per_source_metrics(tmp_path):
    """With the default dataset_additional_keys ([labels]), veRL rows still keep data_source and
    ability (as task): rewards route by task and the metrics split by source."""
    from verirl.cli import main

    rows = [{"data_source": "gsm8k" if i % 2 else "math", "prompt": [{"role": "user", "content": f"{i} + 1 = ?"}],
             "ability": "arith", "reward_model": {"style": "rule", "ground_truth": str(i + 1)}} for i in range(8)]
    src = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    preprocess(_cfg(tmp_path, src, handler_name="VerlParquetHandler", prompt_type="tokenizer",
                    dataset_additional_keys=["labels"]))
    r = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()[1]
    assert (r["labels"], r["task"], r["data_source"]) == ("2", "arith", "gsm8k")
    run = tmp_path / "run"
    assert main(["train", f"data.train_path={src}", "data.handler_name=VerlParquetHandler",
                 "data.prompt_type=tokenizer", f"trainer.run_dir={run}", "trainer.total_steps=1",
                 "data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=2", "rollout.max_new_tokens=8",
                 "eval.before_train=false", "eval.at_end=false", "log.progress=false", "reward.workers=0",
                 "reward.tasks={arith: [acc]}", "reward.verifiers=[acc]", "reward.weights=[1.0]"]) == 0
    m = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert "reward/task/arith/mean" in m and "reward/acc/mean" in m
    assert {"reward/data_source/gsm8k/mean", "reward/data_source/math/mean"} & set(m)


BAD = [
    ({"question": "x", "answer": "1"}, "missing_prompt", r"raw.jsonl row 1: key 'problem' \(map_keys.prompt\) is missing"),
    ({"problem": 12, "answer": "1"}, "bad_prompt_type", r"raw.jsonl row 1: key 'problem' \(map_keys.prompt\) must be a string"),
    ({"problem": "  ", "answer": "1"}, "empty_prompt", r"raw.jsonl row 1: key 'problem' \(map_keys.prompt\) is empty"),
    ({"problem": "ok", "solution": "1"}, "missing_response", r"raw.jsonl row 1: key 'answer' \(map_keys.response\) is missing"),
]


@pytest.mark.parametrize("bad,reason,message", BAD)
def test_bad_rows_error_naming_file_row_key_or_are_counted(tmp_path, bad, reason, message):
    src = _jsonl(tmp_path / "raw.jsonl", [ROWS[0], bad, ROWS[1]])
    with pytest.raises(RowError, match=message):
        preprocess(_cfg(tmp_path, src, dataset_additional_keys=["labels"]))
    m = preprocess(_cfg(tmp_path, src, dataset_additional_keys=["labels"], on_bad_row="skip"))
    assert m["rows_written"] == 2 and m["skipped_by_reason"] == {reason: 1}


def test_invalid_json_line_is_named(tmp_path):
    src = tmp_path / "raw.jsonl"
    src.write_text(json.dumps(ROWS[0]) + "\n" + '{"problem": "a", "answer": \n' + json.dumps(ROWS[1]) + "\n")
    with pytest.raises(RowError, match=r"raw.jsonl line 2: invalid JSON"):
        preprocess(_cfg(tmp_path, src, dataset_additional_keys=["labels"]))
    m = preprocess(_cfg(tmp_path, src, dataset_additional_keys=["labels"], on_bad_row="skip"))
    assert m["rows_written"] == 2 and m["skipped_by_reason"] == {"invalid_json": 1}


def test_unreadable_parquet_is_named(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[:4]), folder / "a.parquet")
    (folder / "b.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(RowError, match=r"b.parquet: cannot be read as parquet"):
        preprocess(_cfg(tmp_path, folder, dataset_additional_keys=["labels"]))
    m = preprocess(_cfg(tmp_path, folder, dataset_additional_keys=["labels"], on_bad_row="skip"))
    assert m["rows_written"] == 4 and m["skipped_by_reason"] == {"unreadable_file": 1}


def test_too_long_prompts_are_filtered_or_refused(tmp_path):
    src = _jsonl(tmp_path / "raw.jsonl", ROWS[:3] + [{"problem": "word " * 200, "answer": "1"}])
    m = preprocess(_cfg(tmp_path, src, dataset_additional_keys=["labels"], max_prompt_length=64))
    assert m["rows_written"] == 3 and m["skipped_by_reason"] == {"too_long": 1}
    with pytest.raises(RowError, match=r"row 3: prompt is \d+ tokens, over max_prompt_length=64"):
        preprocess(_cfg(tmp_path, src, dataset_additional_keys=["labels"], max_prompt_length=64, too_long="error"))


def test_two_workers_give_the_same_output(tmp_path):
    src = _jsonl(tmp_path / "raw.jsonl", ROWS * 5)
    preprocess(_cfg(tmp_path, src, log_interval=64))
    one = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    preprocess(_cfg(tmp_path, src, workers=2, log_interval=64))
    two = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert one == two and len(one) == 200


def test_user_templates_file_by_path(tmp_path):
    from verirl.data.templates import get_template
    f = tmp_path / "templates.json"
    f.write_text(json.dumps([{"name": "mine", "format_user": {"slots": ["Q: {{content}}\nA:"]},
                              "format_system": {"slots": [{"token": "<|im_start|>"}, "{{content}}\n"]},
                              "default_system": "sys", "stop_words": ["<|endoftext|>"], "replace_eos": True}]))
    t = get_template("mine", f)
    assert t.render([{"role": "user", "content": "1+1"}]) == "<|im_start|>sys\nQ: 1+1\nA:"
    assert get_template("qwen", f).stop_words == ["<|im_end|>"]  # built-ins stay available
    with pytest.raises(ValueError, match="known:.*mine"):
        get_template("nope", f)


def test_train_from_raw_jsonl_with_template_stop_words(tmp_path, capsys):
    from verirl.cli import main
    f = tmp_path / "templates.json"
    f.write_text(json.dumps([{"name": "short", "format_user": {"slots": ["<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n"]},
                              "stop_words": ["<|endoftext|>"], "replace_eos": True}]))
    src = _jsonl(tmp_path / "raw.jsonl", ROWS)
    run = tmp_path / "run"
    assert main(["train", f"data.train_path={src}", f"eval.data={src}", "data.prompt_type=short",
                 f"data.templates_file={f}", "data.dataset_additional_keys=[labels,task]", "data.shuffle=megatron",
                 f"trainer.run_dir={run}", "trainer.total_steps=2", "data.prompts_per_step=2",
                 "actor.mini_batch_prompts=2", "rollout.n=2", "eval.n=1", "log.progress=false",
                 "rollout.max_new_tokens=8"]) == 0
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: the evaluation on eval.data before training
    assert "val/greedy_acc" in rows[0] and "val/pass@1" in rows[2]
    assert "reward/task/add/mean" in rows[1] or "reward/task/other/mean" in rows[1]
    # replace_eos: <|endoftext|> (id 0) is now the only stop token
    gen = json.loads((run / "final" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 0


def test_train_from_preprocessed_parquet(tmp_path):
    from verirl.cli import main
    src = _jsonl(tmp_path / "raw.jsonl", ROWS)
    assert main(["preprocess", f"input={src}", f"output_prefix={tmp_path / 'pre' / 'train'}", "prompt_type=qwen",
                 "dataset_additional_keys=[labels,task]"]) == 0
    run = tmp_path / "run"
    assert main(["train", f"data.train_path={tmp_path / 'pre' / 'train.parquet'}", f"trainer.run_dir={run}",
                 "trainer.total_steps=1", "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2",
                 "log.progress=false", "rollout.max_new_tokens=8"]) == 0
    row = json.loads((run / "metrics.jsonl").read_text())
    assert row["prompt_length/mean"] > 20  # the qwen template's default system prompt is in there


def test_preprocess_cli_errors_are_one_paragraph(tmp_path, capsys):
    from verirl.cli import main
    src = _jsonl(tmp_path / "raw.jsonl", [{"question": "x", "answer": "1"}])
    assert main(["preprocess", f"input={src}", f"output_prefix={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert "raw.jsonl row 0: key 'problem' (map_keys.prompt) is missing" in err and "Traceback" not in err
    assert main(["preprocess", f"input={tmp_path / 'nope.jsonl'}", f"output_prefix={tmp_path / 'o'}"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_json_list_and_arrow_inputs(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(ROWS[:3]))
    table = pa.Table.from_pylist(ROWS[3:5])
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    m = preprocess(_cfg(tmp_path, tmp_path, dataset_additional_keys=["labels"]))
    assert m["rows_written"] == 5 and len(m["source"]) == 2
    labels = [r["labels"] for r in pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()]
    assert labels == [r["answer"] for r in ROWS[:5]]


def test_summary_counts_unparsable_lines_as_read(tmp_path):
    src = tmp_path / "raw.jsonl"
    src.write_text(json.dumps(ROWS[0]) + "\n{broken\n" + json.dumps(ROWS[1]) + "\n")
    m = preprocess(_cfg(tmp_path, src, dataset_additional_keys=["labels"], on_bad_row="skip"))
    assert (m["rows_read"], m["rows_written"], m["rows_skipped"]) == (3, 2, 1)


def test_unknown_prompt_type_stops_before_reading(tmp_path):
    src = _jsonl(tmp_path / "raw.jsonl", ROWS[:2])
    with pytest.raises(ValueError, match="prompt_type 'qwen9' is not a template"):
        preprocess(_cfg(tmp_path, src, prompt_type="qwen9"))
    assert not (tmp_path / "out").exists()
