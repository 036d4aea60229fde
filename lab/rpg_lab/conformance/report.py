"""The report, from the table's rows alone (``table.read_csv``) and the catalogue's words: docs/conformance.md and its
figure. Every number and every reading sentence is computed from the rows, so a test rebuilds the committed report
from the committed CSV.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from rpg_lab.conformance import catalogue
from rpg_lab.conformance.scenarios import DISTANCES, ON_POLICY, SHAPES
from rpg_lab.conformance.table import SCORED

REGIMES = (ON_POLICY, *DISTANCES)
NAMES = {"rkl": "reverse KL", "fkl": "forward KL", "urkl": "reverse KL", "ufkl": "forward KL"}
SHORT = {"rkl": "RKL", "fkl": "FKL"}
CSV_NAME, FIGURE_NAME = "conformance.csv", "conformance.png"


def _regime(d: float) -> str:
    return "on-policy" if d == ON_POLICY else f"KL(μ‖πθ) = {d:g}"


def _label(row: dict) -> str:
    """What the term's gradient is: 'rkl' (= urkl), 'fkl' (= ufkl), 'zero' or 'none'."""
    m = row["matches"].split()
    return "rkl" if "rkl" in m else "fkl" if "fkl" in m else m[0]


def _target_err(row: dict) -> float:
    return row[f"rel_err_{row['target']}"]


def cell(row: dict) -> str:
    """A table cell: the divergence matched and the largest relative error to it, 'zero', or the relative error and
    the cosine against the divergence the setting is meant to regularise."""
    label = _label(row)
    if label in SHORT:
        return f"= {SHORT[label]} ({row[f'rel_err_{label}']:.0e})"
    if label == "zero":
        return "zero"
    cos = row["cos_" + row["target"]]
    return f"{_target_err(row):.2g} (cos {'—' if math.isnan(cos) else f'{cos:.2f}'})"  # —: a seed's gradient is 0


def _phrase(rows: list[dict]) -> str:
    """What a setting's gradient is over some samplers, in words, from its rows (one per sampler, in order)."""
    by_label = defaultdict(list)
    for row in rows:
        by_label[_label(row)].append(row)
    parts = []
    for label, group in by_label.items():
        where = "" if len(by_label) == 1 else " at " + ", ".join(_regime(r["kl_mu_pi"]) for r in group)
        if label in SHORT:
            parts.append(f"the {NAMES[label]}'s gradient{where}")
        elif label == "zero":
            parts.append(f"a zero expected gradient{where}")
        else:
            errors = [_target_err(r) for r in group]
            span = f"{min(errors):.2g}" if len(errors) == 1 else f"{min(errors):.2g} to {max(errors):.2g}"
            parts.append(f"no divergence's gradient{where} (relative error {span} against the "
                         f"{NAMES[group[0]['target']]}'s)")
    return "; ".join(parts)


class Rows:
    """The scored rows by (framework, setting) and by shape, in the CSV's order."""

    def __init__(self, rows: list[dict]):
        self.rows = rows
        self.settings = list(dict.fromkeys((r["framework"], r["setting"]) for r in rows))
        self.of = defaultdict(list)
        for r in rows:
            self.of[(r["framework"], r["setting"])].append(r)

    def first(self, key) -> dict:
        return self.of[key][0]

    def at(self, key, T: int) -> list[dict]:
        return sorted((r for r in self.of[key] if r["T"] == T), key=lambda r: r["kl_mu_pi"])

    def sequences(self, key) -> list[dict]:
        return [r for r in self.of[key] if r["T"] is not None and r["T"] > 1]

    def scored(self, key) -> bool:
        return self.first(key)["status"] == SCORED


def _describe(rows: Rows, key) -> str:
    """The setting's gradient off-policy, then on-policy, with one token and over sequences, from its rows."""
    if not rows.scored(key):
        return rows.first(key)["status"]
    one = rows.at(key, SHAPES[0][0])
    seq = rows.sequences(key)
    seq_on = [r for r in seq if r["kl_mu_pi"] == ON_POLICY]
    seq_off = [r for r in seq if r["kl_mu_pi"] != ON_POLICY]
    return (f"off-policy it gives {_phrase(one[1:])} with one token and {_phrase_shapes(seq_off)} with two or "
            f"three; on-policy {_phrase(one[:1])} with one token and {_phrase_shapes(seq_on)} with two or three")


def _phrase_shapes(rows: list[dict]) -> str:
    labels = {_label(r) for r in rows}
    if len(labels) == 1 and labels <= {"rkl", "fkl", "zero"}:
        return _phrase(rows[:1])
    errors = [_target_err(r) for r in rows]
    matched = sorted({_regime(r["kl_mu_pi"]) for r in rows if _label(r) != "none"})
    also = f", matching at {', '.join(matched)} only" if matched else ""
    return (f"no divergence's gradient (relative error {min(errors):.2g} to {max(errors):.2g} against the "
            f"{NAMES[rows[0]['target']]}'s{also})")


def readings(rows: Rows) -> list[str]:
    """One sentence per framework: its default term's gradient, as the rows show it."""
    out = []
    for name, fw in catalogue.FRAMEWORKS.items():
        keys = [k for k in rows.settings if k[0] == name and rows.first(k)["default"]]
        if not keys:
            continue
        version = rows.first(keys[0])["version"] or fw.version
        clauses = "; ".join(f"as its {rows.first(k)['form']} `{rows.first(k)['setting']}`, "
                            f"{_describe(rows, k)}" for k in keys)
        out.append(f"**{name} {version}** ({fw.by_default}): {clauses}.")
    return out


def claims(rows: Rows) -> list[str]:
    out = []
    for claim in catalogue.CLAIMS:
        verdicts = "; ".join(f"`{key}`: {_describe(rows, (claim.framework, key))}" for key in claim.settings
                             if (claim.framework, key) in rows.of)
        out.append(f"**{claim.framework}**: {claim.says}. The table: {verdicts}.")
    return out


def table(rows: Rows, T: int, V: int, framework_filter=None) -> list[str]:
    head = ["| framework | setting | form | " + " | ".join(_regime(d) for d in REGIMES) + " |",
            "|---|---|---|" + "---|" * len(REGIMES)]
    body = []
    for key in rows.settings:
        first = rows.first(key)
        star = " ★" if first["default"] else ""
        name = f"{first['framework']} {first['version']}".strip()
        if not rows.scored(key):
            cells = [first["status"]] + [""] * (len(REGIMES) - 1)
        else:
            cells = [cell(r) for r in rows.at(key, T)]
        body.append(f"| {name} | `{first['setting']}`{star} | {first['form']} | " + " | ".join(cells) + " |")
    return [f"**T = {T}, V = {V}** ({V**T} sequences): expected gradient of the term (β = 1) against the exact "
            "gradient; `= RKL (e)`: it is the reverse KL's (= URKL's, T4), largest relative error e over the seeds; "
            "`= FKL`: the forward KL's; `zero`; otherwise the largest relative error and the smallest cosine against "
            "the divergence the setting is meant to regularise (the frameworks': reverse KL; RPG's: its own).", "",
            *head, *body, ""]


def settings_table(rows: Rows) -> list[str]:
    whys = {(s.framework, s.key): s.why for s in catalogue.SETTINGS}
    out = ["| framework | setting | what a user sets | function and code path | one token: why |", "|---|---|---|---|---|"]
    for key in rows.settings:
        first = rows.first(key)
        out.append(f"| {first['framework']} | `{first['setting']}` | {first['label']} | {first['call']} | "
                   f"{whys.get(key, '')} |")
    return out


def frameworks_table(rows: Rows) -> list[str]:
    out = ["| framework | version | by default | installed | computes in |", "|---|---|---|---|---|"]
    for name, fw in catalogue.FRAMEWORKS.items():
        keys = [k for k in rows.settings if k[0] == name]
        version = rows.first(keys[0])["version"] if keys else ""
        out.append(f"| {name} | {version or 'not run'} | {fw.by_default} | {fw.install} | {fw.precision} |")
    return out


INTRO = """# KL-gradient conformance: which gradient each framework's KL term gives

<!-- written by `python -m rpg_lab.conformance` from conformance/conformance.csv; a test rebuilds it from that file -->

Every major RL framework for LLMs ships a KL term, as a loss or folded into the reward, with its own estimator (k1,
k2, k3) and importance weights. This report calls each framework's own code, at its released version, and scores
the **expected gradient** of its term against the **exact gradients** of the divergences it may be meant to
regularise: the reverse KL(πθ‖π_ref), the forward KL(π_ref‖πθ) and their unnormalised forms (which have the same
gradients when both policies are normalised, T4). Everything is exact: small tabular autoregressive policies,
every sequence enumerated, float64, no sampling. The identities (T1-T30) are [math.md](math.md#testable-identities)'s.

![each default KL term's relative error against the divergence it is meant to regularise](conformance/conformance.png)
"""

METHOD = """## How it is computed

* **Policies** (`rpg_lab.conformance.scenarios`): for each shape (T tokens over a vocabulary of V: 1 × 6, 2 × 4,
  3 × 3) and seed (0, 1, 2), πθ, π_ref and a direction are drawn as standard normal logits, one row per prefix.
  The sampler μ is πθ itself (on-policy) or πθ moved along the direction until KL(μ‖πθ), over whole sequences,
  is 0.01, 0.1, 0.3 or 1 (Newton's steps, to 1e-12). μ plays the old policy of PPO-style training: its samples,
  its log-probs recorded with them (π_old = μ), θ moved on since. The reference π_ref is fixed (GRPO's setting).
* **Exact gradients** (`scoring.target_gradients`): autograd of the closed-form divergences between the sequence
  distributions (`rpg_lab.exact`).
* **A term as a loss**: the framework's function gets the whole enumerated batch (`l = log πθ(y_t|y_<t)`, the
  sampler's `l_μ` as its old log-probs, `l_ref`) and returns its per-token term; its slope ∂Σ_t term_t/∂l_s per
  token (autograd through the framework's code) weighted by μ(y) gives E_μ[∇Σ_t term_t] exactly. TRL has no KL
  function: its `GRPOTrainer.compute_loss` runs on a model whose LM head holds the policy's logits
  (`probes/trl_kl.py`), and the gradient is read on the head.
* **A KL in the reward**: the framework's per-token KL of the sampler's log-probs, summed over the sequence, is
  every token's negative advantage (no baseline, γ = 1: the KL part of a REINFORCE-style return) in PPO's
  unclipped loss with the per-token ratio w_t = πθ/μ, which all four frameworks apply; the expected gradient is
  Σ_y μ(y) Σ_t w_t·Σ_s kl_s(y)·∇l_t.
* **Scale**: β = 1; a framework's aggregation divides by a positive constant here (every sequence has T tokens),
  left out. The relative error is ‖g − ∇D‖/‖∇D‖ and the cosine ⟨g, ∇D⟩/(‖g‖‖∇D‖), worst over the seeds.
  A term **matches** a divergence when its relative error is below 1e-10 in every seed (1e-5 for a framework
  whose KL code computes in float32: TRL's fused LM head, OpenRLHF's and AReaL's `.float()`).
* **One token vs sequences**: with T = 1 a token is a sequence and the paper's identities apply as written. With
  T > 1 a per-token term is scored against the KL between sequence distributions; a per-token surrogate then
  misses how a token changes the distribution of the tokens after it (the prefix weights of T27,
  [math.md](math.md#tokens-and-sequences)), which the table measures. The anchor here is a fixed π_ref; with the
  anchor at the sampler (π_ref = μ, RPG's default iterative reference) RPG's forward losses are exact over
  sequences too (T26) and its reverse ones are not (T27): the suite checks both on these policies.
"""

REBUILD = """## Rebuilding

```bash
bash lab/scripts/setup_conformance.sh        # the frameworks' environments in .venv-conformance/ (about 10 minutes)
python -m rpg_lab.conformance                # all rows, this file, conformance/conformance.csv and the figure
python -m rpg_lab.conformance --render-only  # this file and the figure from the CSV
```

`tests/lab/conformance/test_conformance_report.py` rebuilds this file from the committed CSV and checks the
harness on known answers; `tests/lab/conformance/test_conformance_frameworks.py` (the `conformance` stage of
.ci/run, in the environments of the set-up) runs every framework again and compares each row with the CSV.
"""


def render_markdown(rows: list[dict]) -> str:
    r = Rows(rows)
    shapes = [table(r, T, V) for T, V in SHAPES]
    lines = [INTRO, "## Reading", "", *[f"* {s}" for s in readings(r)], "",
             "## What the documentation says, and the table", "", *[f"* {s}" for s in claims(r)], "",
             "## One token", "", *shapes[0], "## Sequences", "", *[line for t in shapes[1:] for line in t],
             "## The settings and the code called", "", *settings_table(r), "",
             "## The frameworks", "", *frameworks_table(r), "", METHOD, REBUILD]
    return "\n".join(lines).rstrip() + "\n"


def render_figure(rows: list[dict], path: Path) -> None:
    """Each default term's relative error (and RPG's corrected GRPO KL's) against the divergence it is meant to
    regularise, per sampler, with one token and with three; lines that coincide are shifted sideways a little."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = Rows(rows)
    keys = [k for k in r.settings if r.scored(k) and (r.first(k)["default"] or k == ("RPG", "grpo_corrected"))]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    for ax, (T, V) in zip(axes, (SHAPES[0], SHAPES[-1])):
        for i, key in enumerate(keys):
            errors = [max(_target_err(row), 1e-17) for row in r.at(key, T)]
            x = [j + 0.06 * (i - len(keys) / 2) for j in range(len(REGIMES))]
            ax.plot(x, errors, marker="osD^v<>P*X"[i % 10], label=f"{key[0]} {key[1]}")
        ax.set_yscale("log")
        ax.set_xticks(range(len(REGIMES)), ["on-policy", *[f"{d:g}" for d in DISTANCES]])
        ax.set_xlabel("sampler: KL(μ‖πθ) over whole sequences")
        ax.set_title(f"T = {T}, V = {V}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("relative error of E[∇term] against ∇D\n(D: reverse KL; RPG's rows: their own)")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
