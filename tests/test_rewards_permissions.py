"""What a reward rule may be, `plan` reading a rule file without running it, and a rule's processes
ending with its call."""
import os
import textwrap
import time

import pytest

from verirl.core.errors import ConfigError
from verirl.rewards import Scorer, check_reference, load_rule


def write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.mark.parametrize("spec", ["os:system", "subprocess:getoutput", "builtins:eval", "json:loads",
                                  "os.path:exists"])
def test_standard_library_functions_are_not_rules(spec):
    for check in (load_rule, check_reference):
        with pytest.raises(ConfigError, match="standard library"):
            check(spec)


def test_a_rule_is_a_plain_function(tmp_path):
    rules = write(tmp_path, "kinds.py", """
        from math import sqrt
        class Rule:
            def __call__(self, response, label):
                return 1.0
        instance = Rule()
        async def later(response, label):
            return 1.0
        def fine(response, label):
            return 1.0
    """)
    with pytest.raises(ConfigError, match="'Rule' in .* is a class, not a plain Python function"):
        load_rule(f"{rules}:Rule")
    with pytest.raises(ConfigError, match="is a C builtin"):
        load_rule(f"{rules}:sqrt")
    with pytest.raises(ConfigError, match="not a plain Python function"):
        load_rule(f"{rules}:instance")
    with pytest.raises(ConfigError, match="is a class"):
        check_reference(f"{rules}:Rule")
    with pytest.raises(ConfigError, match="async"):
        check_reference(f"{rules}:later")
    assert load_rule(f"{rules}:fine").name == check_reference(f"{rules}:fine") == "fine"


def test_plan_reads_a_rule_file_without_running_it(tmp_path):
    from verirl.run.checks import check
    from verirl.config import load_config
    from verirl.tools.plan import make_plan

    marker = tmp_path / "ran"
    rules = write(tmp_path, "side_effects.py", f"""
        open({str(marker)!r}, "w").write("the top level ran")
        def score(response, label):
            return 1.0
    """)
    cfg = load_config(None, [f"reward.verifiers=[acc,{rules}:score]", "reward.weights=[1,1]",
                             f"trainer.run_dir={tmp_path / 'run'}"])
    make_plan(cfg)
    assert not marker.exists()
    with pytest.raises(ConfigError, match="has no function 'other'"):
        check(load_config(None, [f"reward.verifiers=[{rules}:other]", "reward.weights=[1]"]), import_rules=False)
    broken = write(tmp_path, "broken.py", "def score(response, label)\n    return 1.0\n")
    with pytest.raises(ConfigError, match="line 1"):
        check_reference(f"{broken}:score")
    check(cfg)  # training's checks import it, before anything is written: then the top level runs
    assert marker.exists()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="child clean-up is Linux only")
def test_a_rules_processes_end_with_its_call(tmp_path):
    pids = tmp_path / "pids"
    rules = write(tmp_path, "spawner.py", f"""
        import os, subprocess, time
        def note(pid):
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{pid}}\\n")
        def spawn(response, label):
            note(subprocess.Popen(["sleep", "300"], start_new_session=True).pid)
            child = os.fork()
            if child == 0:  # a daemon: fork again and let the middle process exit
                if os.fork() == 0:
                    note(os.getpid())
                    time.sleep(300)
                os._exit(0)
            os.waitpid(child, 0)
            if "hang" in response:
                note(subprocess.Popen(["sleep", "300"]).pid)
                time.sleep(300)
            return 1.0
    """)
    s = Scorer([f"{rules}:spawn"], [1.0], workers=1, timeout=3.0, chunk=1)
    try:
        res = s(["a", "hang"], [{"label": "1"}] * 2)
        assert res.per_rule["spawn"] == [1.0, 0.0] and res.errors == 1  # the second ran out of time
        # the daemon grandchild notes its pid as its parent exits; the pool may kill it first (then 4 noted):
        # wait a moment for a late note, so that a grandchild that survived is among those checked below
        settle = time.monotonic() + 3
        while len(pids.read_text().split()) < 5 and time.monotonic() < settle:
            time.sleep(0.05)
        deadline = time.monotonic() + 10
        left = [int(p) for p in pids.read_text().split()]
        assert len(left) in (4, 5)
        while any(_alive(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in left if _alive(p)]
    finally:
        s.close()
