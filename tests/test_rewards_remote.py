"""reward.remote and reward.judge (`verirl.rewards.remote`) against real HTTP servers on 127.0.0.1, started
here: batching, concurrency, deadlines, retries, a refused connection, the judge's parsers, the key; then a
short `verirl train` with a scoring server that hangs for one batch."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from verirl.config.schema import JUDGE_PARSERS, JudgeConfig, RemoteRewardConfig
from verirl.core.errors import ConfigError
from verirl.rewards.remote import BODY_BYTES, ERRORS, MARGIN_S, PARSERS, JudgeService, RemoteService, _Client


class Server:
    """A ThreadingHTTPServer on 127.0.0.1 whose POST replies are ``reply(server, n, path, headers, body)`` ->
    (status, JSON-able body or bytes, extra headers), where n counts the requests from 0. It records each
    request and the most requests it ever held at once; ``release`` ends every handler waiting on it;
    ``trickle`` > 0: the reply's body is sent a byte every ``trickle`` seconds."""

    def __init__(self, reply):
        self.reply, self.seen, self.active, self.peak, self.trickle = reply, [], 0, 0, 0.0
        self.lock, self.release = threading.Lock(), threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    n = len(outer.seen)
                    outer.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    outer.active += 1
                    outer.peak = max(outer.peak, outer.active)
                try:
                    status, out, headers = outer.reply(outer, n, self.path, self.headers, body)
                finally:
                    with outer.lock:
                        outer.active -= 1
                data = out if isinstance(out, bytes) else json.dumps(out).encode()
                try:
                    self.send_response(status)
                    for k, v in {"Content-Type": "application/json", **headers}.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    step = 1 if outer.trickle else max(len(data), 1)
                    for i in range(0, len(data), step):
                        self.wfile.write(data[i:i + step])
                        self.wfile.flush()
                        if outer.trickle and outer.release.wait(outer.trickle):
                            break
                except OSError:
                    pass  # the client gave up (an abandoned request)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(reply):
        servers.append(Server(reply))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def label_in_response(server, n, path, headers, body):
    """A scoring server: 1 when the item's label is in its response, else 0."""
    return 200, {"scores": [float(i["label"] in i["response"]) for i in body["items"]]}, {}


def remote(url, **kw):
    return RemoteService(RemoteRewardConfig(url=url, **{"backoff_s": 0.05, **kw}))


def samples(n, **extra):
    return [{"label": str(i), "task": "add", "prompt": [{"role": "user", "content": f"q{i}"}], **extra}
            for i in range(n)]


def client_threads():
    return [t for t in threading.enumerate() if t.name.startswith("verirl-")]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_remote_batches_items_and_keeps_their_order(serve):
    srv = serve(label_in_response)
    rows = samples(10, source="gsm8k", blob=object())
    responses = [f"it is {i}" if i % 3 else "no idea" for i in range(10)]
    out = remote(srv.url + "/score", batch_size=4).score(responses, rows)
    srv.seen.sort(key=lambda r: int(r["body"]["items"][0]["label"]))  # sent at once: in any order
    assert [len(r["body"]["items"]) for r in srv.seen] == [4, 4, 2]  # ceil(10 / 4) requests
    assert {r["path"] for r in srv.seen} == {"/score"}
    assert out.scores == [(float(i % 3 != 0), "") for i in range(10)]
    assert out.counts == {ERRORS: 0.0}
    item = srv.seen[0]["body"]["items"][1]
    # the sample's JSON-able columns go along; an object that is not JSON does not
    assert item == {"prompt": [{"role": "user", "content": "q1"}], "response": "it is 1", "label": "1", "task": "add",
                    "source": "gsm8k"}
    assert srv.seen[0]["headers"]["Content-Type"] == "application/json"
    assert "Authorization" not in srv.seen[0]["headers"]


def test_remote_keeps_max_concurrency_in_flight(serve):
    def slow(server, n, path, headers, body):
        time.sleep(0.2)
        return label_in_response(server, n, path, headers, body)
    srv = serve(slow)
    start = time.monotonic()
    out = remote(srv.url, batch_size=1, max_concurrency=3).score(["0"] * 12, samples(12))
    assert srv.peak == 3 and len(srv.seen) == 12
    assert time.monotonic() - start < 12 * 0.2 / 2  # in parallel, not one after another
    assert [s for s, _ in out.scores] == [1.0] + [0.0] * 11


def test_a_hung_batch_scores_none_by_the_deadline(serve):
    def hang_on_label_2(server, n, path, headers, body):
        if any(i["label"] == "2" for i in body["items"]):
            server.release.wait(30)
        return label_in_response(server, n, path, headers, body)
    srv = serve(hang_on_label_2)
    svc = remote(srv.url + "/score?token=in-the-query", batch_size=2, timeout_s=1.0)
    seen = []
    t = threading.Timer(0.5, lambda: seen.extend(svc.outstanding()))
    t.start()
    start = time.monotonic()
    out = svc.score([str(i) for i in range(6)], samples(6))
    took = time.monotonic() - start
    t.join()
    assert 1.0 <= took < 1.0 + MARGIN_S + 0.5, took
    assert [s for s, _ in out.scores] == [1.0, 1.0, None, None, 1.0, 1.0]
    assert "within" in out.scores[2][1] and "/score" in out.scores[2][1]
    assert out.counts == {ERRORS: 2.0}
    assert len(seen) == 1 and "POST http://127.0.0.1:" in seen[0] and "(2 item(s), try 1)" in seen[0]
    assert "token" not in seen[0] and "?" not in seen[0]  # the URL without its query
    assert svc.outstanding() == [] and client_threads() == []  # abandoned: its socket shut, its thread ended
    srv.release.set()
    out = svc.score(["0", "1"], samples(2))  # the next call is not held up by the abandoned one
    assert out.scores == [(1.0, ""), (1.0, "")]


def test_a_trickling_reply_is_abandoned_at_the_deadline(serve):
    """A server that sends a byte every 0.1 s never trips the socket timeout: `score` still returns, and
    the request's thread and connection end with it, call after call."""
    srv = serve(lambda *a: (200, b" " * 1000, {}))
    srv.trickle = 0.1
    svc = remote(srv.url, timeout_s=0.5, batch_size=1, max_concurrency=2)
    for _ in range(3):
        start = time.monotonic()
        out = svc.score(["0", "1"], samples(2))
        assert time.monotonic() - start < 0.5 + MARGIN_S + 0.3
        assert all(s is None and "within timeout_s=0.5 s" in why for s, why in out.scores)
        assert client_threads() == [] and svc.outstanding() == []
    assert len(srv.seen) == 6


EXIT_AFTER_CLOSE = """
import sys, time
from verirl.config.schema import RemoteRewardConfig
from verirl.rewards.remote import RemoteService
svc = RemoteService(RemoteRewardConfig(url=sys.argv[1], timeout_s=0.5, retries=0))
print(svc.score(["r"], [{}]).scores, flush=True)
svc.close()
print("closed", flush=True)
"""


def test_the_process_exits_after_close_while_a_server_trickles(serve):
    """A trainer whose scoring server still trickles a reply exits when it is done, at once."""
    srv = serve(lambda *a: (200, b" " * 100_000, {}))
    srv.trickle = 0.05
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen([sys.executable, "-c", EXIT_AFTER_CLOSE, srv.url], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert "within timeout_s=0.5 s" in proc.stdout.readline()
        assert proc.stdout.readline() == "closed\n"
        closed = time.monotonic()
        assert proc.wait(timeout=5) == 0, proc.stderr.read()
        assert time.monotonic() - closed < 1.0
    finally:
        proc.kill()
        proc.wait()


def test_a_500_or_429_is_retried_a_400_is_not(serve):
    def flaky(server, n, path, headers, body):
        if n == 0:
            return 500, b"overloaded", {}
        if n == 1:
            return 429, {"error": "slow down"}, {"Retry-After": "0.1"}
        return label_in_response(server, n, path, headers, body)
    srv = serve(flaky)
    start = time.monotonic()
    out = remote(srv.url, retries=2).score(["0", "x"], samples(2))
    assert out.scores == [(1.0, ""), (0.0, "")] and out.counts == {ERRORS: 0.0}
    assert len(srv.seen) == 3 and time.monotonic() - start >= 0.05 + 0.1  # backoff, then Retry-After

    srv = serve(lambda *a: (500, b"down for good", {}))
    out = remote(srv.url, retries=2).score(["0"], samples(1))
    assert len(srv.seen) == 3 and out.scores[0][0] is None and "HTTP 500" in out.scores[0][1]
    assert "down for good" in out.scores[0][1] and "tries: 3" in out.scores[0][1]

    srv = serve(lambda *a: (400, {"error": "bad items"}, {}))
    out = remote(srv.url, retries=3).score(["0", "1"], samples(2))
    assert len(srv.seen) == 1 and out.counts == {ERRORS: 2.0}
    assert out.scores[0][1].startswith("HTTP 400 from http://127.0.0.1") and "bad items" in out.scores[0][1]


def test_no_retry_past_the_deadline(serve):
    srv = serve(lambda *a: (503, b"", {}))
    start = time.monotonic()
    out = remote(srv.url, retries=10, backoff_s=0.4, timeout_s=1.0).score(["0"], samples(1))
    took = time.monotonic() - start
    assert took < 1.0, took  # 0.4 s, then a second 0.8 s wait would pass the deadline: given up at once
    assert len(srv.seen) == 2 and "no time left before the deadline" in out.scores[0][1]


def test_a_refused_connection_is_counted_fast():
    start = time.monotonic()
    out = remote(f"http://127.0.0.1:{free_port()}/score", retries=2, timeout_s=20).score(["a", "b", "c"],
                                                                                        samples(3))
    assert time.monotonic() - start < 2.0
    assert out.counts == {ERRORS: 3.0} and all(s is None for s, _ in out.scores)
    assert "ConnectionRefusedError" in out.scores[0][1] and "tries: 3" in out.scores[0][1]


def test_bad_replies_are_errors_that_say_what_came(serve):
    replies = {0: {"scores": [1.0]}, 1: {"result": [1, 2]}, 2: b"<html>oops</html>",
               3: {"scores": [None, "high"]}, 4: {"scores": [True, 0.5]},
               5: b"[" * 100_000, 6: b'{"scores": [1' + b"0" * 400 + b", 0.25]}"}  # too deep; too large a float
    srv = serve(lambda server, n, *a: (200, replies[n], {}))
    svc = remote(srv.url, batch_size=2, max_concurrency=1)
    out = svc.score([str(i) for i in range(14)], samples(14))
    whys = [w for _, w in out.scores]
    assert "replied with 1 scores; expected {\"scores\": [...]} with 2 entries" in whys[0]
    assert "replied with keys ['result']" in whys[2]
    assert "not JSON: '<html>oops</html>'" in whys[4]
    assert whys[6] == "the server scored it null" and "'high' is not a number" in whys[7]
    assert "True" in whys[8] and out.scores[9] == (0.5, "")
    assert out.scores[10][0] is None and "not JSON: '[[[[" in whys[10] and len(whys[10]) < 300
    assert "an integer of 1329 bits, is beyond a float's range" in whys[12] and out.scores[13] == (0.25, "")
    assert out.counts == {ERRORS: 12.0}


def test_a_job_that_raises_scores_its_items_none():
    """Whatever a reply makes a job raise, its items score None with the reason (the key replaced)."""
    client = _Client("remote", "http://127.0.0.1:1/score", "sk-in-an-error", "K", 2, 0, 0.1)

    def boom(deadline, stop):
        raise RecursionError("maximum recursion depth exceeded near sk-in-an-error")
    out = client.run([(2, boom), (1, lambda deadline, stop: [(1.0, "")])], 1.0)
    assert out[2] == (1.0, "") and out[0] == out[1] and out[0][0] is None
    assert "could not be scored: RecursionError: maximum recursion depth exceeded near <key>" in out[0][1]


def test_the_key_is_sent_and_never_shown(serve, monkeypatch):
    secret = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv("VERIRL_TEST_REMOTE_KEY", secret)

    def echo_key(server, n, path, headers, body):  # a server that puts the key in its error text
        if n == 0:
            return 401, {"error": f"bad key {headers['Authorization']}"}, {}
        return label_in_response(server, n, path, headers, body)
    srv = serve(echo_key)
    svc = remote(srv.url, api_key_env="VERIRL_TEST_REMOTE_KEY", max_concurrency=1)
    out = svc.score(["0"], samples(1))
    assert srv.seen[0]["headers"]["Authorization"] == f"Bearer {secret}"
    assert out.scores[0][0] is None and secret not in out.scores[0][1]
    assert "bad key Bearer <key>" in out.scores[0][1] and "$VERIRL_TEST_REMOTE_KEY" in out.scores[0][1]
    assert svc.score(["0"], samples(1)).scores == [(1.0, "")]
    assert secret not in repr(svc) and secret not in repr(svc.client) and secret not in repr(vars(svc))
    monkeypatch.delenv("VERIRL_TEST_REMOTE_KEY")
    with pytest.raises(ConfigError, match="reward.remote.api_key_env='VERIRL_TEST_REMOTE_KEY' names an environment"):
        remote(srv.url, api_key_env="VERIRL_TEST_REMOTE_KEY")


def test_an_echoed_key_is_replaced_before_the_text_is_cut(serve, monkeypatch):
    """A long error body with the key at each place around the 200-character cut, and a body whose first
    BODY_BYTES end inside the key: no part of the key is in the reason."""
    secret = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv("VERIRL_TEST_REMOTE_KEY", secret)
    pads = list(range(130, 180)) + [None]

    def echo(server, n, path, headers, body):
        if pads[n] is None:
            return 401, b" " * (BODY_BYTES - 20) + headers["Authorization"][7:].encode() + b" " * 100, {}
        return 401, {"error": "x" * pads[n] + " bad key " + headers["Authorization"]}, {}
    srv = serve(echo)
    svc = remote(srv.url, api_key_env="VERIRL_TEST_REMOTE_KEY", retries=0)
    for pad in pads:
        why = svc.score(["0"], samples(1)).scores[0][1]
        assert why.startswith("HTTP 401") and secret[:4] not in why, (pad, why)
    assert why.startswith("HTTP 401 from http://127.0.0.1") and ": <key> (check the key in" in why


def test_a_key_with_control_characters(serve, monkeypatch):
    """A key file's CRLF line end is removed; a control or non-ASCII character inside the key is refused
    without the key in the error."""
    srv = serve(label_in_response)
    monkeypatch.setenv("VERIRL_TEST_REMOTE_KEY", "sk-from-a-crlf-file\r\n")
    assert remote(srv.url, api_key_env="VERIRL_TEST_REMOTE_KEY").score(["0"], samples(1)).scores == [(1.0, "")]
    assert srv.seen[0]["headers"]["Authorization"] == "Bearer sk-from-a-crlf-file"
    for bad, what in [("sk-two\nlines", "a control character at position 7 of 12"), ("sk-\x1b[0m", "a control"),
                      ("sk-xq9 z", "a space"), ("sk-caf\u00e9", "a character outside ASCII")]:
        monkeypatch.setenv("VERIRL_TEST_REMOTE_KEY", bad)
        with pytest.raises(ConfigError, match=r"\$VERIRL_TEST_REMOTE_KEY \(named by reward.remote.api_key_env\) "
                                              r"holds " + what) as e:
            remote(srv.url, api_key_env="VERIRL_TEST_REMOTE_KEY")
        assert bad not in str(e.value) and bad[3:7] not in str(e.value)
    monkeypatch.setenv("VERIRL_TEST_REMOTE_KEY", " \r\n")
    with pytest.raises(ConfigError, match="is not set \\(or empty\\)"):
        remote(srv.url, api_key_env="VERIRL_TEST_REMOTE_KEY")


def test_a_redirect_is_not_followed_with_the_key(serve, monkeypatch):
    monkeypatch.setenv("VERIRL_TEST_REMOTE_KEY", "sk-redirected")
    elsewhere = serve(label_in_response)
    srv = serve(lambda *a: (307, b"", {"Location": elsewhere.url + "/steal?x=1"}))
    out = remote(srv.url, api_key_env="VERIRL_TEST_REMOTE_KEY").score(["0"], samples(1))
    assert elsewhere.seen == [] and len(srv.seen) == 1
    assert "HTTP 307" in out.scores[0][1] and f"a redirect to {elsewhere.url}/steal, not followed" in out.scores[0][1]


def test_bad_urls_are_config_errors():
    with pytest.raises(ConfigError, match="reward.remote.url='ftp://host/x' is not an http"):
        remote("ftp://host/x")
    with pytest.raises(ConfigError, match="reward.judge.model is not set"):
        JudgeService(JudgeConfig(url="http://127.0.0.1:1/v1"))


# ---- the judge

def canned(text_for):
    """An OpenAI-compatible chat endpoint whose reply is ``text_for(user message)``."""
    def reply(server, n, path, headers, body):
        if path != "/v1/chat/completions":
            return 404, {"error": f"no route {path}"}, {}
        text = text_for(body["messages"][-1]["content"])
        return 200, {"id": f"c{n}", "object": "chat.completion", "model": body["model"],
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": "stop"}]}, {}
    return reply


def judge(url, **kw):
    return JudgeService(JudgeConfig(url=url, model="judge-7b", **{"backoff_s": 0.05, **kw}))


def test_the_parsers_are_the_configs_choices():
    assert set(PARSERS) == set(JUDGE_PARSERS)


def test_judge_yes_no_sends_one_chat_request_per_sample(serve):
    srv = serve(canned(lambda msg: msg.split("Response:\n")[1].split("\n")[0]))  # says back the response
    svc = judge(srv.url + "/v1/", system="You grade answers.", max_tokens=8, max_concurrency=2)
    responses = ["Yes, it is right.", "no.", "Not sure, maybe yes or NO", "I cannot say", "{label} {x} yes"]
    rows = samples(5)
    rows[1]["prompt"] = "a templated prompt text"  # a preprocessed dataset's prompt: a str
    out = svc.score(responses, rows)
    assert [s for s, _ in out.scores] == [1.0, 0.0, 0.0, None, 1.0]
    assert "no yes or no word: 'I cannot say'" in out.scores[3][1]
    assert out.counts == {ERRORS: 1.0} and len(srv.seen) == 5 and srv.peak <= 2
    first = next(r["body"] for r in srv.seen if "Yes, it is right." in r["body"]["messages"][-1]["content"])
    assert first == {"model": "judge-7b", "max_tokens": 8, "temperature": 0.0, "messages": [
        {"role": "system", "content": "You grade answers."},
        {"role": "user", "content": "Question:\nq0\n\nReference answer: 0\n\nResponse:\nYes, it is right.\n\n"
                                    "Is the response correct? Answer yes or no."}]}
    users = [r["body"]["messages"][-1]["content"] for r in srv.seen]
    assert any(u.startswith("Question:\na templated prompt text\n") for u in users)
    assert any("Response:\n{label} {x} yes\n" in u for u in users)  # a response's braces are not a template


def test_judge_number_and_boxed_divide_by_scale(serve, tmp_path):
    srv = serve(canned(lambda msg: msg.split("GRADE ")[1]))
    template = tmp_path / "grade.txt"
    template.write_text("Grade {response} for {source} (task {task}) as GRADE {response}")
    svc = judge(srv.url + "/v1", template=str(template), parse="number", scale=10)
    out = svc.score(["I give it 7", "7.5 then 8", "1e1", "none"], samples(4, source="gsm8k"))
    assert [s for s, _ in out.scores] == [0.7, 0.8, 1.0, None] and out.counts == {ERRORS: 1.0}
    assert "no number: 'none'" in out.scores[3][1]
    assert srv.seen[0]["body"]["messages"] == [{"role": "user", "content": srv.seen[0]["body"]["messages"][0][
        "content"]}] and "for gsm8k (task add)" in srv.seen[0]["body"]["messages"][0]["content"]

    svc = judge(srv.url + "/v1", template="GRADE {response}", parse="boxed", scale=5)
    out = svc.score(["\\boxed{1} then \\boxed{ 4 }", "score 3", "\\boxed{four}", "$\\boxed{2.5}$"], samples(4))
    assert [s for s, _ in out.scores] == [0.8, None, None, 0.5]
    assert "no \\boxed{}" in out.scores[1][1] and "holds 'four', not a number" in out.scores[2][1]


def test_judge_bad_reply_and_http_errors(serve):
    srv = serve(lambda server, n, *a: (200, {"choices": []}, {}) if n == 0 else (404, {"error": "no model"}, {}))
    out = judge(srv.url + "/v1", max_concurrency=1).score(["a", "b"], samples(2))
    assert "replied without choices[0].message.content: '{\"choices\": []}'" in out.scores[0][1]
    assert out.scores[1][1].startswith("HTTP 404") and out.counts == {ERRORS: 2.0}

    srv = serve(canned(lambda msg: "yes"))
    srv.reply = (lambda inner: lambda s, n, *a: (502, b"", {}) if n == 0 else inner(s, n, *a))(srv.reply)
    out = judge(srv.url + "/v1", retries=1).score(["a"], samples(1))
    assert out.scores == [(1.0, "")] and len(srv.seen) == 2  # retried after the 502


def test_judge_template_mistakes_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="reward.judge.template is not a valid template"):
        judge("http://127.0.0.1:1/v1", template="Grade {response")
    with pytest.raises(ConfigError, match=r"the field \{0\} is not a plain name"):
        judge("http://127.0.0.1:1/v1", template="Grade {0}")
    with pytest.raises(ConfigError, match=r"the field \{response.__class__\} is not a plain name"):
        judge("http://127.0.0.1:1/v1", template="Grade {response.__class__}")
    with pytest.raises(ConfigError, match="looks like a file, but there is none"):
        judge("http://127.0.0.1:1/v1", template=str(tmp_path / "missing.txt"))


def test_a_sample_the_template_does_not_fit_scores_none(serve):
    """A sample without a column the template names, or whose value its format spec refuses, scores None
    with the reason and is counted; the other samples are judged."""
    srv = serve(canned(lambda msg: "yes"))
    svc = judge(srv.url + "/v1", template="Grade {response} against {rubric} (item {n:d})")
    rows = [{**r, "rubric": "be strict", "n": i} for i, r in enumerate(samples(4))]
    del rows[1]["rubric"]
    rows[2]["n"] = "two"
    out = svc.score(["a", "b", "c", "d"], rows)
    assert [s for s, _ in out.scores] == [1.0, None, None, 1.0] and out.counts == {ERRORS: 2.0}
    assert "names {rubric}, which this sample (task 'add') does not have; its columns: label, n, prompt" \
        in out.scores[1][1]
    assert "could not be filled in for this sample (task 'add'): Unknown format code 'd'" in out.scores[2][1]
    assert len(srv.seen) == 2 and srv.seen[0]["body"]["messages"][0]["content"].startswith("Grade ")


def test_judge_key_from_its_own_variable(serve, monkeypatch):
    monkeypatch.setenv("VERIRL_TEST_JUDGE_KEY", "sk-judge-123")
    srv = serve(canned(lambda msg: "yes"))
    svc = judge(srv.url + "/v1", api_key_env="VERIRL_TEST_JUDGE_KEY")
    assert svc.score(["a"], samples(1)).scores == [(1.0, "")]
    assert srv.seen[0]["headers"]["Authorization"] == "Bearer sk-judge-123" and "sk-judge" not in repr(svc)


# ---- in a training run

def test_training_with_a_scoring_server_that_hangs_once(serve, tmp_path, monkeypatch):
    """3 steps of the tiny recipe, reward.verifiers=[acc, remote]: the server hangs on step 2's first batch;
    that step waits the deadline and no more, counts the batch's items, and the key is in no file."""
    from verirl.cli import main

    secret = f"sk-verirl-{uuid.uuid4().hex}"
    monkeypatch.setenv("VERIRL_TEST_TRAIN_KEY", secret)

    def once_hung(server, n, path, headers, body):
        assert headers["Authorization"] == f"Bearer {secret}"
        if n == 2:  # step 2's first batch
            server.release.wait(30)
        return label_in_response(server, n, path, headers, body)
    srv = serve(once_hung)
    run = tmp_path / "run"
    timeout_s = 1.5
    rc = main(["train", "--config", "tiny", f"trainer.run_dir={run}", "trainer.total_steps=3",
               "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=4", "reward.workers=0",
               "eval.before_train=false", "eval.at_end=false", "log.progress=false", "log.console_every=1",
               "trainer.dump_rollouts=true", "reward.verifiers=[acc,remote]", "reward.weights=[1.0,0.5]", "reward.tasks={}",
               f"reward.remote.url={srv.url}/score", "reward.remote.batch_size=4",
               f"reward.remote.timeout_s={timeout_s}", "reward.remote.api_key_env=VERIRL_TEST_TRAIN_KEY"])
    assert rc == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r[ERRORS] for r in rows] == [0.0, 4.0, 0.0]  # the hung batch's 4 items
    assert rows[1]["reward/errors"] >= 4.0
    assert len(srv.seen) == 6  # 8 responses a step in batches of 4
    hung, others = rows[1], [rows[0], rows[2]]
    # the reward wait (the service runs beside the log-prob passes) ends by the deadline, and the step takes
    # no longer than a step without the hang (with room for a loaded machine's spread) plus the deadline
    assert hung["timing/reward"] < timeout_s + 1.0, hung
    assert hung["timing/all"] < 1.5 * max(r["timing/all"] for r in others) + timeout_s + 1.0, \
        [r["timing/all"] for r in rows]
    assert all("reward/remote/mean" in r for r in rows)
    for path in Path(run).rglob("*"):  # not in config.yaml, logs, dumps, checkpoints
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert "VERIRL_TEST_TRAIN_KEY" in (run / "config.yaml").read_text()  # the variable's name is
