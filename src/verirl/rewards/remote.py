"""Rewards over HTTP: a scoring server (``remote``) and an LLM judge behind an OpenAI-compatible chat
endpoint (``judge``), each a `verirl.rewards.service.Service`.

``remote`` POSTs ``{"items": [{"prompt", "response", "label", "task", ...the sample's JSON-able
columns}]}`` in batches of ``batch_size`` and reads ``{"scores": [number or null, ...]}``, one per item.
``judge`` POSTs one ``{url}/chat/completions`` request per sample, its user message the template filled
in, and parses the reply's ``choices[0].message.content`` (`PARSERS`).

Both keep one deadline per ``score`` call, ``timeout_s`` from its start, retries included: each request's
socket timeout is the time left; a 5xx, a 429, a refused or dropped connection or a socket timeout is
retried after ``backoff_s * 2**k`` seconds (plus up to a quarter more, at random; at least a 429's
Retry-After), unless that wait would pass the deadline; any other 4xx is not retried. At most
``max_concurrency`` requests are in flight, on daemon threads (a server cannot hold up the process's
exit). At the deadline the requests still running are abandoned: their sockets are shut down, which ends
a read that a hanging or trickling server would otherwise keep going, and ``score`` returns by the
deadline plus `MARGIN_S`, with the call's threads ended. What was not scored is (None, why), counted in
``reward/remote/errors`` (items); a reply that cannot be read (too deep, a number too large for a float,
anything that raises) is one of those, never an exception out of ``score``.

The key is read once, at build, from the environment variable ``api_key_env`` names (surrounding
whitespace removed; a key with any other character outside printable ASCII is refused), and sent as
``Authorization: Bearer <key>``; it is in no error text (replaced by ``<key>`` before a text is cut), no
`outstanding` line and no ``repr``. Redirects are not followed (a 3xx is an error naming where it
pointed), so the key goes to the configured address only. URLs are shown without user info, query or
fragment.

Only the standard library (urllib, json, threads): a step makes a few POSTs; requests, httpx or aiohttp
would add a dependency and nothing this needs.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
import socket
import string
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from functools import partial
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from typing import Any, Callable, Optional, Sequence

from verirl.config.schema import JUDGE_PARSERS
from verirl.core.errors import ConfigError
from verirl.rewards.service import Scores, ServiceScores

ERRORS = "reward/remote/errors"  # items a remote or judge call could not score
MARGIN_S = 0.25  # how long past its deadline `score` waits for the threads of abandoned requests to end
JOB = Callable[[float, threading.Event], Scores]  # (deadline, stop) -> the scores of the job's items
BODY_BYTES = 1 << 16  # the most of an error body read; an excerpt is cut from it


def read_key(var: Optional[str], key: str) -> Optional[str]:
    """The value of the environment variable ``var`` (None when ``var`` is not given); ``key`` is the
    config key that names it."""
    if not var:
        return None
    value = os.environ.get(var, "").strip()
    if not value:
        raise ConfigError(f"{key}={var!r} names an environment variable that is not set (or empty): export "
                          f"{var}=<the key> before the run (the key itself is never put in a config).")
    bad = next(((i, c) for i, c in enumerate(value) if not "!" <= c <= "~"), None)
    if bad:  # it would be refused as a header value, in an error text that holds the whole key
        i, c = bad
        what = "a space" if c == " " else "a control character" if c.isspace() or ord(c) < 32 or ord(c) == 127 \
            else "a character outside ASCII"
        raise ConfigError(f"${var} (named by {key}) holds {what} at position {i + 1} of {len(value)}: a key is "
                          f"printable ASCII without spaces; write the key alone into the variable (a key file "
                          f"saved with CRLF line ends: remove the CR).")
    return value


def public_url(url: str) -> str:
    """``url`` as scheme://host[:port]/path: without user info, query and fragment (what may hold a secret)."""
    p = urllib.parse.urlsplit(url)
    host = p.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = f":{p.port}" if p.port else ""
    except ValueError:
        port = ""
    return f"{p.scheme}://{host}{port}{p.path}"


def _check_url(url: Optional[str], key: str) -> str:
    if not url or urllib.parse.urlsplit(str(url)).scheme not in ("http", "https") \
            or not urllib.parse.urlsplit(str(url)).hostname:
        raise ConfigError(f"{key}={public_url(str(url)) if url else url!r} is not an http:// or https:// URL: give "
                          f"the server's address, e.g. {key}=http://127.0.0.1:8000"
                          f"{'/v1' if 'judge' in key else '/score'}.")
    return str(url)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 3xx reaches `_Client` as an HTTPError: the key is never sent to another address


class _Tracked:
    """A connection that hands its socket, once connected, to ``on_sock`` (so that it can be shut down)."""

    def __init__(self, *args, on_sock: Callable[[socket.socket], None], **kwargs):
        super().__init__(*args, **kwargs)
        self.on_sock = on_sock

    def connect(self) -> None:
        super().connect()
        self.on_sock(self.sock)


class _TrackedHTTP(_Tracked, HTTPConnection):
    pass


class _TrackedHTTPS(_Tracked, HTTPSConnection):
    pass


class _Open:
    """urllib's HTTP(S) handler with connections that report their sockets to the request's ``on_sock``."""

    def do_open(self, http_class, req, **kwargs):
        tracked = _TrackedHTTPS if issubclass(http_class, HTTPSConnection) else _TrackedHTTP
        return super().do_open(partial(tracked, on_sock=req.on_sock), req, **kwargs)


class _HTTPHandler(_Open, urllib.request.HTTPHandler):
    pass


class _HTTPSHandler(_Open, urllib.request.HTTPSHandler):
    pass


_OPENER = urllib.request.build_opener(_NoRedirect, _HTTPHandler, _HTTPSHandler)


def _shut(sock: socket.socket) -> None:
    """Ends the reads and writes on ``sock`` (a thread blocked in one returns at once)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's: a TLS socket's state is left alone
    except OSError:
        pass  # already closed


class _Failure(Exception):
    """A request that will not be retried: ``why`` says what happened."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class _Retry(_Failure):
    """A request worth retrying (5xx, 429, connection error, timeout); ``after``: a 429's Retry-After, s."""

    def __init__(self, why: str, after: float = 0.0):
        super().__init__(why)
        self.after = after


def _retry_after(headers) -> float:
    try:
        return max(0.0, float((headers or {}).get("Retry-After", 0)))
    except (TypeError, ValueError):
        return 0.0  # an HTTP date: the backoff decides


class _Client:
    """JSON POSTs to one URL under a call's deadline, with retries, ``max_concurrency`` at once;
    `outstanding` lists the requests in flight."""

    def __init__(self, name: str, url: str, key: Optional[str], key_var: Optional[str], max_concurrency: int,
                 retries: int, backoff_s: float):
        self.name, self.url, self.where = name, url, public_url(url)
        self._key, self._key_var = key, key_var
        self._keys = sorted({key, json.dumps(key)[1:-1]}, key=len, reverse=True) if key else []  # as sent, in JSON
        self.max_concurrency, self.retries, self.backoff_s = int(max_concurrency), int(retries), float(backoff_s)
        self._lock = threading.Lock()
        self._flight: dict[int, tuple[float, int, int]] = {}  # request id -> (started, items, try)
        self._calls: dict[threading.Event, set[socket.socket]] = {}  # a running call's stop -> its open sockets
        self._ids = 0

    def __repr__(self) -> str:
        return f"_Client({self.name!r}, {self.where!r})"

    def redact(self, text: str) -> str:
        for k in self._keys:
            text = text.replace(k, "<key>")
        return text

    def excerpt(self, raw: bytes, n: int = 200) -> str:
        """The first ``n`` characters of a reply's body, whitespace runs as one space, the key replaced
        before the cut (a key cut off at the end of what was read is replaced too)."""
        text = self.redact(raw[:BODY_BYTES].decode("utf-8", "replace"))
        if self._key and len(raw) > BODY_BYTES:
            k = next((k for k in range(len(self._key) - 1, 0, -1) if text.endswith(self._key[:k])), 0)
            text = text[:len(text) - k] + ("<key>" if k else "")
        return " ".join(text.split())[:n]

    def outstanding(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            flight = sorted(self._flight.values())
        return [f"reward '{self.name}': POST {self.where} in flight for {now - t0:.1f} s ({n} item(s), try {k + 1})"
                for t0, n, k in flight]

    def run(self, jobs: Sequence[tuple[int, JOB]], timeout_s: float) -> Scores:
        """Each job's scores (a job: its item count and its function), ``max_concurrency`` jobs at once on
        daemon threads, all under one deadline ``timeout_s`` from now; a job that failed, raised or did not
        finish by then scores (None, why) for each of its items. At the deadline the sockets of the
        requests still open are shut down; returns by the deadline plus `MARGIN_S`."""
        deadline = time.monotonic() + timeout_s
        stop, done = threading.Event(), threading.Condition()
        results: list[Optional[Scores]] = [None] * len(jobs)
        todo = list(range(len(jobs)))[::-1]

        def work() -> None:
            while True:
                with done:
                    if stop.is_set() or not todo:
                        return
                    i = todo.pop()
                n, job = jobs[i]
                try:
                    res = job(deadline, stop)
                    if len(res) != n:
                        raise _Failure(f"{len(res)} scores for {n} items")
                except _Failure as e:
                    res = [(None, e.why)] * n
                except Exception as e:  # noqa: BLE001 - a reply this module did not foresee: its items, not the step
                    res = [(None, f"the reply from {self.where} could not be scored: {type(e).__name__}: "
                                  f"{self.excerpt(str(e).encode())}")] * n
                with done:
                    if not stop.is_set():
                        results[i] = res
                        done.notify_all()

        with self._lock:
            self._calls[stop] = set()
        threads = [threading.Thread(target=work, name=f"verirl-{self.name}", daemon=True)
                   for _ in range(min(self.max_concurrency, len(jobs)))]
        try:
            for t in threads:
                t.start()
            with done:
                done.wait_for(lambda: all(r is not None for r in results), max(0.0, deadline - time.monotonic()))
                stop.set()  # an abandoned job sends no further request, and its result is not taken
        finally:
            stop.set()
            with self._lock:
                socks = self._calls.pop(stop, set())
            for sock in socks:
                _shut(sock)
        for t in threads:
            t.join(max(0.0, deadline + MARGIN_S - time.monotonic()))
        late = [(None, f"no reply from {self.where} within timeout_s={timeout_s:g} s")]
        return [(s, self.redact(why)) for (n, _), res in zip(jobs, results) for s, why in (res or late * n)]

    def close(self) -> None:
        """Ends the running calls: no further request, their open sockets shut down."""
        with self._lock:
            calls, self._calls = self._calls, {}
        for stop, socks in calls.items():
            stop.set()
            for sock in socks:
                _shut(sock)

    def post(self, payload: dict, deadline: float, stop: threading.Event, items: int) -> Any:
        """The reply's JSON, or `_Failure` after the retries the deadline allows."""
        data = json.dumps(payload, allow_nan=False).encode()
        why = ""
        for k in range(self.retries + 1):
            left = deadline - time.monotonic()
            if stop.is_set() or left <= 0:
                raise _Failure(f"no reply from {self.where} within the deadline" + (f" (the last try: {why})"
                                                                                     if why else ""))
            try:
                return self._once(data, deadline, stop, items, k)
            except _Retry as e:
                why = e.why
                if k == self.retries:
                    break
                pause = max(self.backoff_s * 2 ** k * (1 + 0.25 * random.random()), e.after)
                if time.monotonic() + pause >= deadline:
                    raise _Failure(f"{why}; no time left before the deadline for retry {k + 1}") from None
                if stop.wait(pause):
                    raise _Failure(f"{why}; the call ended before retry {k + 1}") from None
        raise _Failure(f"{why} (tries: {self.retries + 1})")

    def _read(self, resp, deadline: float, stop: threading.Event, cap: Optional[int] = None) -> bytes:
        """The body of ``resp`` (its first ``cap`` bytes and one more), read a chunk at a time so that a
        trickling server is given up on at the deadline."""
        chunks, got = [], 0
        while cap is None or got <= cap:
            if stop.is_set() or time.monotonic() > deadline:
                raise _Failure(f"no reply from {self.where} within the deadline (the body came too slowly)")
            chunk = resp.read1(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _once(self, data: bytes, deadline: float, stop: threading.Event, items: int, k: int) -> Any:
        req = urllib.request.Request(self.url, data=data, method="POST", headers={
            "Content-Type": "application/json", "Accept": "application/json", "User-Agent": "verirl"})
        if self._key:
            req.add_unredirected_header("Authorization", f"Bearer {self._key}")
        left = deadline - time.monotonic()
        opened: list[socket.socket] = []

        def on_sock(sock: socket.socket) -> None:  # shut down at the deadline or at close(), whichever is first
            with self._lock:
                socks = self._calls.get(stop)
                if socks is not None:
                    socks.add(sock)
            opened.append(sock)
            if socks is None:
                _shut(sock)
        req.on_sock = on_sock
        with self._lock:
            self._ids += 1
            rid = self._ids
            self._flight[rid] = (time.monotonic(), items, k)
        try:
            with _OPENER.open(req, timeout=left) as resp:
                raw = self._read(resp, deadline, stop)
        except urllib.error.HTTPError as e:
            try:
                body = self.excerpt(self._read(e, deadline, stop, BODY_BYTES))
            except (OSError, HTTPException, _Failure):
                body = ""
            said = f"HTTP {e.code} from {self.where}" + (f": {body}" if body else "")
            if e.code == 429 or e.code >= 500:
                raise _Retry(said, _retry_after(e.headers)) from None
            if 300 <= e.code < 400:
                to = public_url(urllib.parse.urljoin(self.url, (e.headers or {}).get("Location", "")))
                raise _Failure(f"HTTP {e.code} from {self.where}: a redirect to {to}, not followed (the key is sent "
                               f"to the configured address only); give the final URL") from None
            if e.code in (401, 403):
                said += (f" (check the key in ${self._key_var})" if self._key_var
                         else " (no key sent: name its environment variable in api_key_env)")
            raise _Failure(said) from None
        except (urllib.error.URLError, OSError, HTTPException) as e:  # refused, reset, timed out, unresolved
            reason = getattr(e, "reason", None) or e
            if isinstance(reason, TimeoutError):
                raise _Retry(f"no reply from {self.where} within the {left:.2f} s left (socket timeout)") from None
            raise _Retry(f"{self.where}: {type(reason).__name__}: {reason}") from None
        finally:
            with self._lock:
                self._flight.pop(rid, None)
                for sock in opened:
                    self._calls.get(stop, set()).discard(sock)
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            raise _Failure(f"{self.where} replied with something that is not JSON: {self.excerpt(raw)!r}") from None


def _score_value(v: Any) -> tuple[Optional[float], str]:
    if v is None:
        return None, "the server scored it null"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None, f"the server's score {str(v)[:80]!r} is not a number"
    try:
        f = float(v)
    except OverflowError:
        return None, f"the server's score, an integer of {v.bit_length()} bits, is beyond a float's range"
    if not math.isfinite(f):
        return None, f"the server's score {v!r} is not finite"
    return f, ""


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False


def _item(response: str, sample: dict) -> dict:
    item = {"prompt": sample.get("prompt"), "response": response, "label": sample.get("label"),
            "task": sample.get("task")}
    item.update({k: v for k, v in sample.items() if k not in item and isinstance(k, str) and _jsonable(v)})
    if not _jsonable(item["prompt"]):
        item["prompt"] = prompt_text(item["prompt"])
    return item


class RemoteService:
    """The rule ``remote``: a scoring server over HTTP (the module's docstring says the protocol)."""

    name = "remote"

    def __init__(self, cfg):
        url = _check_url(cfg.url, "reward.remote.url")
        self.batch_size, self.timeout_s = int(cfg.batch_size), float(cfg.timeout_s)
        self.client = _Client("remote", url, read_key(cfg.api_key_env, "reward.remote.api_key_env"),
                              cfg.api_key_env, cfg.max_concurrency, cfg.retries, cfg.backoff_s)

    def __repr__(self) -> str:
        return f"RemoteService({self.client.where!r})"

    def score(self, responses: Sequence[str], samples: Sequence[dict]) -> ServiceScores:
        jobs = []
        for a in range(0, len(responses), self.batch_size):
            items = [_item(r, s) for r, s in zip(responses[a:a + self.batch_size], samples[a:a + self.batch_size])]
            jobs.append((len(items), partial(self._batch, items)))
        scores = self.client.run(jobs, self.timeout_s)
        return ServiceScores(scores, {ERRORS: float(sum(s is None for s, _ in scores))})

    def _batch(self, items: list[dict], deadline: float, stop: threading.Event) -> Scores:
        reply = self.client.post({"items": items}, deadline, stop, len(items))
        got = reply.get("scores") if isinstance(reply, dict) else None
        if not isinstance(got, list) or len(got) != len(items):
            shape = (f"{len(got)} scores" if isinstance(got, list) else
                     f"keys {sorted(reply)[:8]}" if isinstance(reply, dict) else type(reply).__name__)
            raise _Failure(f"{self.client.where} replied with {shape}; expected {{\"scores\": [...]}} with "
                           f"{len(items)} entries, one per item")
        return [_score_value(v) for v in got]

    def outstanding(self) -> list[str]:
        return self.client.outstanding()

    def close(self) -> None:
        self.client.close()


# ---- the judge

def prompt_text(prompt: Any) -> str:
    """A sample's prompt as text: a str as it is; chat messages' contents joined by blank lines."""
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    parts = []
    for m in prompt:
        c = m.get("content", "") if isinstance(m, dict) else m
        if isinstance(c, list):  # content parts: their text
            c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
        parts.append(str(c))
    return "\n\n".join(parts)


_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\s*\{([^{}]*)\}")


def _tail(text: str) -> str:
    return repr(text[-120:]) if len(text) <= 120 else repr("..." + text[-120:])


def parse_yes_no(text: str, scale: float = 1.0) -> tuple[Optional[float], str]:
    """1 when the reply's last yes/no word is yes, 0 when no."""
    words = _YES_NO.findall(text)
    if not words:
        return None, f"the judge's reply has no yes or no word: {_tail(text)}"
    return (1.0 if words[-1].lower() == "yes" else 0.0), ""


def _number(text: str, scale: float, what: str) -> tuple[Optional[float], str]:
    v = float(text)
    if not math.isfinite(v):
        return None, f"the judge's {what} {text!r} is not finite"
    return v / scale, ""


def parse_number(text: str, scale: float = 1.0) -> tuple[Optional[float], str]:
    """The reply's last number, divided by ``scale``."""
    found = _NUMBER.findall(text)
    if not found:
        return None, f"the judge's reply has no number: {_tail(text)}"
    return _number(found[-1], scale, "number")


def parse_boxed(text: str, scale: float = 1.0) -> tuple[Optional[float], str]:
    """The number in the reply's last \\boxed{}, divided by ``scale``."""
    found = _BOXED.findall(text)
    if not found:
        return None, f"the judge's reply has no \\boxed{{}}: {_tail(text)}"
    inner = found[-1].strip().strip("$").strip()
    if not _NUMBER.fullmatch(inner):
        return None, f"the judge's reply's last \\boxed{{}} holds {inner[:60]!r}, not a number"
    return _number(inner, scale, "\\boxed{} number")


PARSERS: dict[str, Callable[[str, float], tuple[Optional[float], str]]] = {
    "number": parse_number, "yes_no": parse_yes_no, "boxed": parse_boxed}  # the names of JUDGE_PARSERS


def load_template(template: str, key: str = "reward.judge.template") -> tuple[str, frozenset[str]]:
    """The template's text (read from the file when ``template`` is a path to a .txt file) and the names
    of its fields; a field that is not a plain name or a malformed brace raises `ConfigError`."""
    text = template
    if template.strip().endswith(".txt") and "\n" not in template.strip() and "{" not in template:
        path = os.path.expanduser(template.strip())
        if not os.path.isfile(path):
            raise ConfigError(f"{key}={template!r} looks like a file, but there is none: give the path of a .txt "
                              f"file that exists, or the template's text itself.")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        key = f"{key} (the file {template.strip()})"
    names = set()
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError as e:
        raise ConfigError(f"{key} is not a valid template ({e}): write a literal brace as {{{{ or }}}}.") from None
    for _, field, spec, _ in fields:
        if field is None:
            continue
        if not field.isidentifier() or "{" in (spec or ""):
            raise ConfigError(f"{key}: the field {{{field}{':' + spec if spec else ''}}} is not a plain name: use "
                              f"{{prompt}}, {{response}}, {{label}}, {{task}} or a column's name (write a literal "
                              f"brace as {{{{ or }}}}).")
        names.add(field)
    return text, frozenset(names)


def chat_url(url: str) -> str:
    """The chat completions address of an OpenAI-compatible base URL (.../v1); a URL that already ends in
    /chat/completions as it is."""
    base = url.rstrip("/")
    return base if base.endswith("/chat/completions") else f"{base}/chat/completions"


class JudgeService:
    """The rule ``judge``: an LLM judge behind an OpenAI-compatible chat endpoint, one request per sample,
    its reply parsed into a score (`PARSERS`)."""

    name = "judge"

    def __init__(self, cfg):
        url = _check_url(cfg.url, "reward.judge.url")
        if not cfg.model:
            raise ConfigError("reward.judge.model is not set: name the model the judge's server serves (what its "
                              "/v1/models lists).")
        JUDGE_PARSERS.check(cfg.parse)
        self.model, self.system, self.parse = str(cfg.model), cfg.system, PARSERS[cfg.parse]
        self.parse_name, self.scale = cfg.parse, float(cfg.scale)
        self.max_tokens, self.temperature, self.timeout_s = int(cfg.max_tokens), float(cfg.temperature), \
            float(cfg.timeout_s)
        self.template, self.fields = load_template(cfg.template)
        self.client = _Client("judge", chat_url(url), read_key(cfg.api_key_env, "reward.judge.api_key_env"),
                              cfg.api_key_env, cfg.max_concurrency, cfg.retries, cfg.backoff_s)

    def __repr__(self) -> str:
        return f"JudgeService({self.client.where!r}, model={self.model!r})"

    def message(self, response: str, sample: dict) -> str:
        """The user message for one sample: the template with its fields filled (a response's braces stay
        as they are); `ValueError` saying why when the sample lacks a field or a format spec fails on its
        value."""
        values = {**sample, "prompt": prompt_text(sample.get("prompt")), "response": response,
                  "label": sample.get("label", ""), "task": sample.get("task", "")}
        missing = sorted(self.fields - values.keys())
        if missing:
            raise ValueError(f"reward.judge.template names {', '.join('{' + m + '}' for m in missing)}, which this "
                             f"sample (task {sample.get('task')!r}) does not have; its columns: "
                             f"{', '.join(sorted(map(str, values)))}. Use one of those, or route the judge to the "
                             f"tasks that have it (reward.tasks).")
        try:
            return self.template.format_map(values)
        except (ValueError, TypeError) as e:
            raise ValueError(f"reward.judge.template could not be filled in for this sample (task "
                             f"{sample.get('task')!r}): {e}; check the format specs after ':' in its "
                             f"fields.") from None

    def request(self, response: str, sample: dict) -> dict:
        """The chat completions request for one sample (`ValueError` as `message`)."""
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + \
            [{"role": "user", "content": self.message(response, sample)}]
        return {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                "temperature": self.temperature}

    def score(self, responses: Sequence[str], samples: Sequence[dict]) -> ServiceScores:
        scores: Scores = [(None, "")] * len(responses)
        jobs, where = [], []
        for i, (r, s) in enumerate(zip(responses, samples)):
            try:
                jobs.append((1, partial(self._one, self.request(r, s))))
                where.append(i)
            except ValueError as e:  # a sample the template does not fit: that sample, not the run
                scores[i] = (None, str(e))
        for i, got in zip(where, self.client.run(jobs, self.timeout_s)):
            scores[i] = got
        return ServiceScores(scores, {ERRORS: float(sum(s is None for s, _ in scores))})

    def _one(self, body: dict, deadline: float, stop: threading.Event) -> Scores:
        reply = self.client.post(body, deadline, stop, 1)
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise _Failure(f"{self.client.where} replied without choices[0].message.content: "
                           f"{self.client.excerpt(json.dumps(reply).encode())!r}") from None
        if not isinstance(content, str):
            raise _Failure(f"{self.client.where} replied with content {type(content).__name__}, not text")
        return [self.parse(content, self.scale)]

    def outstanding(self) -> list[str]:
        return self.client.outstanding()

    def close(self) -> None:
        self.client.close()
