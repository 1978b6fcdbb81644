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
    module: str  # dotted name, e.g. "verirl.core.algo.loss" or "verirl.core.algo.loss.aggregate"
    statement: str  # the import statement, as `ast.unparse` writes it


def verirl_imports(source: str, relpath: str) -> list[Import]:
    """The imports of verirl in ``source``, the text of the file ``relpath`` ("verirl/core/algo/loss.py").

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


# The layers, lowest first. A module may import its own layer and the layers below it, never one above:
#   core <- config <- models / data / rollout / rewards <- run <- train <- launch <- tools <- cli
# Rooms of one layer may import each other, without a cycle (`test_no_import_cycle`).
LAYERS = [
    ("core", ("verirl.core",)),
    ("config", ("verirl.config",)),
    ("rooms", ("verirl.models", "verirl.data", "verirl.rollout", "verirl.rewards", "verirl.sandbox", "verirl.envs")),
    ("run", ("verirl.run",)),
    ("train", ("verirl.train",)),
    ("launch", ("verirl.launch",)),
    ("tools", ("verirl.tools",)),
    ("cli", ("verirl.cli", "verirl.__main__", "verirl")),
]


def layer_of(module: str) -> int:
    """The index in `LAYERS` of a dotted module name (the package ``verirl`` itself counts as cli)."""
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(_under(module, p) for p in prefixes if p != "verirl"):
            return i
    if module == "verirl":
        return len(LAYERS) - 1
    raise AssertionError(f"{module} is in no layer: add its room to LAYERS")


def module_of(relpath: str) -> str:
    """"verirl/core/algo/__init__.py" -> "verirl.core.algo"; "verirl/cli.py" -> "verirl.cli"."""
    return relpath.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _downward(relpath: str):
    own = layer_of(module_of(relpath))
    return lambda m: layer_of(m) <= own


RULES = [
    Rule("imports point down the layers (core <- config <- models/data/rollout/rewards <- run <- train <- launch "
         "<- tools <- cli)", lambda p: True, None),
    Rule("types imports nothing of verirl", lambda p: p == "verirl/core/types.py", lambda m: False),
    Rule("errors imports nothing of verirl", lambda p: p == "verirl/core/errors.py", lambda m: False),
    Rule("registry imports only errors", lambda p: p == "verirl/core/registry.py",
         lambda m: _under(m, "verirl.core.errors")),
    Rule("algo imports only algo, errors and registry", lambda p: p.startswith("verirl/core/algo/"),
         lambda m: _under(m, "verirl.core.algo") or _under(m, "verirl.core.errors") or _under(m, "verirl.core.registry")),
    Rule("ops imports only ops and errors", lambda p: p.startswith("verirl/core/ops/"),
         lambda m: _under(m, "verirl.core.ops") or _under(m, "verirl.core.errors")),
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
        allowed = rule.allowed or _downward(path)
        for imp in verirl_imports(source, path):
            if not allowed(imp.module):
                bad.setdefault((imp.line, imp.statement), []).append(imp.module)
        out += [f"{path}:{line}: {stmt} (forbidden: {', '.join(mods)})" for (line, stmt), mods in bad.items()]
    return out


def _sources() -> dict[str, str]:
    return {p.relative_to(SRC).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted((SRC / "verirl").rglob("*.py"))}


def test_the_walk_sees_the_package():
    files = _sources()
    assert {"verirl/core/types.py", "verirl/config/__init__.py", "verirl/cli.py", "verirl/core/algo/advantages.py",
            "verirl/train/loop.py", "verirl/run/checks.py", "verirl/tools/plan/__init__.py"} <= set(files)
    assert any(p.startswith("verirl/core/ops/") for p in files)
    for path in files:  # every module is in a layer
        layer_of(module_of(path))


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_layering(rule):
    bad = violations(rule, _sources())
    assert not bad, f"{rule.name}:\n" + "\n".join(bad)


def test_the_checker_reports_forbidden_imports():
    """A synthetic algo module with forbidden imports of every form: each is reported at its line."""
    source = "\n".join([
        "import torch",                                   # 1: not verirl
        "from verirl.core.algo.loss import aggregate",         # 2: allowed
        "from . import kl",                               # 3: verirl.core.algo.kl, allowed
        "from verirl.core.errors import ConfigError",          # 4: allowed
        "def f():",                                       # 5
        "    from verirl.train.update import update",      # 6: forbidden, inside a function
        "    import verirl.rollout",                      # 7: forbidden
        "    from ...models import load_model",           # 8: forbidden, relative
        "    from verirl import cli",                     # 9: forbidden twice (not algo; cli)
    ])
    files = {"verirl/core/algo/fake.py": source}
    algo = next(r for r in RULES if r.name.startswith("algo"))
    assert violations(algo, files) == [
        "verirl/core/algo/fake.py:6: from verirl.train.update import update (forbidden: verirl.train.update.update)",
        "verirl/core/algo/fake.py:7: import verirl.rollout (forbidden: verirl.rollout)",
        "verirl/core/algo/fake.py:8: from ...models import load_model (forbidden: verirl.models.load_model)",
        "verirl/core/algo/fake.py:9: from verirl import cli (forbidden: verirl.cli)",
    ]
    cli = next(r for r in RULES if r.name.startswith("only the command line"))
    assert violations(cli, files) == ["verirl/core/algo/fake.py:9: from verirl import cli (forbidden: verirl.cli)"]
    assert violations(cli, {"verirl/cli.py": source}) == []  # cli itself may
    # relative imports from a package's __init__ resolve against that package
    assert [i.module for i in verirl_imports("from .advantages import x\nfrom .. import types",
                                             "verirl/core/algo/__init__.py")] == ["verirl.core.algo.advantages.x", "verirl.core.types"]
    # the layer rule: a room may import its own layer and below; an import up the layers is named
    down = RULES[0]
    assert violations(down, {"verirl/rollout/fake.py": "from verirl.models.load import x\nfrom verirl.core import types\n"
                                                        "def f():\n    from verirl.train.strategy import full\n"}) == [
        "verirl/rollout/fake.py:4: from verirl.train.strategy import full (forbidden: verirl.train.strategy.full)"]
    assert violations(down, {"verirl/cli.py": "from verirl.tools.plan import make_plan\nimport verirl.core"}) == []


def import_graph(files: dict[str, str]) -> dict[str, set[str]]:
    """module -> the verirl modules it imports (anywhere in the file), each import resolved to the longest
    module of ``files`` it names (``from P import name`` counts as P when name is not a module)."""
    modules = {module_of(p): p for p in files}

    def resolve(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in modules else ""

    return {m: {r for i in verirl_imports(files[p], p) if (r := resolve(i.module)) and r != m}
            for m, p in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one module
    (Tarjan's algorithm, iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_cycle():
    """No two verirl modules import each other, directly or around a circle, counting the imports
    inside functions (which hide a cycle from Python but not from a reader)."""
    found = cycles(import_graph(_sources()))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_finds_a_cycle():
    """A circle of three modules, one of its imports inside a function, beside a module that only
    imports into it: the circle is found, the bystander is not in it."""
    files = {"verirl/train/a.py": "from verirl.train.b import x",
             "verirl/train/b.py": "import torch\nfrom verirl.train import c",
             "verirl/train/c.py": "def f():\n    from verirl.train.a import y",
             "verirl/train/d.py": "from verirl.train.a import y",
             "verirl/train/__init__.py": ""}
    assert cycles(import_graph(files)) == [["verirl.train.a", "verirl.train.b", "verirl.train.c"]]
    files["verirl/train/c.py"] = "def f():\n    pass"
    assert cycles(import_graph(files)) == []


def _function(relpath: str, name: str) -> ast.FunctionDef:
    tree = ast.parse((SRC / relpath).read_text(), filename=relpath)
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_the_step_reads_no_config_and_the_loop_stays_short():
    """`train_step` only calls phases (at most 45 lines, no config in it); `train_rank`, the life of one
    rank, at most 40 lines."""
    step = _function("verirl/train/step.py", "train_step")
    assert step.end_lineno - step.lineno + 1 <= 45
    config_names = {"cfg", "c", "config"}
    touched = [f"line {n.lineno}: {ast.unparse(n)}" for n in ast.walk(step)
               if (isinstance(n, ast.Name) and n.id in config_names)
               or (isinstance(n, ast.Attribute) and n.attr in config_names)]
    assert not touched, "train_step reads the config:\n" + "\n".join(touched)
    loop = _function("verirl/train/loop.py", "train_rank")
    assert loop.end_lineno - loop.lineno + 1 <= 40
