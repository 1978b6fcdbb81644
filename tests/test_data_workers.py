"""`verirl preprocess` with workers >= 2: bad, too-long and unencodable rows come back as
plain data (no hang), and a worker that dies is reported. Each case runs in a real child
interpreter with a deadline, so a hang fails the test instead of stalling the suite."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from verirl.data.load import RowError
from verirl.data.preprocess import PreprocessConfig, RowProcessor

DEADLINE_S = 120  # a real run takes seconds (two workers spawn and import transformers); a hang never ends


def _rows(n):
    return [{"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(n)]


def _run(tmp_path, body: str) -> list[dict]:
    """Run ``body`` (inside ``main()``) in a fresh interpreter; it prints one JSON object per line."""
    script = tmp_path / "case.py"
    script.write_text("import json, os, signal, sys, threading, time\n"
                      "import multiprocessing as mp\n"
                      "from verirl.data.preprocess import PreprocessConfig, preprocess\n"
                      "from verirl.core.errors import DataError\n"
                      "from verirl.data.load import RowError\n\n"
                      "def main():\n" + textwrap.indent(textwrap.dedent(body), "    ") +
                      "\n\nif __name__ == '__main__':\n    main()\n")
    # its own session, so that on a hang the child and the workers it spawned are killed together
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"preprocess with workers=2 hung (no result in {DEADLINE_S}s); stderr: {stderr[-2000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow  # about 20-50 s here (twice that on the slower CI machines): `make test-slow`
def test_bad_too_long_and_unencodable_rows_with_two_workers(tmp_path):
    rows = _rows(200)
    rows[70] = {"question": "no problem key", "answer": "1"}
    rows[130] = {"problem": "word " * 200, "answer": "1"}
    rows[190] = {"problem": "half a pair: \ud800 here", "answer": "1"}  # json.dumps writes the escape \ud800
    src = tmp_path / "raw.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _run(tmp_path, f"""
        base = dict(input={str(src)!r}, output_prefix={str(tmp_path / 'o' / 'train')!r}, prompt_type="qwen",
                    workers=2, log_interval=64, max_prompt_length=64)
        cases = [("skip", dict(on_bad_row="skip")), ("error", dict()),
                 ("too_long_error", dict(on_bad_row="skip", too_long="error"))]
        for name, kw in cases:
            try:
                m = preprocess(PreprocessConfig(**base, **kw))
                print(json.dumps({{"case": name, "written": m["rows_written"], "read": m["rows_read"],
                                  "skipped": m["skipped_by_reason"]}}), flush=True)
            except RowError as e:
                print(json.dumps({{"case": name, "error": str(e), "reason": e.reason}}), flush=True)
    """)
    by = {r["case"]: r for r in out}
    assert by["skip"] == {"case": "skip", "written": 197, "read": 200,
                          "skipped": {"missing_prompt": 1, "too_long": 1, "encoding_error": 1}}
    assert by["error"]["reason"] == "missing_prompt"
    assert "raw.jsonl row 70: key 'problem' (map_keys.prompt) is missing" in by["error"]["error"]
    assert by["too_long_error"]["reason"] == "too_long"
    assert "raw.jsonl row 130: prompt is" in by["too_long_error"]["error"]


def test_unencodable_row_is_a_bad_row_in_process(tmp_path):
    """workers=1: a lone surrogate is a bad row naming the file and row, skipped with on_bad_row=skip."""
    from verirl.data.preprocess import preprocess
    rows = _rows(3)
    rows[1] = {"problem": "x \udfff y", "answer": "1"}
    src = tmp_path / "raw.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = dict(input=str(src), output_prefix=str(tmp_path / "o"), prompt_type="qwen")
    with pytest.raises(RowError, match=r"raw.jsonl row 1: the prompt holds a lone surrogate U\+DFFF.*on_bad_row=skip"):
        preprocess(PreprocessConfig(**cfg))
    m = preprocess(PreprocessConfig(**cfg, on_bad_row="skip"))
    assert (m["rows_written"], m["skipped_by_reason"]) == (2, {"encoding_error": 1})


def test_text_the_tokenizer_refuses_is_a_bad_row_not_a_crash():
    """Should the batched encode fail, each row is encoded alone and only the one at fault is bad."""
    proc = RowProcessor(PreprocessConfig(input="x", output_prefix="y", prompt_type="qwen"))
    real = proc._encode

    def refusing(texts):
        if any("BOOM" in t for t in texts):
            raise RuntimeError("tokenizer says no")
        return real(texts)

    proc._encode = refusing
    out = proc.chunk([("f.jsonl", 0, {"problem": "1 + 1", "answer": "2"}),
                      ("f.jsonl", 1, {"problem": "BOOM", "answer": "2"}),
                      ("f.jsonl", 2, {"problem": "2 + 2", "answer": "4"})])
    assert isinstance(out[1], RowError) and out[1].reason == "encoding_error"
    assert "f.jsonl row 1: the tokenizer cannot encode this prompt (RuntimeError: tokenizer says no)" in str(out[1])
    assert out[0]["prompt_ids"] and out[2]["prompt_ids"]


def test_row_error_survives_pickling():
    import pickle
    e = pickle.loads(pickle.dumps(RowError("f row 1: bad", "missing_prompt")))
    assert (str(e), e.reason) == ("f row 1: bad", "missing_prompt")


def test_a_worker_that_dies_is_reported_not_waited_for(tmp_path):
    src = tmp_path / "raw.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _rows(3000)))
    out = _run(tmp_path, f"""
        def kill_a_worker():  # SIGKILL the first worker process as soon as it exists
            while True:
                kids = mp.active_children()
                if kids:
                    os.kill(kids[0].pid, signal.SIGKILL)
                    return
                time.sleep(0.02)

        threading.Thread(target=kill_a_worker, daemon=True).start()
        try:
            preprocess(PreprocessConfig(input={str(src)!r}, output_prefix={str(tmp_path / 'o')!r},
                                        prompt_type="qwen", workers=2, log_interval=64))
            print(json.dumps({{"error": None}}))
        except DataError as e:
            print(json.dumps({{"error": str(e), "type": type(e).__name__}}))
    """)
    assert out and out[0].get("type") == "DataError", out
    msg = out[0]["error"]
    assert "a worker process died while" in msg and "were being tokenized" in msg and "workers=1" in msg
    assert f"{src} rows 0-" in msg  # names the rows it was given
    assert not (tmp_path / "o.parquet").exists()
