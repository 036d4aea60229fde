"""Docs a user can follow: no tracked file cites material that is not shipped, and every link resolves.

Code, docs, tests and the recipe cite the paper's own numbering (Sec., Eq., Table, Algorithm, App.) or
the project's docs (``docs/*.md#anchor``). They must not cite the developers' private notes (a "spec"
with § numbers, reference notes, measurement files), files outside the project (``../shared/spec``)
or the project's tracker ("issue 4", "(#12)", "the brief"): a user has none of them. Other projects'
issues and pull requests are cited as ``owner/repo#N`` or by URL, which is allowed.

Links: every relative Markdown link in README.md and docs/ must name an existing project file, and a
``#anchor`` must be a heading of the target (GitHub's anchor rule). Every ``docs/<page>.md#anchor``
mentioned anywhere (docstrings, comments) must resolve the same way.
"""

from __future__ import annotations

import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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


def _texts() -> dict[str, str]:
    return {rel: t for rel in _tracked() if rel != THIS and (t := _text(rel)) is not None}


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


def test_github_anchor_rule():
    assert github_anchor("GRPO's KL and its correction") == "grpos-kl-and-its-correction"
    assert github_anchor("Per-token KL pieces (`rpg.divergences`)") == "per-token-kl-pieces-rpgdivergences"
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
