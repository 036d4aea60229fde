"""The house's layers: import-linter's contracts in ``pyproject.toml`` hold, and what import-linter cannot see.

``pyproject.toml``'s ``[tool.importlinter]`` declares the layers of docs/architecture.md (top first), that the
recipe's core imports no application, that the two backends are independent and that no two modules import each
other in a loop. ``lint-imports`` checks every ``import`` statement (module level and inside functions, relative
ones too, and indirect chains); this file runs it, and shows on a planted tree that each contract breaks.

What import-linter does not read, checked here against the same declaration:

* ``importlib.import_module(ARG)`` and ``__import__(ARG)``, with ``ARG`` read from the text: a string, or an
  f-string made of constants, ``{__name__}`` (the module's own dotted name), module-level string constants
  ``{NAME}`` and lookups ``{TABLE[...]}`` in a module-level dict (its values), tuple or list literal of strings
  (every name the lookup can give). ``f"{__name__}.{_HOMES[name]}"`` (a PEP 562 lazy loader) imports each
  submodule ``_HOMES`` names. Any other ``ARG`` fails (write it in one of these forms), unless ``UNREAD_IMPORTS``
  lists it with the reason it imports no module of the house.
* A string constant that names an ``rpg`` module in full (``"rpg.a.b"``, ``"rpg.a.b.Class"``, ``"rpg.a.b:function"``
  where ``rpg/a/b.py`` or ``rpg/a/b/__init__.py`` exists: a dotted path handed to verl, Hydra or ``python -m``;
  an f-string's constant parts count too) is an import made later by someone else: it must point down like an
  import, unless ``NAMED_ABOVE`` lists it. A string that names no module (a config key such as ``rpg.loss.name``)
  is not one.
"""

from __future__ import annotations

import ast
import itertools
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINTER = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _layers(container: str) -> list[list[str]]:
    """The layers contract on ``container``, bottom first, each layer its nodes in full (``a | b``: independent)."""
    (contract,) = [c for c in LINTER["contracts"] if c["type"] == "layers" and c.get("containers") == [container]]
    return [[f"{container}.{tail.strip()}" for tail in re.split(r"[|:]", layer)]
            for layer in reversed(contract["layers"])]


def ranks() -> dict[str, tuple[int, int]]:
    """Each node's place, bottom first: (top-level layer, layer inside it); nodes of one layer share a place.
    ``rpg.backends`` itself (its interface: ``__init__`` and the children its contract leaves out) sits below the
    layers of its own contract."""
    out = {}
    for i, layer in enumerate(_layers("rpg")):
        for node in layer:
            out[node] = (i, 0)
            if node == "rpg.backends":
                for j, inner in enumerate(_layers(node), start=1):
                    out.update({n: (i, j) for n in inner})
    return out


RANK = ranks()
ORDER = [node for layer in _layers("rpg") for node in layer]  # bottom first
SHARED = ORDER[ORDER.index("rpg.math") + 1:ORDER.index("rpg.reward")]  # the shared pieces (docs/architecture.md)


def node_of(module: str) -> str | None:
    """The most specific node that holds ``module`` (``rpg`` itself holds none)."""
    held = [n for n in RANK if module == n or module.startswith(n + ".")]
    return max(held, key=len) if held else None


def module_of(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(root: Path = ROOT) -> list[Path]:
    return sorted((root / "rpg").rglob("*.py"))


def points_up(src: str | None, dst: str | None) -> bool:
    return bool(src and dst and src != dst and RANK[dst] >= RANK[src])


def lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "lint-imports is not installed: pip install -e '.[test]' (README) installs import-linter"
    env = dict(os.environ, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {}))
    return subprocess.run([exe, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_import_linter_keeps_every_contract():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout or " broken" not in done.stdout, done.stdout[-3000:]


def plant(root: Path, files: dict[str, str]) -> None:
    """A small tree under ``root`` for the checks' own tests."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_contracts_break_on_planted_imports(tmp_path):
    """Every node of the real contracts as an empty package, then one import against each contract: the math
    importing the launcher inside a function, a relative import from the configuration up to the driver, a CPU
    backend module importing the GPU backend, the driver importing the reports, the driver importing the study and
    the math the lab, the lab's exact enumeration importing the conformance report and the study the demos, and two
    driver modules importing each other (one lazily). Each contract reports its own."""
    nodes = [n for n in RANK if n != "rpg.backends"] + [n for layer in _layers("rpg_lab") for n in layer]
    plant(tmp_path, {"rpg/__init__.py": "", "rpg/backends/__init__.py": "", "rpg_lab/__init__.py": "",
                     **{n.replace(".", "/") + "/__init__.py": "" for n in nodes}})
    plant(tmp_path, {
        "rpg/math/x.py": "def f():\n    from rpg.launch import y\n",
        "rpg/config/z.py": "from ..verl import a\n",
        "rpg/backends/cpu/c.py": "from rpg.backends.gpu import d\n",
        "rpg/backends/gpu/d.py": "",
        "rpg/launch/y.py": "",
        "rpg/verl/a.py": "from rpg.verl import b\n",
        "rpg/verl/b.py": "def g():\n    from rpg.verl import a\n",
        "rpg/verl/r.py": "import rpg.reports\n",
        "rpg/verl/s.py": "import rpg_lab.study\n",
        "rpg/math/lab.py": "import rpg_lab.exact\n",
        "rpg_lab/exact/e.py": "from rpg_lab.conformance import c\n",
        "rpg_lab/conformance/c.py": "",
        "rpg_lab/study/q.py": "from rpg_lab.demo import d\n",
        "rpg_lab/demo/d.py": "",
    })
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    done = lint_imports(tmp_path, pythonpath=tmp_path)
    out = " ".join(done.stdout.split())
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    for contract in LINTER["contracts"]:
        assert f"{contract['name']} BROKEN" in out, (contract["name"], done.stdout[-4000:])
    for arrow in ("rpg.math.x -> rpg.launch", "rpg.config.z -> rpg.verl", "rpg.backends.cpu.c -> rpg.backends.gpu",
                  "rpg.verl.r -> rpg.reports", "rpg.verl.s -> rpg_lab.study", "rpg.math.lab -> rpg_lab.exact",
                  "rpg_lab.exact.e -> rpg_lab.conformance", "rpg_lab.study.q -> rpg_lab.demo"):
        assert arrow in out, (arrow, done.stdout[-4000:])


def test_the_docs_layer_table_is_the_contract():
    """docs/architecture.md's table of layers names the contract's nodes, bottom first, in its order (a row of
    the table may group several of the contract's layers)."""
    text = (ROOT / "docs/architecture.md").read_text()
    table = text[text.index("| # | layer |"):].split("\n\n")[0]
    rows = [line for line in table.splitlines() if re.match(r"\| \d+ \|", line)]
    documented = [node for row in rows for node in re.findall(r"`(rpg[\w.]*)`", row.split("|")[3])]
    assert documented == ORDER, f"docs/architecture.md {documented} != pyproject.toml {ORDER}"


# import_module(...) calls whose argument this test cannot read, (file, argument) -> why no house module hides there
UNREAD_IMPORTS = {
    ("rpg/verl/block_to_verl.py", "module_name"): "the module of a run's rpg.reward_function (a user's module, or the "
    "default rpg.reward, a lower layer): configuration data, not a module of the driver",
}


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


def dynamic_imports(path: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """The ``rpg`` modules ``path`` imports by ``import_module``/``__import__``, with their lines."""
    module = module_of(path, root)
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_dynamic(node):
            names = _dynamic(node.args[0], module, _literals(tree))
            if names is None and (path.relative_to(root).as_posix(), ast.unparse(node.args[0])) not in UNREAD_IMPORTS:
                raise AssertionError(
                    f"{path.relative_to(root)}:{node.lineno}: cannot read which module "
                    f"{ast.unparse(node)} imports: write it as a string, or an f-string of constants, {{__name__}} "
                    "and lookups in a module-level dict/tuple literal (see this file's docstring)")
            found += [(name, node.lineno) for name in names or ()]
    return [(name, line) for name, line in found if name == "rpg" or name.startswith("rpg.")]


def upward_dynamic(root: Path = ROOT) -> list[str]:
    return [f"{path.relative_to(root)}:{line}: {node_of(module_of(path, root))} imports {name} by name"
            for path in sources(root) for name, line in dynamic_imports(path, root)
            if points_up(node_of(module_of(path, root)), node_of(name))]


def test_every_import_by_name_points_down():
    found = upward_dynamic()
    assert not found, "imports by name that point up or sideways:\n" + "\n".join(found)


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


def named_upward(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file, line, string) for each string constant of ``rpg/`` (f-strings' constant parts too) that names a
    module of the same or a higher layer than its own."""
    out = []
    for path in sources(root):
        src = node_of(module_of(path, root))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                target = named_module(node.value, root)
                if target and points_up(src, node_of(target)):
                    out.append((path.relative_to(root).as_posix(), node.lineno, node.value))
    return out


def upward_strings(root: Path = ROOT) -> list[str]:
    return [f"{file}:{line}: names {text!r}, above or beside its own layer" for file, line, text
            in sorted(named_upward(root)) if (file, text) not in NAMED_ABOVE]


def test_every_module_path_string_points_down():
    """A dotted path in a string (a Hydra ``_target_``, a registry entry verl imports, ``-m rpg.x``) is imported
    later by verl, Hydra or a subprocess: it points down like an import."""
    found = upward_strings()
    assert not found, "strings that name a module above (list one in NAMED_ABOVE only if it is data):\n" + \
        "\n".join(found)


def test_the_allow_lists_name_what_is_there():
    named = {(file, text) for file, _, text in named_upward()}
    assert not set(NAMED_ABOVE) - named, f"NAMED_ABOVE lists strings no longer there: {set(NAMED_ABOVE) - named}"
    unread = {(p.relative_to(ROOT).as_posix(), ast.unparse(n.args[0])) for p in sources()
              for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Call) and _is_dynamic(n)}
    assert not set(UNREAD_IMPORTS) - unread, \
        f"UNREAD_IMPORTS lists calls no longer there: {set(UNREAD_IMPORTS) - unread}"


def test_the_checks_read_lazy_loaders_and_module_paths(tmp_path):
    """A lazy loader ``f"{__name__}.{_HOMES[name]}"`` in the backends' interface loading a backend (above it), an
    ``import_module`` in the math naming the launcher through a module-level table, and strings in the
    configuration naming a driver's class, a reward function and a launcher's ``-m`` module (in an f-string) fail;
    a config key that names no module, a path to its own node and the allowed default pass; an ``import_module``
    argument the check cannot read fails it."""
    plant(tmp_path, {
        "rpg/__init__.py": "",
        "rpg/backends/__init__.py": "import importlib\n_HOMES = {'f': 'cpu.backend', 'g': 'cpu.backend'}\n"
                                    "def __getattr__(name):\n"
                                    "    return importlib.import_module(f'{__name__}.{_HOMES[name]}')\n",
        "rpg/backends/cpu/__init__.py": "",
        "rpg/backends/cpu/backend.py": "",
        "rpg/math/m.py": "import importlib\n_M = {'c': 'cli'}\n"
                         "def f(n):\n    return importlib.import_module(f'rpg.launch.{_M[n]}')\n",
        "rpg/config/a.py": "T = 'rpg.verl.policy.Config'\nF = 'rpg.reward:score'\nARGV = ['-m', f'rpg.launch.cli']\n"
                           "KEY = 'rpg.loss.name'\nOWN = 'rpg.config.block'\nTWO = 'rpg.verl.policy.Config.x'\n",
        "rpg/config/block.py": "RPG_MODULE = 'rpg.reward'\n",
        "rpg/verl/policy.py": "",
        "rpg/reward/__init__.py": "",
        "rpg/launch/cli.py": "NAME = 'rpg.verl.policy'\n",
    })
    assert [line.split(": ")[0] for line in upward_dynamic(tmp_path)] == ["rpg/backends/__init__.py:4",
                                                                          "rpg/math/m.py:4"]
    assert [line.split(": ")[0] for line in upward_strings(tmp_path)] == ["rpg/config/a.py:1", "rpg/config/a.py:2",
                                                                         "rpg/config/a.py:3"]
    plant(tmp_path, {"rpg/math/n.py": "import importlib\ndef f(name):\n"
                                      "    return importlib.import_module(f'{__name__}.{name}')\n"})
    with pytest.raises(AssertionError, match="rpg/math/n.py:3: cannot read which module"):
        upward_dynamic(tmp_path)



def test_torch_free_layers_import_without_torch():
    """The configuration, the shared pieces, the backends' interfaces (their settings and checks before Ray), the
    launch, the memory plan and the cluster layer never import torch: a launch answers in a second, and the
    driver's checks run before any model is touched (``import torch`` takes 5-12 s on a loaded machine)."""
    light = {"rpg.config", *SHARED, "rpg.launch", "rpg.memory", "rpg.cluster"}
    mods = [m for m in map(module_of, sources()) if node_of(m) in light and not m.endswith("__main__")]
    mods += ["rpg.backends", "rpg.backends.run_env", "rpg.backends.import_hooks", "rpg.backends.cpu.backend",
             "rpg.backends.gpu.backend", "rpg.backends.hf_rollout.verl_registries"]
    code = "import sys; sys.modules['torch'] = None\n" + "".join(f"import {m}\n" for m in mods)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(mods) > 30, mods  # the launcher's modules are found, not an empty list
