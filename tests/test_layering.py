"""Which parts of verirl may import which: read from the source with `ast`, nothing is imported.

Every import of verirl counts, wherever it stands in the file (module level, inside a function,
under ``if TYPE_CHECKING``), absolute or relative.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


class Import(NamedTuple):
    line: int
    module: str  # dotted name, e.g. "verirl.algo.loss" or "verirl.algo.loss.aggregate"
    statement: str  # the import statement, as `ast.unparse` writes it


def verirl_imports(source: str, relpath: str) -> list[Import]:
    """The imports of verirl in ``source``, the text of the file ``relpath`` ("verirl/algo/loss.py").

    ``from P import a, b`` gives P.a and P.b (either may be a submodule); relative imports are
    resolved against the file's package."""
    package = relpath.split("/")[:-1]  # of a module, its package; of an __init__.py, the package itself
    found: list[Import] = []
    for node in ast.walk(ast.parse(source, filename=relpath)):
        if isinstance(node, ast.Import):
            found += [Import(node.lineno, a.name, ast.unparse(node)) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:max(len(package) - (node.level - 1), 0)]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            found += [Import(node.lineno, base_name if a.name == "*" else f"{base_name}.{a.name}",
                             ast.unparse(node)) for a in node.names]
    return sorted((i for i in found if i.module == "verirl" or i.module.startswith("verirl.")),
                  key=lambda i: i.line)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


class Rule(NamedTuple):
    name: str
    applies: Callable[[str], bool]  # relpath -> whether the rule covers that file
    allowed: Callable[[str], bool]  # imported module -> whether the file may import it


RULES = [
    Rule("types imports nothing of verirl", lambda p: p == "verirl/types.py", lambda m: False),
    Rule("algo imports only algo, errors and registry", lambda p: p.startswith("verirl/algo/"),
         lambda m: _under(m, "verirl.algo") or _under(m, "verirl.errors") or _under(m, "verirl.registry")),
    Rule("registry imports only errors", lambda p: p == "verirl/registry.py", lambda m: _under(m, "verirl.errors")),
    Rule("errors imports nothing of verirl", lambda p: p == "verirl/errors.py", lambda m: False),
    Rule("ops imports only ops and errors", lambda p: p.startswith("verirl/ops/"),
         lambda m: _under(m, "verirl.ops") or _under(m, "verirl.errors")),
    Rule("config imports only errors", lambda p: p == "verirl/config.py", lambda m: _under(m, "verirl.errors")),
    Rule("only the command line imports cli", lambda p: p not in ("verirl/cli.py", "verirl/__main__.py"),
         lambda m: not _under(m, "verirl.cli")),
]


def violations(rule: Rule, files: dict[str, str]) -> list[str]:
    """'file:line: statement (forbidden: modules)' for each import statement in ``files``
    (relpath -> source) that imports something ``rule`` forbids."""
    out = []
    for path, source in sorted(files.items()):
        if not rule.applies(path):
            continue
        bad: dict[tuple[int, str], list[str]] = {}
        for imp in verirl_imports(source, path):
            if not rule.allowed(imp.module):
                bad.setdefault((imp.line, imp.statement), []).append(imp.module)
        out += [f"{path}:{line}: {stmt} (forbidden: {', '.join(mods)})" for (line, stmt), mods in bad.items()]
    return out


def _sources() -> dict[str, str]:
    return {p.relative_to(SRC).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted((SRC / "verirl").rglob("*.py"))}


def test_the_walk_sees_the_package():
    files = _sources()
    assert {"verirl/types.py", "verirl/config.py", "verirl/cli.py", "verirl/algo/advantages.py"} <= set(files)
    assert any(p.startswith("verirl/ops/") for p in files)


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_layering(rule):
    bad = violations(rule, _sources())
    assert not bad, f"{rule.name}:\n" + "\n".join(bad)


def test_the_checker_reports_forbidden_imports():
    """A synthetic algo module with forbidden imports of every form: each is reported at its line."""
    source = "\n".join([
        "import torch",                                   # 1: not verirl
        "from verirl.algo.loss import aggregate",         # 2: allowed
        "from . import kl",                               # 3: verirl.algo.kl, allowed
        "from verirl.errors import ConfigError",          # 4: allowed
        "def f():",                                       # 5
        "    from verirl.train.actor import update",      # 6: forbidden, inside a function
        "    import verirl.rollout",                      # 7: forbidden
        "    from ..models import load_model",            # 8: forbidden, relative
        "    from verirl import cli",                     # 9: forbidden twice (not algo; cli)
    ])
    files = {"verirl/algo/fake.py": source}
    algo = next(r for r in RULES if r.name.startswith("algo"))
    assert violations(algo, files) == [
        "verirl/algo/fake.py:6: from verirl.train.actor import update (forbidden: verirl.train.actor.update)",
        "verirl/algo/fake.py:7: import verirl.rollout (forbidden: verirl.rollout)",
        "verirl/algo/fake.py:8: from ..models import load_model (forbidden: verirl.models.load_model)",
        "verirl/algo/fake.py:9: from verirl import cli (forbidden: verirl.cli)",
    ]
    cli = next(r for r in RULES if r.name.startswith("only the command line"))
    assert violations(cli, files) == ["verirl/algo/fake.py:9: from verirl import cli (forbidden: verirl.cli)"]
    assert violations(cli, {"verirl/cli.py": source}) == []  # cli itself may
    # relative imports from a package's __init__ resolve against that package
    assert [i.module for i in verirl_imports("from .advantages import x\nfrom .. import types",
                                             "verirl/algo/__init__.py")] == ["verirl.algo.advantages.x", "verirl.types"]


def _function(relpath: str, name: str) -> ast.FunctionDef:
    tree = ast.parse((SRC / relpath).read_text(), filename=relpath)
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_the_step_reads_no_config_and_the_loop_stays_short():
    """`train_step` only calls phases (at most 45 lines, no config in it); `train` at most 40 lines."""
    step = _function("verirl/train/step.py", "train_step")
    assert step.end_lineno - step.lineno + 1 <= 45
    config_names = {"cfg", "c", "config"}
    touched = [f"line {n.lineno}: {ast.unparse(n)}" for n in ast.walk(step)
               if (isinstance(n, ast.Name) and n.id in config_names)
               or (isinstance(n, ast.Attribute) and n.attr in config_names)]
    assert not touched, "train_step reads the config:\n" + "\n".join(touched)
    loop = _function("verirl/train/trainer.py", "train")
    assert loop.end_lineno - loop.lineno + 1 <= 40
