"""The house's layers: every import inside ``rpg/`` points down, file sizes stay readable.

The nodes are ``rpg``'s packages and top-level modules (``rpg.backends``'s own interface and each backend
count apart). ``LAYERS`` lists them bottom to top; a node may import a node of a lower layer, or one listed
before it in its own layer, never one above (every import counts: module level and inside functions). A new
upward import fails here with the file, the line and the two layers. Read docs/architecture.md for why
each layer sits where it does.

What counts as an import of a module:

* ``import rpg.x``, ``from rpg.x import y`` (``rpg.x.y`` may be a module), relative imports;
* ``importlib.import_module(ARG)`` and ``__import__(ARG)``, with ``ARG`` read from the text: a string, or an
  f-string made of constants, ``{__name__}`` (the module's own dotted name), module-level string constants
  ``{NAME}`` and lookups ``{TABLE[...]}`` in a module-level dict (its values), tuple or list literal of strings
  (every name the lookup can give). ``f"{__name__}.{_HOMES[name]}"`` (a PEP 562 lazy loader) imports each
  submodule ``_HOMES`` names. Any other ``ARG`` fails the test (write it in one of these forms), unless
  ``UNREAD_IMPORTS`` lists it with the reason it imports no module of the house.

A string constant that names an ``rpg`` module in full (``"rpg.a.b"``, ``"rpg.a.b.Class"``, ``"rpg.a.b:function"``
where ``rpg/a/b.py`` or ``rpg/a/b/__init__.py`` exists: a dotted path handed to verl, Hydra or ``python -m``;
an f-string's constant parts count too) is an import made later by someone else: it must point down like an
import, unless ``NAMED_ABOVE`` lists it. A string that names no module (a config key such as ``rpg.loss.name``)
is not one.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rpg"

# bottom to top; inside a layer, a node may import those listed before it
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("typed configuration (torch-free: the rpg: block, RPGLossConfig and its RULES)", ("rpg.config",)),
    ("math: the paper's formulas (torch only)", ("rpg.math",)),
    ("shared pieces: Hydra overrides, paths, stop signals, node counts, the metrics log",
     ("rpg.override_lists", "rpg.paths", "rpg.stop_signals", "rpg.node_counts", "rpg.metrics_log")),
    ("leaves: reward, data, the tiny task and SmolLM2's", ("rpg.reward", "rpg.data", "rpg.tiny", "rpg.smol")),
    ("backends", ("rpg.backends", "rpg.backends.hf_rollout", "rpg.backends.cpu", "rpg.backends.gpu",
                  "rpg.backends.registry")),
    ("verl glue and the driver", ("rpg.verl",)),
    ("beside the driver: the memory plan, the trainer run as a subprocess (the harness)",
     ("rpg.memory", "rpg.trainer_process")),
    ("launch: a paper run's entry on one node", ("rpg.launch",)),
    ("the cluster layer (opt-in): Ray jobs, node plans, the elastic supervisor", ("rpg.cluster",)),
    ("applications", ("rpg.reports", "rpg.demo", "rpg.study", "rpg.gpu_kit")),
]
RANK = {node: (layer, pos) for layer, (_, nodes) in enumerate(LAYERS) for pos, node in enumerate(nodes)}
MAX_LINES = 450


def node_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "backends" and parts[2] in ("hf_rollout", "cpu", "gpu", "registry"):
        return ".".join(parts[:3])
    return ".".join(parts[:2]) if len(parts) > 1 else module


def module_of(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# import_module(...) calls whose argument this test cannot read, (file, argument) -> why no house module hides there
UNREAD_IMPORTS = {
    ("rpg/verl/block_to_verl.py", "module_name"): "the module of a run's rpg.reward_function (a user's module, or the "
    "default rpg.reward, a lower layer): configuration data, not a module of the driver",
    ("rpg/gpu_kit/probe.py", "module or dist.replace('-', '_')"): "the third-party packages the GPU kit's probe "
    "reports (its PACKAGES table): none of them a module of the house",
}


def imports(path: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """Every ``rpg`` module ``path`` imports (absolute or relative, at any depth), with its line."""
    module = module_of(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from rpg.verl import a`` may import the module rpg.verl.a: each name is kept (callers resolve it)
            names = [f"{target}.{a.name}" for a in node.names]
            found += [(name, node.lineno) for name in names]
        elif isinstance(node, ast.Call) and _is_dynamic(node):  # importlib.import_module(...), __import__(...)
            names = _dynamic(node.args[0], module, _literals(tree))
            if names is None and (path.relative_to(root).as_posix(), ast.unparse(node.args[0])) not in UNREAD_IMPORTS:
                raise AssertionError(
                    f"{path.relative_to(root)}:{node.lineno}: cannot read which module "
                    f"{ast.unparse(node)} imports: write it as a string, or an f-string of constants, {{__name__}} "
                    "and lookups in a module-level dict/tuple literal (see this file's docstring)")
            found += [(name, node.lineno) for name in names or ()]
    return [(name, line) for name, line in found if name == "rpg" or name.startswith("rpg.")]


def _is_dynamic(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name in ("import_module", "__import__") and bool(call.args)


def _literals(tree: ast.Module) -> dict[str, str | list[str]]:
    """Module-level names bound once to a string, or to a dict (its values), tuple or list literal of strings."""
    bound: dict[str, list[ast.expr]] = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(stmt.value)
    out: dict[str, str | list[str]] = {}
    for name, values in bound.items():
        if len(values) != 1:
            continue  # bound twice: which value holds is not read
        value = values[0]
        items = value.values if isinstance(value, ast.Dict) else value.elts if isinstance(
            value, (ast.Tuple, ast.List)) else None
        if items is None and isinstance(value, ast.Constant) and isinstance(value.value, str):
            out[name] = value.value
        elif items and all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
            out[name] = [i.value for i in items]
    return out


def _dynamic(arg: ast.expr, module: str, literals: dict[str, str | list[str]]) -> list[str] | None:
    """Every module the argument of ``import_module`` can name (this file's docstring says which forms are read),
    or None when it cannot be read."""
    pieces = arg.values if isinstance(arg, ast.JoinedStr) else [arg]
    choices = []
    for piece in pieces:
        if isinstance(piece, ast.FormattedValue):
            if piece.conversion != -1 or piece.format_spec is not None:
                return None
            piece = piece.value
        if isinstance(piece, ast.Constant) and isinstance(piece.value, str):
            choices.append([piece.value])
        elif isinstance(piece, ast.Name) and piece.id == "__name__":
            choices.append([module])
        elif isinstance(piece, ast.Name) and isinstance(literals.get(piece.id), str):
            choices.append([literals[piece.id]])
        elif isinstance(piece, ast.Subscript) and isinstance(piece.value, ast.Name) and isinstance(
                literals.get(piece.value.id), list):
            choices.append(literals[piece.value.id])
        else:
            return None
    names = list(dict.fromkeys("".join(c) for c in itertools.product(*choices)))
    return None if any(n.startswith(".") for n in names) else names  # relative: ``package=`` is not read


def sources(root: Path = ROOT) -> list[Path]:
    return sorted((root / "rpg").rglob("*.py"))


def arrows(root: Path = ROOT) -> list[tuple[str, str, Path, int]]:
    out = []
    for path in sources(root):
        src = node_of(module_of(path, root))
        for name, line in imports(path, root):
            dst = node_of(name)
            if dst != src and dst != "rpg":
                out.append((src, dst, path, line))
    return out


def test_every_node_has_a_layer():
    nodes = {node_of(module_of(p)) for p in sources()} - {"rpg"}
    assert not nodes - set(RANK), f"give these a layer in LAYERS: {sorted(nodes - set(RANK))}"
    assert not set(RANK) - nodes, f"LAYERS names nodes that do not exist: {sorted(set(RANK) - nodes)}"


def upward(root: Path = ROOT) -> list[str]:
    return [f"{path.relative_to(root)}:{line}: {src} ({LAYERS[RANK[src][0]][0]}) imports {dst} "
            f"({LAYERS[RANK[dst][0]][0]})" for src, dst, path, line in arrows(root)
            if src in RANK and dst in RANK and RANK[dst] >= RANK[src]]


def test_every_import_points_down():
    found = upward()
    assert not found, "imports that point up or sideways:\n" + "\n".join(found)


MODULE_PATH = re.compile(r"rpg(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?")  # rpg.a.b, rpg.a.b.Class, rpg.a.b:function

# strings that name a module above their own on purpose, (file, string) -> why
NAMED_ABOVE = {
    ("rpg/config/block.py", "rpg.reward"): "the default value of the config key rpg.reward_function: the "
    "configuration holds it as data and never imports it; the driver (rpg.verl.block_to_verl) resolves it",
}


def named_module(text: str, root: Path = ROOT) -> str | None:
    """The ``rpg`` module a string names in full (``rpg.a.b``, ``rpg.a.b.Name``, ``rpg.a.b:function``), when
    ``rpg/a/b.py`` or ``rpg/a/b/__init__.py`` exists; None otherwise (a config key such as ``rpg.loss.name``)."""
    if not MODULE_PATH.fullmatch(text):
        return None
    dotted, colon, _ = text.partition(":")
    parts = dotted.split(".")
    for module in [parts] if colon else [parts, parts[:-1]]:  # without ``:``, a last name may be a class
        if len(module) > 1 and (root.joinpath(*module[:-1], module[-1] + ".py").exists()
                                or root.joinpath(*module, "__init__.py").exists()):
            return ".".join(module)
    return None


def named_upward(root: Path = ROOT) -> list[tuple[str, int, str, str, str]]:
    """(file, line, string, its node, the node it names) for each string constant of ``rpg/`` (f-strings'
    constant parts too) that names a module of the same or a higher layer than its own."""
    out = []
    for path in sources(root):
        src = node_of(module_of(path, root))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                target = named_module(node.value, root)
                dst = target and node_of(target)
                if dst and dst != src and src in RANK and dst in RANK and RANK[dst] >= RANK[src]:
                    out.append((path.relative_to(root).as_posix(), node.lineno, node.value, src, dst))
    return out


def upward_strings(root: Path = ROOT) -> list[str]:
    return [f"{file}:{line}: {src} ({LAYERS[RANK[src][0]][0]}) names {text!r}, in {dst} "
            f"({LAYERS[RANK[dst][0]][0]})" for file, line, text, src, dst in sorted(named_upward(root))
            if (file, text) not in NAMED_ABOVE]


def test_every_module_path_string_points_down():
    """A dotted path in a string (a Hydra ``_target_``, a registry entry verl imports, ``-m rpg.x``) is imported
    later by verl, Hydra or a subprocess: it points down like an import."""
    found = upward_strings()
    assert not found, "strings that name a module above (list one in NAMED_ABOVE only if it is data):\n" + \
        "\n".join(found)


def test_the_allow_lists_name_what_is_there():
    named = {(file, text) for file, _, text, _, _ in named_upward()}
    assert not set(NAMED_ABOVE) - named, f"NAMED_ABOVE lists strings no longer there: {set(NAMED_ABOVE) - named}"
    unread = {(p.relative_to(ROOT).as_posix(), ast.unparse(n.args[0])) for p in sources()
              for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Call) and _is_dynamic(n)}
    assert not set(UNREAD_IMPORTS) - unread, \
        f"UNREAD_IMPORTS lists calls no longer there: {set(UNREAD_IMPORTS) - unread}"


def test_the_two_backends_do_not_import_each_other():
    """What both backends use (the HF rollout, the interface) sits below them in the layer: a GPU run never
    loads the CPU backend's platform, patches or settings, and the CPU backend never loads the GPU's."""
    found = [f"{path.relative_to(ROOT)}:{line}: {src} imports {dst}" for src, dst, path, line in arrows()
             if {src, dst} == {"rpg.backends.cpu", "rpg.backends.gpu"}]
    assert not found, "\n".join(found)


def module_cycles(root: Path = ROOT) -> list[list[str]]:
    """Cycles among ``rpg``'s modules (every import, also inside functions; a package's ``__init__`` counts as
    its module), by Tarjan's strongly connected components."""
    mods = {module_of(p, root): p for p in sources(root)}
    edges: dict[str, set[str]] = {}
    for mod, path in mods.items():
        edges[mod] = set()
        for name, _ in imports(path, root):
            parts = name.split(".")
            while parts and ".".join(parts) not in mods:  # ``from rpg.x import f``: the module rpg.x
                parts.pop()
            target = ".".join(parts)
            if target and target != mod and not mod.startswith(target + "."):  # a submodule runs its package
                edges[mod].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while component[-1:] != [v]:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return cycles


def test_no_module_imports_itself_through_others():
    """Inside a layer too: no two modules import each other, directly or through others, even lazily."""
    assert not module_cycles(), module_cycles()


def plant(root: Path, files: dict[str, str]) -> None:
    """A small fake tree under ``root`` for the checks' own tests."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_cycle_check_finds_a_lazy_cycle(tmp_path):
    files = {"rpg/__init__.py": "", "rpg/verl/__init__.py": "", "rpg/verl/a.py": "from rpg.verl.b import f\n",
             "rpg/verl/b.py": "def f():\n    from rpg.verl import a\n", "rpg/verl/c.py": "from rpg.verl import a\n"}
    plant(tmp_path, files)
    assert module_cycles(tmp_path) == [["rpg.verl.a", "rpg.verl.b"]]


def test_the_rule_catches_upward_imports(tmp_path):
    """The check itself, on a small tree: a backend importing the launcher inside a function, a relative import
    from the math up to the launcher, ``from rpg import`` of a higher module; a downward import passes."""
    files = {
        "rpg/__init__.py": "",
        "rpg/backends/cpu/env_overrides.py": "def f():\n    from rpg.launch import cli\n",
        "rpg/math/losses.py": "from ..launch.cli import main\nfrom rpg.math import divergences\n",
        "rpg/paths/x.py": "from rpg import verl\n",
        "rpg/launch/cli.py": "from rpg.backends.cpu import settings\nfrom rpg.paths import x\n",
        "rpg/backends/__init__.py": "import importlib\n_M = {'c': 'cli'}\n"
                                    "def f(n):\n    return importlib.import_module(f'rpg.launch.{_M[n]}')\n",
    }
    plant(tmp_path, files)
    found = upward(tmp_path)
    assert [line.split(": ")[0] for line in found] == ["rpg/backends/__init__.py:4",
                                                       "rpg/backends/cpu/env_overrides.py:2",
                                                       "rpg/math/losses.py:1", "rpg/paths/x.py:1"], found


def test_the_checks_read_lazy_loaders(tmp_path):
    """``f"{__name__}.{_HOMES[name]}"`` imports every submodule ``_HOMES`` names: here the backends' interface
    loads a backend (sideways: rpg.backends.cpu is listed after rpg.backends), which closes a cycle through the
    shared pieces; an ``import_module`` argument the test cannot read fails it."""
    plant(tmp_path, {
        "rpg/__init__.py": "",
        "rpg/backends/__init__.py": "import importlib\n_HOMES = {'f': 'cpu.backend', 'g': 'cpu.backend'}\n"
                                    "def __getattr__(name):\n"
                                    "    return importlib.import_module(f'{__name__}.{_HOMES[name]}')\n",
        "rpg/backends/cpu/__init__.py": "",
        "rpg/backends/cpu/backend.py": "from rpg.paths import x\n",
        "rpg/paths/__init__.py": "",
        "rpg/paths/x.py": "def f():\n    from rpg import backends\n",
    })
    assert [line.split(": ")[0] for line in upward(tmp_path)] == ["rpg/backends/__init__.py:4", "rpg/paths/x.py:2"]
    assert module_cycles(tmp_path) == [["rpg.backends", "rpg.backends.cpu.backend", "rpg.paths.x"]]
    plant(tmp_path, {"rpg/paths/y.py": "import importlib\ndef f(name):\n"
                                        "    return importlib.import_module(f'{__name__}.{name}')\n"})
    with pytest.raises(AssertionError, match="rpg/paths/y.py:3: cannot read which module"):
        upward(tmp_path)


def test_the_string_check_catches_upward_module_paths(tmp_path):
    """The configuration naming a driver's class, a reward function and a launcher's ``-m`` module (in an
    f-string) fails; a config key that names no module, a path to its own node or the allowed default passes."""
    plant(tmp_path, {
        "rpg/__init__.py": "",
        "rpg/config/a.py": "T = 'rpg.verl.policy.Config'\nF = 'rpg.reward:score'\nARGV = ['-m', f'rpg.launch.cli']\n"
                           "KEY = 'rpg.loss.name'\nOWN = 'rpg.config.block'\nTWO = 'rpg.verl.policy.Config.x'\n",
        "rpg/config/block.py": "RPG_MODULE = 'rpg.reward'\n",
        "rpg/verl/policy.py": "",
        "rpg/reward/__init__.py": "",
        "rpg/launch/cli.py": "NAME = 'rpg.verl.policy'\n",
    })
    assert [line.split(": ")[0] for line in upward_strings(tmp_path)] == ["rpg/config/a.py:1", "rpg/config/a.py:2",
                                                                         "rpg/config/a.py:3"]


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_files_stay_readable(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT)} has {n} lines (at most {MAX_LINES}): split it by concern"


def test_torch_free_layers_import_without_torch():
    """The configuration, the shared pieces, the backends' interfaces (their settings and checks before Ray), the
    launch, the memory plan and the cluster layer never import torch: a launch answers in a second, and the driver's checks run before any model
    is touched (``import torch`` takes 5-12 s on a loaded machine)."""
    import subprocess
    import sys

    light = {"rpg.config", *LAYERS[2][1], "rpg.launch", "rpg.memory", "rpg.cluster"}
    mods = [m for m in map(module_of, sources()) if node_of(m) in light and not m.endswith("__main__")]
    mods += ["rpg.backends", "rpg.backends.run_env", "rpg.backends.import_hooks", "rpg.backends.cpu.backend",
             "rpg.backends.gpu.backend", "rpg.backends.hf_rollout.verl_registries"]
    code = "import sys; sys.modules['torch'] = None\n" + "".join(f"import {m}\n" for m in mods)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(mods) > 30, mods  # the launcher's modules are found, not an empty list
