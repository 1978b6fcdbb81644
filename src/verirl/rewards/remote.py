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
``max_concurrency`` requests are in flight. ``score`` returns by the deadline plus `MARGIN_S` whatever a
server does: a request still running then is abandoned (its thread ends at its socket timeout, and
sends no retry). What was not scored is (None, why), counted in ``reward/remote/errors`` (items).

The key is read once, at build, from the environment variable ``api_key_env`` names, and sent as
``Authorization: Bearer <key>``; it is in no error text (replaced by ``<key>``), no `outstanding` line and
no ``repr``. Redirects are not followed (a 3xx is an error naming where it pointed), so the key goes to
the configured address only. URLs are shown without user info, query or fragment.

Only the standard library (urllib, json, threads): a step makes a few POSTs; requests, httpx or aiohttp
would add a dependency and nothing this needs.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
import string
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from http.client import HTTPException
from typing import Any, Callable, Optional, Sequence

from verirl.config.schema import JUDGE_PARSERS
from verirl.core.errors import ConfigError
from verirl.rewards.service import Scores, ServiceScores

ERRORS = "reward/remote/errors"  # items a remote or judge call could not score
MARGIN_S = 0.25  # how long past its deadline `score` waits for requests that end at their socket timeout
JOB = Callable[[float, threading.Event], Scores]  # (deadline, stop) -> the scores of the job's items


def read_key(var: Optional[str], key: str) -> Optional[str]:
    """The value of the environment variable ``var`` (None when ``var`` is not given); ``key`` is the
    config key that names it."""
    if not var:
        return None
    value = os.environ.get(var)
    if not value:
        raise ConfigError(f"{key}={var!r} names an environment variable that is not set: export {var}=<the key> "
                          f"before the run (the key itself is never put in a config).")
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


_OPENER = urllib.request.build_opener(_NoRedirect)


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


def _excerpt(raw: bytes, n: int = 200) -> str:
    text = raw[:4 * n].decode("utf-8", "replace")
    return " ".join(text.split())[:n]


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
        self.max_concurrency, self.retries, self.backoff_s = int(max_concurrency), int(retries), float(backoff_s)
        self._lock = threading.Lock()
        self._flight: dict[int, tuple[float, int, int]] = {}  # request id -> (started, items, try)
        self._calls: set[threading.Event] = set()  # the stop events of the calls running now
        self._ids = 0

    def __repr__(self) -> str:
        return f"_Client({self.name!r}, {self.where!r})"

    def redact(self, text: str) -> str:
        return text.replace(self._key, "<key>") if self._key else text

    def outstanding(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            flight = sorted(self._flight.values())
        return [f"reward '{self.name}': POST {self.where} in flight for {now - t0:.1f} s ({n} item(s), try {k + 1})"
                for t0, n, k in flight]

    def run(self, jobs: Sequence[tuple[int, JOB]], timeout_s: float) -> Scores:
        """Each job's scores (a job: its item count and its function), ``max_concurrency`` jobs at once,
        all under one deadline ``timeout_s`` from now; a job that failed or did not finish by then scores
        (None, why) for each of its items. Returns by the deadline plus `MARGIN_S`."""
        deadline = time.monotonic() + timeout_s
        stop = threading.Event()
        pool = ThreadPoolExecutor(max(1, min(self.max_concurrency, len(jobs))), thread_name_prefix=f"verirl-{self.name}")
        with self._lock:
            self._calls.add(stop)
        try:
            futures: list[Future] = [pool.submit(job, deadline, stop) for _, job in jobs]
            wait(futures, timeout=max(0.0, deadline - time.monotonic()) + MARGIN_S)
        finally:
            stop.set()  # an abandoned job sends no further request
            pool.shutdown(wait=False, cancel_futures=True)
            with self._lock:
                self._calls.discard(stop)
        out: Scores = []
        for (n, _), f in zip(jobs, futures):
            if not f.done() or f.cancelled():
                res = [(None, f"no reply from {self.where} within timeout_s={timeout_s:g} s")] * n
            elif isinstance(f.exception(), _Failure):
                res = [(None, f.exception().why)] * n
            else:
                res = f.result()  # another exception is a bug in this module: it says so
                assert len(res) == n, (len(res), n)
            out.extend((s, self.redact(why)) for s, why in res)
        return out

    def close(self) -> None:
        with self._lock:
            for stop in self._calls:
                stop.set()

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
                return self._once(data, left, items, k)
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

    def _once(self, data: bytes, left: float, items: int, k: int) -> Any:
        req = urllib.request.Request(self.url, data=data, method="POST", headers={
            "Content-Type": "application/json", "Accept": "application/json", "User-Agent": "verirl"})
        if self._key:
            req.add_unredirected_header("Authorization", f"Bearer {self._key}")
        with self._lock:
            self._ids += 1
            rid = self._ids
            self._flight[rid] = (time.monotonic(), items, k)
        try:
            with _OPENER.open(req, timeout=left) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            try:
                body = _excerpt(e.read())
            except (OSError, HTTPException):
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
        try:
            return json.loads(raw)
        except ValueError:
            raise _Failure(f"{self.where} replied with something that is not JSON: {_excerpt(raw)!r}") from None


def _score_value(v: Any) -> tuple[Optional[float], str]:
    if v is None:
        return None, "the server scored it null"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None, f"the server's score {str(v)[:80]!r} is not a number"
    if not math.isfinite(v):
        return None, f"the server's score {v!r} is not finite"
    return float(v), ""


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
        as they are)."""
        values = {**sample, "prompt": prompt_text(sample.get("prompt")), "response": response,
                  "label": sample.get("label", ""), "task": sample.get("task", "")}
        missing = sorted(self.fields - values.keys())
        if missing:
            raise ConfigError(f"reward.judge.template names {', '.join('{' + m + '}' for m in missing)}, which a "
                              f"sample of task {sample.get('task')!r} does not have (its columns: "
                              f"{', '.join(sorted(map(str, values)))}). Use one of those, or route the judge to "
                              f"the tasks that have it (reward.tasks).")
        try:
            return self.template.format_map(values)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"reward.judge.template could not be filled in ({e}): check the format specs "
                              f"after ':' in its fields.") from None

    def request(self, response: str, sample: dict) -> dict:
        """The chat completions request for one sample."""
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + \
            [{"role": "user", "content": self.message(response, sample)}]
        return {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                "temperature": self.temperature}

    def score(self, responses: Sequence[str], samples: Sequence[dict]) -> ServiceScores:
        jobs = [(1, partial(self._one, self.request(r, s))) for r, s in zip(responses, samples)]
        scores = self.client.run(jobs, self.timeout_s)
        return ServiceScores(scores, {ERRORS: float(sum(s is None for s, _ in scores))})

    def _one(self, body: dict, deadline: float, stop: threading.Event) -> Scores:
        reply = self.client.post(body, deadline, stop, 1)
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise _Failure(f"{self.client.where} replied without choices[0].message.content: "
                           f"{_excerpt(json.dumps(reply).encode())!r}") from None
        if not isinstance(content, str):
            raise _Failure(f"{self.client.where} replied with content {type(content).__name__}, not text")
        return [self.parse(content, self.scale)]

    def outstanding(self) -> list[str]:
        return self.client.outstanding()

    def close(self) -> None:
        self.client.close()
