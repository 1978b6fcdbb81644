"""`verirl report`: the figures and the HTML page of real tiny runs, two runs overlaid, a run directory
written by hand (only some metrics, no config / summary / rollouts), the errors a user can fix, and
the page opened in headless Chromium (no console errors, a screenshot next to the report).

Two 4-step runs of the tiny recipe are shared by the module (a second or two of CPU each)."""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from verirl.cli import main
from verirl.tools.report import build
from verirl.tools.report.figures import HEIGHT, NAMES, WIDTH, make_figures
from verirl.tools.report.runs import evenly_spaced, load, names

STEPS = 4
FAST = ["data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=4", "rollout.max_new_tokens=16",
        "eval.size=8", "log.progress=false", "log.console_every=0", "reward.workers=0", "trainer.save_freq=0",
        "trainer.threads=1", "trainer.dump_rollouts=true", f"trainer.total_steps={STEPS}",
        "data.train_size=32"]  # 16 prompts used; the default 20000 takes seconds to tokenize
# what every tiny run logs (filter_mismatch depends on the algorithm's options, so it is not required)
EXPECTED = {"reward", "reward_rules", "reward_tasks", "response_length", "actor", "timing", "throughput",
            "validation"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report")
    out = {}
    for name, extra in [("base", []), ("lr10", ["actor.lr=7e-4"])]:
        out[name] = root / name
        assert main(["train", f"trainer.run_dir={out[name]}", *FAST, *extra]) == 0
    return out


@pytest.fixture(scope="module")
def single(runs) -> Path:
    """The report of one run, where it goes by default: RUN_DIR/report/index.html."""
    page = build([str(runs["base"])])
    assert page == runs["base"] / "report" / "index.html"
    return page


def _png(path: Path) -> tuple[int, int, dict[str, str]]:
    """(width, height, text chunks) of a PNG, read from its chunks (IHDR first, by the format)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, size, text = 8, None, {}
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            text[key.decode("latin-1")] = value.decode("latin-1")
        pos += 12 + length
    assert size is not None
    return size[0], size[1], text


def _srcs(html: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', html)


# --- one run ------------------------------------------------------------------------------------

def test_figures_are_pngs_of_the_fixed_size(single):
    pngs = {p.stem for p in single.parent.glob("*.png") if p.name != "screenshot.png"}  # the browser test's
    assert EXPECTED <= pngs <= set(NAMES), pngs
    for name in pngs:
        path = single.parent / f"{name}.png"
        width, height, text = _png(path)
        assert (width, height) == (WIDTH, HEIGHT) == (800, 450), (name, width, height)
        import matplotlib.image

        pixels = matplotlib.image.imread(path)  # decodes: a real image, not just a header
        assert pixels.shape[:2] == (450, 800) and pixels.std() > 0.01, name  # not blank
        assert "runs: base" in text["Description"], text


def test_page_shows_figures_config_summary_and_samples(single, runs):
    html = single.read_text(encoding="utf-8")
    srcs = _srcs(html)
    assert sorted(srcs) == sorted(p.name for p in single.parent.glob("*.png")
                                  if p.name != "screenshot.png")  # each PNG, by relative path
    assert all((single.parent / s).is_file() for s in srcs)
    config = (runs["base"] / "config.yaml").read_text()
    assert "max_new_tokens: 16" in config and "max_new_tokens: 16" in html
    summary = json.loads((runs["base"] / "summary.json").read_text())
    assert "reward_first5" in html and "eval_start" in html and f">{summary['steps']}<" in html
    records = [json.loads(line) for line in (runs["base"] / "rollouts.jsonl").read_text().splitlines()]
    best = max((r for r in records if r["step"] == 1), key=lambda r: r["reward"])
    from html import escape
    assert escape(best["response"]) in html  # step 1's best response, escaped
    assert "<think>" not in html and "&lt;think&gt;" in html  # the model's tags are text, not markup
    assert "<|im_start|>" not in html and "&lt;|im_start|&gt;" in html
    for rule in best["scores"]:
        assert f"{rule}: " in html
    assert html.count("<h4>step ") == STEPS  # 4 logged steps, fewer than the default 10: all shown


def test_samples_are_capped_evenly(runs, tmp_path, capsys):
    assert main(["report", str(runs["base"]), "-o", str(tmp_path), "--samples", "2"]) == 0
    page = Path(capsys.readouterr().out.strip().splitlines()[-1])  # the page's path, printed last
    assert page == tmp_path / "index.html"
    steps = re.findall(r"<h4>step (\d+) ", page.read_text())
    assert steps == ["1", str(STEPS)]  # the first and the last
    assert evenly_spaced(list(range(1, 101)), 10) == [1, 12, 23, 34, 45, 56, 67, 78, 89, 100]
    assert evenly_spaced([3], 10) == [3] and evenly_spaced([1, 2, 3], 0) == []


# --- several runs -------------------------------------------------------------------------------

def test_two_runs_overlay(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(runs["base"]), str(runs["lr10"])]) == 0
    page = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert page == Path("report") / "index.html" and (tmp_path / page).is_file()  # ./report for several
    html = (tmp_path / page).read_text()
    for name in ("base", "lr10"):  # a section each
        assert f"<h2>{name}</h2>" in html
    assert html.count("<h3>Config</h3>") == 2 and html.count("<h3>Summary</h3>") == 2
    for src in _srcs(html):
        width, height, text = _png(tmp_path / "report" / src)
        assert (width, height) == (800, 450) and "runs: base, lr10" in text["Description"], (src, text)
    # the legends name both runs (one line per run, in each run's own colour)
    data = [load(str(runs[n]), n, 0) for n in ("base", "lr10")]
    charts = {c.name: c for c in make_figures(data)}
    for name in ("reward", "reward_rules", "actor", "validation"):
        legend = charts[name].figure.axes[0].get_legend()
        assert legend is not None and [t.get_text() for t in legend.get_texts()] == ["base", "lr10"], name
        colours = {line.get_color() for line in charts[name].figure.axes[0].get_lines()}
        assert colours == {"C0", "C1"}, (name, colours)
    assert [a.get_title() for a in charts["timing"].figure.axes] == ["base", "lr10"]  # stacked, a panel per run
    assert names(["x/a/run", "y/b/run"]) == ["a/run", "b/run"]  # two directories of one name told apart


# --- a run directory by hand --------------------------------------------------------------------

def test_what_exists_is_plotted_and_missing_files_are_said(tmp_path):
    run = tmp_path / "partial"
    run.mkdir()
    rows = [{"step": 0, "val/greedy_acc": 0.1, "val/pass@1": 0.2}]
    rows += [{"step": s, "reward/mean": (s % 7) / 7, "actor/entropy": 1.0 / s} for s in range(1, 61)]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 61, "reward/me'  # cut off by a kill
    (run / "metrics.jsonl").write_text(text)
    page = build([str(run)])
    assert sorted(p.stem for p in page.parent.glob("*.png")) == ["actor", "reward", "validation"]
    html = page.read_text()
    assert "Thin: each step; bold: the trailing mean of 3 steps." in html  # 60 steps: a window of 3
    assert "No config.yaml" in html and "No summary.json" in html and "trainer.dump_rollouts=true" in html
    assert "cut off" in html  # the last line's note
    data = load(str(run), "partial", 10)
    charts = {c.name: c for c in make_figures([data])}
    lines = charts["reward"].figure.axes[0].get_lines()
    assert [line.get_linewidth() for line in lines] == [0.8, 2.0]  # raw thin, moving average bold
    # a later report without a figure removes the earlier one's PNG, and references only its own
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:1]))
    page = build([str(run)])
    assert sorted(p.stem for p in page.parent.glob("*.png")) == ["validation"]
    assert _srcs(page.read_text()) == ["validation.png"]


def test_a_multi_turn_run_gets_its_figure_and_its_episodes_turn_by_turn(tmp_path):
    run = tmp_path / "agents"
    run.mkdir()
    rows = [{"step": s, "reward/mean": 0.1 * s, "turns/mean": 1.5 + 0.1 * s, "turns/max": 3.0,
             "tools/calls_mean": 0.5, "tools/errors": 1.0, "tools/parse_errors": 0.0, "tools/timeouts": 0.0,
             "response_length/model_tokens": 20.0, "response_length/total": 31.0, "timing/all": 1.0,
             "timing/rollout": 0.6, "timing/update": 0.3, "timing/tools": 0.2} for s in range(1, 5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    charts = {c.name: c for c in make_figures([load(str(run), "agents", 0)])}
    assert charts["agents"].metrics[-2:] == ["timing/tools", "timing/rollout"]  # the tools' time beside the rollout's
    assert charts["timing"].metrics == ["timing/all", "timing/rollout", "timing/update"]  # not stacked: within rollout
    turns = [{"role": "assistant", "text": "<tool_call>{\"name\": \"calculator\"}</tool_call>"},
             {"role": "observation", "text": "<tool_response>1528257</tool_response>"},
             {"role": "assistant", "text": "<answer>1528257</answer>"}]
    records = [{"step": 4, "prompt": "p", "response": "<answer>1528257</answer>", "label": "1528257", "task": "t",
                "scores": {"acc": r}, "reward": r, "response_length": 31, "stopped": True, "turns": turns}
               for r in (0.0, 1.0)]
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = build([str(run)])
    pngs = {p.stem for p in page.parent.glob("*.png")}
    assert "agents" in pngs and "async" not in pngs  # a synchronous run: no async/ keys, no figure of them
    html = page.read_text()
    assert "Multi-turn episodes" in html and "Asynchronous training" not in html
    assert html.count(">observation</div>") == 2 and "&lt;tool_response&gt;1528257" in html


def test_an_asynchronous_run_gets_its_figure_of_staleness_and_waits(tmp_path):
    run = tmp_path / "async"
    run.mkdir()
    rows = [{"step": s, "reward/mean": 0.1 * s, "async/staleness_mean": 0.5 * (s > 1),
             "async/staleness_max": float(s > 1), "async/queue_depth": 1.0 + (s > 1), "async/trainer_idle_s": 0.3 / s, "async/rollout_idle_s": 0.02,
             "async/weight_sync_s": 0.004} for s in range(1, 5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = build([str(run)])
    assert sorted(p.stem for p in page.parent.glob("*.png")) == ["async", "reward"]
    assert "Asynchronous training" in page.read_text()
    chart = {c.name: c for c in make_figures([load(str(run), "async", 0)])}["async"]
    assert chart.metrics == ["async/staleness_mean", "async/staleness_max", "async/queue_depth",
                             "async/trainer_idle_s", "async/rollout_idle_s", "async/weight_sync_s"]
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []
               for ax in chart.figure.axes]
    assert legends == [["mean", "max"], [], ["trainer idle", "rollout idle", "weight sync"]], legends
    _, _, text = _png(page.parent / "async.png")
    assert "async/staleness_max" in text["Description"] and "async/weight_sync_s" in text["Description"]


# --- errors a user can fix ----------------------------------------------------------------------

@pytest.mark.parametrize("case", ["missing", "no_metrics", "empty", "a_file"])
def test_user_errors_are_one_paragraph(case, tmp_path, capsys):
    target = tmp_path / "run"
    if case in ("no_metrics", "empty"):
        target.mkdir()
    if case == "empty":
        (target / "metrics.jsonl").write_text("\n")
    if case == "a_file":
        target.write_text("x")
    assert main(["report", str(target)]) == 2
    out, err = capsys.readouterr()
    err = err.strip()
    assert err.startswith("verirl report: error: ") and "\n" not in err and "Traceback" not in err, err
    assert str(target) in err and out == ""
    hint = {"missing": "no such run directory", "no_metrics": "has no metrics.jsonl", "empty": "is empty",
            "a_file": "is a file"}[case]
    assert hint in err, err
    assert not list(tmp_path.rglob("report"))  # nothing written


def test_a_folder_of_runs_names_them(runs, capsys):
    assert main(["report", str(runs["base"].parent)]) == 2
    err = capsys.readouterr().err
    assert "base" in err and "lr10" in err and "give one of those" in err, err


# --- the page in a browser ----------------------------------------------------------------------

# Chromium's --enable-logging=stderr writes every console message of the page as a line
# "[...:INFO:CONSOLE:<line>] "<message>", source: <url> (<line>)" (older builds: "CONSOLE(<line>)"),
# uncaught exceptions included ("Uncaught ReferenceError: ..."). That log puts every console level
# at INFO, so the level cannot be told from it; the report's page logs nothing unless something is
# wrong (its one script console.error()s a figure that did not load), so ANY console line is an
# error. The negative control below shows this route does catch one: a page whose PNG is missing.
# (The DevTools protocol would give levels, but needs a websocket client, which is not installed.)
CONSOLE = re.compile(r":CONSOLE[:(]\d+")


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("chromium not installed: apt-get install chromium")


def _open(browser: str, page: Path, shot: Path, profile: Path) -> list[str]:
    """Open ``page`` in headless Chromium, screenshot it; the console lines it logged."""
    proc = subprocess.run(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", f"--screenshot={shot}",
         "--window-size=1200,2000", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-3000:]
    return [line for line in proc.stderr.splitlines() if CONSOLE.search(line)]


def test_page_opens_in_chromium_without_console_errors(single, tmp_path):
    browser = _chromium()
    shot = single.parent / "screenshot.png"  # next to the report, to look at
    assert _open(browser, single, shot, tmp_path / "profile") == []
    assert _png(shot)[:2] == (1200, 2000)
    # negative control: the same page without one of its figures logs the error this test looks for
    moved = tmp_path / "moved"
    shutil.copytree(single.parent, moved)
    (moved / "reward.png").unlink()
    console = _open(browser, moved / "index.html", tmp_path / "broken.png", tmp_path / "profile")
    assert any("figure not loaded: reward.png" in line for line in console), console


def test_dollars_in_run_and_task_names_are_plain_text(tmp_path):
    """A `$` pair is no mathtext: a run or task named with dollars (and TeX that does not parse) is drawn
    as written."""
    dirs = [tmp_path / "cost $5 and $6", tmp_path / r"x$^{\nope$"]
    for run in dirs:
        run.mkdir()
        rows = [{"step": s, "reward/mean": s / 4, r"reward/task/$\frac{$/mean": s / 8, "reward/acc$/mean": 0.5}
                for s in range(1, 5)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = build([str(d) for d in dirs], out=str(tmp_path / "rep"))
    assert {"reward", "reward_tasks", "reward_rules"} <= {p.stem for p in page.parent.glob("*.png")}
    charts = {c.name: c for c in make_figures([load(str(d), d.name, 10) for d in dirs])}
    labels = [t.get_text() for t in charts["reward"].figure.axes[0].get_legend().get_texts()]
    assert labels == ["cost $5 and $6", r"x$^{\nope$"]
    assert charts["reward_tasks"].figure.axes[0].get_title() == r"$\frac{$"


def test_report_is_a_command_of_the_one_table(capsys):
    """`verirl report` is the report tool's own command in the CLI's one table of subcommands, which `verirl
    --help` lists in full, in its order."""
    import verirl.tools.report as report
    from verirl.cli import commands

    assert commands()["report"].run is report.run and commands()["report"].help == report.HELP
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = re.search(r"\{([a-z,-]+)\}", capsys.readouterr().out).group(1).split(",")
    assert listed == list(commands()) and {"train", "eval", "convert-config", "report"} <= set(listed)
