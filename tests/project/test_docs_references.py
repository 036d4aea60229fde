"""Docs a user can follow: no tracked file cites material that is not shipped, and every link resolves.

Code, docs, tests and the recipe cite the paper's own numbering (Sec., Eq., Table, Algorithm, App.) or
the project's docs (``docs/*.md#anchor``). They must not cite the developers' private notes (a "spec"
with § numbers, reference notes, measurement files), files outside the project (``../shared/spec``)
or the project's tracker ("issue 4", "(#12)", "the brief"): a user has none of them. Other projects'
issues and pull requests are cited as ``owner/repo#N`` or by URL, which is allowed.

Links: every relative Markdown link in README.md and docs/ must name an existing project file, and a
``#anchor`` must be a heading of the target (GitHub's anchor rule). Every ``docs/<page>.md#anchor``
mentioned anywhere (docstrings, comments) must resolve the same way.

Names: in every tracked text (in Python files, their docstrings and comments), a path under the project's folders
(``rpg/math/fused.py``, ``recipe/rpg/7b/*.sh``, ``tests/test_x.py::test_y``), a dotted ``rpg`` or ``rpg_lab`` name (a
module, a name in one, or a key of the ``rpg:`` block), a source file named alone in Markdown, and a citation of a README section
(``README.md#anchor``, ``README, "Title"``, ``README (Title)``, ``README's Title``) must name what the tree holds.
What legitimately is not in the tree (a file a run writes) is named by prefix in ``NOT_IN_TREE``, with why. A record
written before the lab's packages left ``rpg/`` (``RECORDS``) names them where they were: each such name is checked
where it is now (``MOVED``).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()
SOURCE_DIRS = ("rpg", "tests", "docs", "recipe", "scripts", "benchmarks")  # when git is unavailable

# (what it is, pattern): each names what a user cannot follow
FORBIDDEN = [
    ("a section of the private spec", re.compile(r"(?i)\bspec\s*§|\bspec\s+section\b")),
    ("an item of the private spec (T12, D6, ...)", re.compile(r"(?i)(?<![a-z])spec[\s_]?[td]\d")),
    ("the private spec", re.compile(r"(?i)\bthe spec\b|\bspec's\b|\bspec\.md\b")),
    ("a private notes or measurement file", re.compile(
        r"RPG_SPEC|REFERENCE_REPO_NOTES|VERL_0\.9\.1_NOTES|CPU_BACKEND_NOTES|GPU_MEASUREMENTS|HELPER_COMMON|SCHEMA\.md")),
    ("the private reference notes", re.compile(r"(?i)\breference notes\b|\bnotes\s*§")),
    ("a path outside the project", re.compile(r"shared/(spec|paper)\b|[\"']shared[\"']\s*/\s*[\"'](spec|paper)[\"']")),
    ("the project's tracker", re.compile(r"(?i)\b(issues?|tickets?|pr|pull requests?)\s*#?\d+")),
    ("the project's tracker", re.compile(r"\(#\d+\)|(?i:\bsee\s+#\d+)")),
    ("the project's tracker", re.compile(r"(?i)\bthe (issue|brief)\b")),
]
MARKDOWN_SUFFIXES = {".md"}
SKIP_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".pdf", ".parquet", ".svg", ".ico", ".gz", ".zip", ".pt", ".bin"}


def _tracked() -> list[str]:
    """Tracked files (git), or the source folders' files when this is not a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
        files = [f for f in out.decode().split("\0") if f]
        if files:
            return files
    except (OSError, subprocess.SubprocessError):
        pass
    files = [p.name for p in ROOT.iterdir() if p.is_file()]
    for d in SOURCE_DIRS:
        for dirpath, dirnames, names in os.walk(ROOT / d):
            dirnames[:] = [n for n in dirnames if not n.startswith(".") and n != "__pycache__"]
            files += [(Path(dirpath) / n).relative_to(ROOT).as_posix() for n in names]
    return files


@lru_cache(maxsize=None)
def _text(rel: str) -> str | None:
    path = ROOT / rel
    if path.suffix.lower() in SKIP_SUFFIXES or not path.is_file() or path.stat().st_size > 2_000_000:
        return None
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# tracked folders of data, not prose: what they hold cites nothing (the shipped tiny model: a tokenizer's vocabulary)
DATA_FOLDERS = ("rpg/tiny/weights/",)


def _texts() -> dict[str, str]:
    return {rel: t for rel in _tracked() if rel != THIS and not rel.startswith(DATA_FOLDERS)
            and (t := _text(rel)) is not None}


def reference_problems(rel: str, text: str) -> list[str]:
    """'file:line: what (matched text)' for every reference a user cannot follow."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for what, pattern in FORBIDDEN:
            m = pattern.search(line)
            if m:
                out.append(f"{rel}:{n}: {what} ({m.group(0)!r})")
        # outside Markdown a § number is another document's section unless the line names a docs page
        if Path(rel).suffix not in MARKDOWN_SUFFIXES and "§" in line and ".md" not in line:
            out.append(f"{rel}:{n}: a § number without the page it belongs to")
    return out


# ---------------------------------------------------------------- Markdown links and anchors

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DOC_MENTION = re.compile(r"\bdocs/[\w./-]+?\.md(?:#[\w-]+)?")


def github_anchor(heading: str) -> str:
    """GitHub's heading id: rendered text, lower case, punctuation dropped, spaces -> hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(rel: str) -> frozenset[str]:
    """Heading ids of a Markdown file (headings in fenced code blocks are not headings)."""
    text = FENCE.sub("", _text(rel) or "")
    seen: dict[str, int] = {}
    ids = set()
    for m in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, re.M):
        base = github_anchor(m.group(1))
        k = seen.get(base, 0)
        seen[base] = k + 1
        ids.add(base if k == 0 else f"{base}-{k}")
    return frozenset(ids)


def link_problem(source: str, target: str) -> str | None:
    """Why a relative link from ``source`` to ``target`` does not resolve, or None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
        return None
    path, _, anchor = target.partition("#")
    if path:
        resolved = (ROOT / source).parent / path
        try:
            rel = resolved.resolve().relative_to(ROOT).as_posix()
        except ValueError:
            return f"{target!r} points outside the project"
        if not resolved.exists():
            return f"{target!r}: no such file"
    else:
        rel = source
    if anchor and rel.endswith(".md") and anchor not in anchors(rel):
        return f"{target!r}: no heading with anchor #{anchor} in {rel}"
    return None


def markdown_links(text: str) -> list[str]:
    """Link targets of a Markdown text, code blocks and code spans left out."""
    return LINK.findall(CODE_SPAN.sub("", FENCE.sub("", text)))


def _link_sources() -> list[str]:
    return sorted(f for f in _tracked() if f == "README.md" or (f.startswith("docs/") and f.endswith(".md")))


# ---------------------------------------------------------------- file, module and README-section references

# prefixes of the project's own folders: a path under one of them, ending in a file suffix or "/", must exist
PATH_REF = re.compile(r"(?<![\w.\-/~$])(?:rpg|lab|tests|benchmarks|recipe|docs|scripts|requirements|\.ci)/"
                      r"[\w.\-/*<>{},\[\]]*(?:::[\w\[\]-]+)?")
FILE_SUFFIX = re.compile(r"\.(py|md|sh|yaml|yml|toml|txt|json|jsonl|csv|png|parquet|cfg|ini)$")
# a dotted rpg name: a module (rpg.math.fused), a name in one (rpg.math.fused.rpg_policy_loss) or a config key
# (rpg.loss.beta); or a name of the lab (rpg_lab.exact)
MODULE_REF = re.compile(r"(?<![\w.\-/])rpg(?:_lab)?(?:\.(?:[A-Za-z_*][\w*]*|<[\w -]+>|\{[\w,]+\}))+")
BARE_SOURCE = re.compile(r"`([\w.-]+\.(?:py|sh))(?:::[\w\[\]-]+)?`")  # a source file named alone, in Markdown
README_CITATION = re.compile(
    r"(?<![\w/.-])README(?:\.md)?(?:#([\w-]+)"  # README.md#anchor
    r"|,?\s*[\"“]([^\"”]{2,60})[\"”]"  # README, "Title"
    r"|\s*\(([^()\"]{2,60})\)"  # README (Title)
    r"|,\s*([^()\"]{2,60})\)"  # (README, Title)
    r"|'s\s+([A-Z][\w-]*(?:\s+[\w-]+)*))")  # README's Title ...
# what a reference may name although the tree does not hold it, by prefix -> why; one-letter names (rpg.x,
# rpg/a/b.py) are placeholders of examples, <...>, {a,b}, [optional] and * are patterns
NOT_IN_TREE = {
    "rpg.loss.divergance": "the mistyped key that the docs and the launcher show being refused",
    "recipe/dapo/": "verl's DAPO recipe, in verl's repository: the shape the recipe's entry point follows",
}
# records that keep the words they were written with: a declared study's plan (frozen: test_declared_plans.py), each
# attempt's command as it ran, the GPU runs' logs and summaries
RECORDS = re.compile(r"docs/study/[\w-]+/(?:PLAN\.md|attempts\.csv)|docs/gpu-runs/.+")
# the lab's packages that were in rpg/ when those records were written: old prefix -> where it is now
MOVED = {f"{old}{sep}{package}{end}": f"{new}{sep}{package}{end}"
         for package in ("study", "demo", "gpu_kit")
         for old, sep, new, end in (("rpg", ".", "rpg_lab", ""), ("rpg", "/", "lab/rpg_lab", "/"),
                                    ("tests", "/", "tests/lab", "/"))}


def moved(ref: str) -> str:
    """``ref`` (a dotted name or a path) at its place after the lab's packages left rpg/."""
    for old, new in MOVED.items():
        if ref == old or ref.startswith(old if old.endswith("/") else old + "."):
            return new + ref[len(old):]
    return ref


def _flatten(text: str) -> tuple[str, list[tuple[int, int]]]:
    """The text with each line break, its indentation and a comment marker (#, //) as one space, so that a
    citation wrapped over comment lines reads whole; and (flat offset, original offset) at each break."""
    pieces, marks, last = [], [(0, 0)], 0
    flat_len = 0
    for m in re.finditer(r"[ \t]*\n[ \t]*(?:#+|//)?[ \t]*", text):
        pieces.append(text[last:m.start()])
        flat_len += m.start() - last + 1
        pieces.append(" ")
        last = m.end()
        marks.append((flat_len, last))
    pieces.append(text[last:])
    return "".join(pieces), marks


def _line_col(text: str, marks: list[tuple[int, int]], flat_pos: int) -> tuple[int, int]:
    flat0, orig0 = max((fm for fm in marks if fm[0] <= flat_pos), key=lambda fm: fm[0])
    pos = orig0 + flat_pos - flat0
    return text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1)


@lru_cache(maxsize=None)
def _tree() -> tuple[frozenset[str], frozenset[str], dict[str, str]]:
    """Tracked files, their folders, and the modules of rpg and rpg_lab (dotted name -> file)."""
    files = frozenset(_tracked())
    folders = frozenset("/".join(Path(f).parts[:i]) for f in files for i in range(1, len(Path(f).parts)))
    modules = {}
    for f in files:
        if f.startswith(("rpg/", "lab/rpg_lab/")) and f.endswith(".py"):
            parts = f[:-3].removeprefix("lab/").split("/")
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return files, folders, modules


def expand(pattern: str) -> list[str]:
    """A reference's concrete patterns: ``{a,b}`` gives each, ``[x]`` both without and with x, ``<...>`` is ``*``."""
    pattern = re.sub(r"<[^<>]*>", "*", pattern)
    if m := re.search(r"\{([^{}]*)\}", pattern):
        return [p for alt in m.group(1).split(",") for p in expand(pattern[:m.start()] + alt + pattern[m.end():])]
    if (m := re.search(r"\[([^\[\]]*)\]", pattern)) and m.group(1) != "...":
        return [p for alt in ("", m.group(1)) for p in expand(pattern[:m.start()] + alt + pattern[m.end():])]
    return [pattern]


@lru_cache(maxsize=None)
def _matcher(pattern: str, sep: str):
    """``*`` matches within one path segment (``sep`` is / or .)."""
    return re.compile("".join(f"[^{re.escape(sep)}]*" if c == "*" else re.escape(c) for c in pattern)).fullmatch


def _placeholder(ref: str) -> bool:
    return any(len(part) == 1 and part.isalpha() for part in re.split(r"[/.]", ref)[1:])


def _allowed(ref: str) -> bool:
    return _placeholder(ref) or any(ref.startswith(prefix) for prefix in NOT_IN_TREE)


@lru_cache(maxsize=None)
def path_problem(ref: str) -> str | None:
    """Why a project path (``rpg/math/fused.py``, ``recipe/rpg/7b/*.sh``, ``tests/test_x.py::test_y``) names
    nothing."""
    ref = ref.rstrip(".,;:)]'\"`")
    ref, _, test = ref.partition("::")
    if not (FILE_SUFFIX.search(ref) or ref.endswith("/")) or _allowed(ref):
        return None
    files, folders, _ = _tree()
    for p in expand(ref):
        pool, p = (folders, p[:-1]) if p.endswith("/") else (files, p)
        hits = [f for f in pool if _matcher(p, "/")(f)] if "*" in p else [p] if p in pool else []
        if not hits:
            return f"{p}: no such {'folder' if pool is folders else 'file'}"
        name = re.sub(r"\[.*", "", test)
        if name and not any(re.search(rf"^\s*(?:async )?def {re.escape(name)}\b", _text(h) or "", re.M) for h in hits):
            return f"{p}::{name}: no such test or function"
    return None


def bare_problem(name: str, before: str) -> str | None:
    """Why a source file named alone (``settings.py``) is not there: in a table row whose first cell names a project
    path (``| `rpg/verl/block_to_verl.py`, `settings.py` |``), in that path's folder; else anywhere in the tree."""
    files = _tree()[0]
    first_cell = before.split("|")[1] if before.startswith("|") else ""
    paths = [p for p in PATH_REF.findall(first_cell) if not set(p) & set("*<{")]
    if paths:
        folder = paths[-1] if paths[-1].endswith("/") else paths[-1].rsplit("/", 1)[0] + "/"
        return None if folder + name in files else f"{name}: no such file in {folder}"
    return None if any(f.rsplit("/", 1)[-1] == name for f in files) else f"{name}: no such file"


@lru_cache(maxsize=None)
def module_names(module: str) -> frozenset[str]:
    """Names a module defines or imports at its top level; ``*`` when it has a PEP 562 ``__getattr__``."""
    names = set()
    for node in ast.parse(_text(_tree()[2][module]) or "").body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names | ({"*"} if "__getattr__" in names else set()))


@lru_cache(maxsize=None)
def _config_keys() -> tuple[str, ...]:
    from rpg.config import declared_keys

    return tuple(k.path for k in declared_keys(actor_fields=True))


@lru_cache(maxsize=None)
def module_problem(ref: str) -> str | None:
    """Why a dotted ``rpg`` name is neither a module, a name in one, nor a key of the ``rpg:`` block."""
    if _allowed(ref):
        return None
    modules = _tree()[2]
    for r in expand(ref):
        key = _matcher(r, ".")
        if any(k.startswith(r + ".") or r.startswith(k + ".") or key(k) for k in _config_keys()):
            continue  # rpg.loss, rpg.loss.beta, rpg.validation.samples_per_problem.minerva
        parts = r.split(".")
        for i in range(len(parts), 1, -1):  # the longest prefix that is a module, then a name in it
            prefix = ".".join(parts[:i])
            found = ([m for m in modules if _matcher(prefix, ".")(m)] if "*" in prefix
                     else [prefix] * (prefix in modules))
            if found:
                lazy = set() if "*" in prefix else {"*"}  # a PEP 562 module may hold any name, not a pattern's
                if i < len(parts) and not parts[i].startswith("__") and not any(
                        ({parts[i]} | lazy) & module_names(m) or _matcher(parts[i], ".")(n)
                        for m in found for n in module_names(m)):
                    return f"{r}: {prefix} has no module or name {parts[i]}"
                break
        else:
            return f"{r}: no such module or rpg: key"
    return None


def readme_problem(anchor: str | None, title: str | None) -> str | None:
    """Why a citation of README names no section: ``README.md#anchor`` or a title that begins no heading."""
    if anchor is not None:
        return None if anchor in anchors("README.md") else f"README.md#{anchor}: no such heading"
    headings = [github_anchor(h) for h in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", FENCE.sub("", _text("README.md")),
                                                     re.M)]
    words = github_anchor(title).split("-")
    if any(h.startswith(words[0]) for h in headings):  # README's Quick start install: "quick" begins a heading
        return None
    return f"README {title!r}: no section of README.md begins so"


@lru_cache(maxsize=None)
def _python_spans(text: str) -> tuple[tuple, tuple]:
    """(docstrings, other strings) of a Python file, each as (line, col, end line, end col) spans."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return (), ()
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)}
    spans: tuple[list, list] = ([], [])
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, str)):
            spans[id(n) not in docs].append((n.lineno, n.col_offset, n.end_lineno, n.end_col_offset))
    return tuple(spans[0]), tuple(spans[1])


def _in_prose(rel: str, text: str, line: int, col: int) -> bool:
    """Whether a position of a file is prose: anywhere outside Python; a docstring or a comment in Python (code
    and its strings, such as a test's made-up inputs, are not)."""
    if not rel.endswith(".py"):
        return True
    docs, strings = _python_spans(text)

    def inside(spans, at):
        return any((l0, c0) <= at < (l1, c1) for l0, c0, l1, c1 in spans)

    hashes = [c for c, ch in enumerate(text.splitlines()[line - 1][:col]) if ch == "#"]
    return inside(docs, (line, col)) or any(not inside(strings, (line, c)) for c in hashes)


def name_problems(rel: str, text: str) -> list[str]:
    """'file:line: what' for every project path, rpg name, bare source file name or README citation that names
    nothing in the tree (in Python files, in docstrings and comments)."""
    flat, marks = _flatten(text)
    now = moved if RECORDS.fullmatch(rel) else str
    found = [(m.start(), path_problem(now(m.group(0)))) for m in PATH_REF.finditer(flat)]
    found += [(m.start(), module_problem(now(m.group(0)))) for m in MODULE_REF.finditer(flat)
              if flat[m.end():m.end() + 2] != ": "]  # "rpg.elastic: restart 1/3": a printed line's prefix
    found += [(m.start(), readme_problem(m.group(1), next((g for g in m.groups()[1:] if g), None)))
              for m in README_CITATION.finditer(flat)]
    out = []
    if rel.endswith(".md"):
        for n, line in enumerate(text.splitlines(), 1):
            out += [f"{rel}:{n}: {why}" for m in BARE_SOURCE.finditer(line)
                    if (why := bare_problem(m.group(1), line[:m.start()]))]
    for pos, why in sorted(found, key=lambda f: f[0]):
        if why:
            line, col = _line_col(text, marks, pos)
            if _in_prose(rel, text, line, col):
                out.append(f"{rel}:{line}: {why}")
    return out


# ---------------------------------------------------------------- tests


def test_no_tracked_file_cites_what_a_user_cannot_follow():
    problems = [p for rel, text in sorted(_texts().items()) for p in reference_problems(rel, text)]
    assert not problems, "cite the paper's numbering or docs/*.md#anchor instead:\n" + "\n".join(problems)


def test_relative_links_in_readme_and_docs_resolve():
    sources = _link_sources()
    assert "README.md" in sources and "docs/math.md" in sources
    problems = [f"{src}: {why}" for src in sources for target in markdown_links(_text(src) or "")
                if (why := link_problem(src, target))]
    assert not problems, "\n".join(problems)


def test_every_file_module_and_readme_section_named_exists():
    """Project paths, rpg modules and names, rpg: keys, source files named alone and README citations, in every
    tracked text (Python: docstrings and comments), name what the tree holds."""
    problems = [p for rel, text in sorted(_texts().items()) for p in name_problems(rel, text)]
    assert not problems, ("name what exists (or, for what is legitimately not in the tree, a prefix in NOT_IN_TREE "
                          "with why):\n" + "\n".join(problems))


def test_docs_anchors_named_in_code_and_docs_resolve():
    problems = []
    for rel, text in sorted(_texts().items()):
        for mention in sorted(set(DOC_MENTION.findall(text))):
            why = link_problem("README.md", mention)  # relative to the project root
            if why:
                problems.append(f"{rel}: {why}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- the checks themselves


@pytest.mark.parametrize("line", [
    "see spec §2.7 for the weights", "(Spec T29)", "def test_spec_t29_x():", "this is the spec's reading",
    "../shared/spec/RPG_SPEC.md", "Path('..') / 'shared' / 'spec'", "reference notes §2.3", "notes §0.4",
    "(issue 4)", "Issue 11.9: prepare", "PR #23", "fixed in (#12)", "the brief: Tables 3", "SCHEMA.md",
    "x = 1  # spec §4.4", "probably truncated (spec section 6.2)",
])
def test_each_forbidden_form_is_caught(line):
    assert reference_problems("rpg/x.py", line), line


@pytest.mark.parametrize("line", [
    "pull request complex-reasoning/RPG#28", "https://github.com/volcengine/verl/issues/3061", "GRPO #3",
    "SourceSpec(key)", "See the License for the specific language", "Sec. 2.2, Eq. (4.1), App. G.2",
    "docs/math.md#rpg-style-clip", "color: #1f77b4", "run_spec = specs[0]",
    "paste the list into docs/launch-scripts.md §8",
])
def test_allowed_forms_pass(line):
    assert not reference_problems("rpg/x.py", line), line


@pytest.mark.parametrize("rel, text", [
    ("docs/x.md", "see `rpg/verl/settings.py`"), ("docs/x.md", "``rpg.verl.describe``"),
    ("docs/x.md", "the backends' ``rpg.backends.<name>.settings``"), ("docs/x.md", "`recipe/rpg/7b/run_nothing.sh`"),
    ("docs/x.md", "tests/math/test_losses_exact.py::test_no_such_identity"), ("docs/x.md", "`docs/nowhere/`"),
    ("docs/x.md", "| `rpg/config/` | `block.py`, `render.py` |"), ("docs/x.md", "`settings.py` holds it"),
    ("docs/x.md", "`rpg.loss.no_such_key`"), ("docs/x.md", "`rpg.math.fused.no_such_function`"),
    ("pyproject.toml", "# README (Set-up) names it"), ("requirement.txt", "# its wheel (README.md,\n# Set-up), or"),
    ("tests/x.py", '"""(README, "A Hugging Face model from a checkpoint")."""'),
    ("tests/x.py", "x = 1  # README's Tests section"), ("docs/x.md", "[README](../README.md) README.md#no-such"),
    ("tests/x.py", "# see rpg/nothing.py"), ("tests/x.py", "def f():\n    '''rpg.verl.nothing'''\n"),
])
def test_each_missing_name_is_caught(rel, text):
    assert name_problems(rel, text), text


@pytest.mark.parametrize("rel, text", [
    ("docs/x.md", "`rpg.loss.beta`, `rpg.loss.*`, rpg.validation.samples_per_problem.minerva, `rpg.reference.mode`"),
    ("docs/x.md", "`rpg.math.fused.rpg_policy_loss`, ``rpg.backends.<name>.backend``, `rpg.reward.__file__`, "
                  "`rpg.config`"),
    ("docs/x.md", "`recipe/rpg/config/experiment/<run name>.yaml`, `tests/math/test_losses_*.py`, "
                  "recipe/rpg/{7b,4b}/*.sh"),
    ("docs/x.md", "`rpg/config/`, tests/math/test_losses_exact.py::test_t3_pointwise_identity, "
                  "`rpg/math/fused.py:168`"),
    ("docs/x.md", "README's Quick start, README.md#layout, (README, \"Reproducing the paper\"), README (Layout)"),
    ("docs/x.md", "`rpg.elastic: restart 1/3`, `-m rpg.x`, `rpg/a/b.py` (placeholders), outputs/tiny_cpu/x.json"),
    ("docs/x.md", "verl's `verl/trainer/ppo/core_algos.py`, `fused.py`, docs/study/lag/runs.csv"),
    ("docs/x.md", "| `rpg/verl/block_to_verl.py`, `policy_loss.py` | the metric rpg/kl_estimate |"),
    ("tests/x.py", 'planted = {"rpg/nothing.py": "import rpg.nowhere"}  # made-up inputs of a test'),
])
def test_names_that_exist_or_are_allowed_pass(rel, text):
    assert not name_problems(rel, text), name_problems(rel, text)


def test_the_allow_list_names_nothing_the_tree_holds():
    """An entry of NOT_IN_TREE that the tree now holds is stale."""
    files, folders, modules = _tree()
    assert not [p for p in NOT_IN_TREE if p in files or p.rstrip("/") in folders or p in modules]


def test_github_anchor_rule():
    assert github_anchor("GRPO's KL and its correction") == "grpos-kl-and-its-correction"
    assert github_anchor("Per-token KL pieces (`rpg.math.divergences`)") == "per-token-kl-pieces-rpgmathdivergences"
    assert github_anchor("7. Readings (settings the paper leaves open)") == "7-readings-settings-the-paper-leaves-open"
    assert github_anchor("[Link](x.md) text") == "link-text"


def test_link_check_catches_missing_files_and_anchors():
    assert link_problem("docs/math.md", "losses.md") is None
    assert link_problem("docs/math.md", "data-and-reports.md#comparing-with-the-authors-logs") is None
    assert link_problem("docs/math.md", "#testable-identities") is None
    assert "no such file" in link_problem("docs/math.md", "no-such-page.md")
    assert "no heading" in link_problem("docs/math.md", "losses.md#no-such-heading")
    assert "outside the project" in link_problem("README.md", "../elsewhere.md")
    assert link_problem("README.md", "https://example.org/x#y") is None
    # code is not a link, a heading inside a fenced block is not a heading
    assert markdown_links("`[a](b.md)`\n```\n[c](d.md)\n```\n[e](f.md)") == ["f.md"]
    page = anchors("docs/data-and-reports.md")
    assert "comparing-with-the-authors-logs" in page
    assert github_anchor("data/dapo-math-17k-en.parquet  (train, ~13.9k problems)") not in page  # a shell comment
