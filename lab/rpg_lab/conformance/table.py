"""The report's rows: each setting of the catalogue scored on every scenario, its frameworks' probes run where they
live, the seeds of a (shape, sampler) folded into one row (the largest error, the smallest cosine, the divergences
matched in every seed). A framework that cannot be run, or a setting it refuses, is one row that says why.
"""

from __future__ import annotations

import csv
import math
import subprocess
from pathlib import Path

import torch

from rpg_lab.conformance import catalogue, environments, scoring
from rpg_lab.conformance.scenarios import Scenario, scenarios
from rpg_lab.exact import DIVERGENCES

COLUMNS = ("framework", "version", "setting", "label", "form", "default", "target", "call", "precision", "T", "V",
           "kl_mu_pi",
           "seeds", "matches", *[f"{m}_{d}" for d in DIVERGENCES for m in ("rel_err", "cos")], "status")
SCORED = "scored"


def _fold(setting, framework, version, scns: list[Scenario], terms: list[dict], targets: list[dict]) -> dict:
    """One row of ``setting`` over the seeds of one (shape, sampler)."""
    rtol = scoring.MATCH_RTOL[getattr(torch, framework.precision)]
    scores, matched = [], None
    for scn, t, tg in zip(scns, terms, targets):
        d = scoring.distances(scoring.expected_gradient(scn, t, setting.form), tg)
        scores.append(d)
        m = set(scoring.matches(d, rtol).split())
        matched = m if matched is None else matched & m
    row = _row(setting, framework, version, scns[0], status=SCORED)
    row["seeds"] = " ".join(str(s.seed) for s in scns)
    row["matches"] = " ".join(sorted(matched, key=["zero", "none", *DIVERGENCES].index)) or "none"
    for div in DIVERGENCES:  # a zero gradient has no direction: its cosine is left empty
        row[f"rel_err_{div}"] = max(s[f"rel_err_{div}"] for s in scores)
        cosines = [s[f"cos_{div}"] for s in scores]
        row[f"cos_{div}"] = math.nan if "zero" in matched or any(map(math.isnan, cosines)) else min(cosines)
    return row


def _row(setting, framework, version, scn: Scenario | None, status: str) -> dict:
    row = {**dict.fromkeys(COLUMNS, ""), "T": None, "V": None, "kl_mu_pi": None}  # as read_csv reads an empty cell
    row.update(framework=setting.framework, version=version, setting=setting.key, label=setting.label,
               form=setting.form, default=setting.default, target=setting.target, call=setting.call,
               precision=framework.precision,
               status=status)
    if scn is not None:
        row.update(T=scn.space.T, V=scn.space.V, kl_mu_pi=scn.distance)
    return row


def framework_rows(name: str, scns: list[Scenario], targets: list[dict], envs: Path | None = None) -> list[dict]:
    """The rows of one framework: its probe run once on every scenario, its settings folded per (shape, sampler)."""
    framework = catalogue.FRAMEWORKS[name]
    settings = [s for s in catalogue.SETTINGS if s.framework == name]
    try:
        result = environments.run_probe(framework.env, framework.probe, [s.batch([x.key for x in settings])
                                                                           for s in scns], envs)
    except (ValueError, RuntimeError, subprocess.TimeoutExpired) as error:
        return [_row(s, framework, "", None, f"not run: {str(error).splitlines()[0][:300]}") for s in settings]
    version = result["version"]
    if version != framework.version:
        return [_row(s, framework, version, None, f"not scored: version {version} installed, "
                     f"{framework.version} pinned") for s in settings]
    rows = []
    groups = {}
    for i, scn in enumerate(scns):
        groups.setdefault((scn.space.T, scn.space.V, scn.distance), []).append(i)
    for setting in settings:
        first = result["terms"][0][setting.key]
        if "error" in first:
            rows.append(_row(setting, framework, version, None, f"refused: {first['error']}"))
            continue
        rows += [_fold(setting, framework, version, [scns[i] for i in idx],
                       [result["terms"][i][setting.key] for i in idx], [targets[i] for i in idx])
                 for idx in groups.values()]
    return rows


def build(frameworks=None, envs: Path | None = None) -> list[dict]:
    """Every framework's rows (``frameworks``: a subset of catalogue.FRAMEWORKS' names), in the catalogue's order."""
    scns = scenarios()
    targets = [scoring.target_gradients(s) for s in scns]
    names = [n for n in catalogue.FRAMEWORKS if frameworks is None or n in frameworks]
    return [row for name in names for row in framework_rows(name, scns, targets, envs)]


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6e}" if isinstance(v, float) and k.startswith(("rel_err", "cos")) else v)
                             for k, v in row.items()})


def read_csv(path: Path) -> list[dict]:
    """The rows as written: numbers back as floats (NaN for an undefined cosine), ``default`` as a bool."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["default"] = row["default"] == "True"
        for k in COLUMNS:
            if k.startswith(("rel_err", "cos")) and row[k] != "":
                row[k] = float(row[k])
        for k in ("T", "V"):
            row[k] = int(row[k]) if row[k] != "" else None
        row["kl_mu_pi"] = float(row["kl_mu_pi"]) if row["kl_mu_pi"] != "" else None
    return rows
