"""The study's runs on disk: each run's folder and ``run.json``, its overrides and identity, and what a study
finds before it starts (``survey``: the same for ``--dry-run`` and the real start).

A folder with a ``run.json`` is never deleted: one whose run runs again (its settings changed, it failed and is
retried, or it was made by other code or threads and ``--rerun-other-code`` says to redo it) is moved to
``<out>/stale/<run id>.<n>`` first (``move_aside``).

A finished run is reused only when it was made with this start's settings (its identity), code (the commit and any
uncommitted changes, ``rpg.run_record.code_state``) and torch threads per process (``threads_of``): a finished
run of other code or threads is named at the start, and the start refuses (``Survey.refusal``) unless told to
redo it.

A declared study's runs.csv (in its ``--report-dir``, committed) outlives ``out``: a run it records as finished whose
folder is gone (``out`` was on another machine) is *recorded*: kept as its row, not run again, when the row's settings
digest is this start's, its threads are this start's and its code is this one (the commit and uncommitted changes
the row records) or one the start names (``keep_codes``, ``--keep-recorded-code``; a row that records its code but
not its commit and changes is kept only when named). A recorded row of other settings stops the start (its row would
be replaced); one of other code or threads stops it unless named (code only) or redone (``--rerun-other-code``). A
run it records as failed whose folder is gone stays failed, its row carried, and runs again only with
``--retry-failed``, as a failed run's folder would.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from rpg_lab.study.grid import Costs, RunSpec, fmt_duration
from rpg.run_record import code_state
from rpg_lab.study.identity import identity, legacy_identity, other_code

RUN_RECORD = "run.json"
RECORDED = "recorded"  # a record's key: the runs.csv row it stands for (the run's folder is gone)
STALE_DIR = "stale"  # <out>/stale/<run id>.<n>: the folders of runs that ran again


def run_dir(out: Path, spec: RunSpec) -> Path:
    return Path(out) / "runs" / spec.run_id


def read_record(out: Path, spec: RunSpec) -> dict | None:
    path = run_dir(out, spec) / RUN_RECORD
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return rec if isinstance(rec, dict) else None


def recorded_record(row: dict) -> dict:
    """The record of a run kept as its runs.csv ``row`` (its folder gone): its status (finished or failed), code and
    threads, and the row itself under ``RECORDED`` (runs.csv carries it over as it is)."""
    return {"run_id": row["run_id"], "status": row["status"], "code": row.get("code"), "threads": row.get("threads"),
            RECORDED: row}


def records_now(out: Path, specs: list[RunSpec], recorded: dict[str, dict] | None = None) -> list[dict]:
    """Each run's record: its folder's ``run.json``, else its ``recorded`` runs.csv row (``recorded_record``), else
    ``{}`` (not run)."""
    recorded = recorded or {}
    return [read_record(out, s) or (recorded_record(recorded[s.run_id]) if s.run_id in recorded else {})
            for s in specs]


def all_records(out: Path) -> list[dict]:
    """Records of every run under ``out`` (any grid): the measured costs for the time estimate."""
    recs = []
    for path in sorted((Path(out) / "runs").glob(f"*/{RUN_RECORD}")):
        try:
            recs.append(json.loads(path.read_text()))
        except json.JSONDecodeError:
            continue
    return recs


def _assets(model: str = "tiny"):
    """What a run of ``model`` reads, its paths absolute (the runs' overrides and identities name them): the tiny
    assets' build (built once); SmolLM2's model and task folders where they are planned (the study builds them
    before its first run: ``rpg_lab.study.smol.build_assets``; a dry run builds nothing)."""
    if model == "smol":
        from rpg.smol.build import SmolAssets, planned_assets

        planned = planned_assets()
        return SmolAssets(planned.model_dir.resolve(), planned.task_dir.resolve())
    from rpg.tiny import TinyAssets, build_tiny_assets

    return TinyAssets.at(build_tiny_assets().root.resolve())


def _asset_roots(model: str):
    """The folders a run's identity names by content (``rpg_lab.study.identity``)."""
    assets = _assets(model)
    if model == "smol":
        return {"smol-model:": assets.model_dir, "smol-task:": assets.task_dir}
    return assets.root


def spec_overrides(spec: RunSpec, out: Path) -> list[str]:
    """All overrides of one run: what ``RPG_BACKEND=cpu`` launches for the method, then the study's."""
    from rpg.paths.checkout import CHECKOUT
    from rpg.launch.environment import Request
    from rpg.launch.plan import plan
    from rpg_lab.study.methods import method_run

    d = run_dir(out, spec).resolve()
    env = {"LOGGER": "console,file", "PROJECT_NAME": "rpg_study", "EXP_NAME": spec.run_id, "RPG_BACKEND": "cpu",
           "CKPTS_DIR": str(d / "ckpts"), "VERL_FILE_LOGGER_ROOT": str(d / "logs"), "TENSORBOARD_DIR": str(d / "tb")}
    if spec.model != "tiny":  # the rehearsal's switch (rpg.launch.rehearsal): its model, task and sizes
        env["RPG_CPU_MODEL"] = spec.model
    return plan(method_run(spec.variant), Request.read(env, CHECKOUT), spec.study_overrides(_assets(spec.model)))


def run_env(spec: RunSpec, overrides: list[str]) -> dict[str, str]:
    """The environment variables a run is launched with besides the study's own (SmolLM2's torch threads:
    ``rpg.launch.rehearsal.CpuModel.run_env``)."""
    from rpg.launch.rehearsal import CpuModel

    return CpuModel(spec.model).run_env(overrides)


def threads_of(env: dict[str, str]) -> str:
    """Torch's threads per process of a run launched with ``env`` from this process: ``OMP_NUM_THREADS`` as the CPU
    backend passes it (``rpg.backends.cpu.env_overrides.cpu_env``: the user's value, else one)."""
    from rpg.backends.cpu.env_overrides import cpu_env

    return cpu_env(base={**os.environ, **env})["OMP_NUM_THREADS"]


def other_run(rec: dict, code: dict, threads: str) -> str | None:
    """Why a finished run's record ``rec`` was made by other code (``rpg_lab.study.identity.other_code``) or with other
    threads than ``code`` and ``threads`` give now, or None."""
    why = [w for w in (other_code(rec, code),) if w]
    if rec.get("threads") is None:
        why.append(f"threads not recorded, now {threads}")
    elif str(rec["threads"]) != threads:
        why.append(f"threads {rec['threads']}, now {threads}")
    return "; ".join(why) or None


def spec_identity(spec: RunSpec, out: Path, overrides: list[str]) -> list:
    """The identity (``rpg_lab.study.identity``) of ``spec`` launched with ``overrides`` in ``out``."""
    return identity(overrides, out, _asset_roots(spec.model))


def status(out: Path, spec: RunSpec, overrides: list[str] | None = None) -> str:
    """``done`` | ``failed`` | ``stale`` (recorded with other settings) | ``todo``. The settings are compared by
    identity: the same overrides with the study or the assets elsewhere, or a value written another way (a path
    quoted since), are the same run."""
    return _state(read_record(out, spec), spec, None if overrides is None else spec_identity(spec, out, overrides))


def _state(rec: dict | None, spec: RunSpec, ident: list | None) -> str:
    if rec is None:
        return "todo"
    if ident is not None and recorded_identity(rec, spec) != ident:
        return "stale"
    return rec.get("status", "todo")


def recorded_identity(rec: dict, spec: RunSpec) -> list | None:
    """A record's identity: the one it holds, or its overrides' (a record written with absolute paths only);
    None when neither can be read."""
    from rpg.override_lists import OverrideSyntaxError

    if isinstance(rec.get("identity"), list):
        return rec["identity"]
    try:
        return legacy_identity(rec.get("overrides") or [], spec.run_id, _assets().root)
    except (OverrideSyntaxError, TypeError):
        return None


@dataclass
class Survey:
    """What a study on ``out`` finds before it starts (``survey``): the same for ``--dry-run`` and the real start."""

    out: Path
    specs: list[RunSpec]
    overrides: list[list[str]]
    identities: list[list]
    # status() of each spec, or "other": finished with these settings by other code or threads; "recorded",
    # "recorded-other", "recorded-stale": a finished run kept only as its runs.csv row (``_recorded_state``)
    states: list[str]
    before: list[str]  # the status its run.json records ("" without one, "unreadable")
    retry_failed: bool
    threads: list[str]  # each run's torch threads per process (``threads_of``)
    others: list[str | None]  # why a run is "other" (``other_run``), else None
    rerun_other: bool = False

    def runs(self, i: int) -> bool:
        if self.states[i] in ("other", "recorded-other"):
            return self.rerun_other
        if self.states[i] in ("recorded", "recorded-stale"):
            return False
        if self.states[i] == "recorded-failed":
            return self.retry_failed
        return self.states[i] not in (("done",) if self.retry_failed else ("done", "failed"))

    def refusal(self) -> str | None:
        """The line a start without ``--rerun-other-code`` stops with when a finished run of other code or threads is
        in ``out`` or recorded in runs.csv only (it is never reused in silence), or with or without it when a recorded
        row's settings are not this start's (its row is never replaced in silence), else None."""
        for st, what, how in (
                ("recorded-stale", "with other settings", "their rows would be replaced: start with the settings "
                 "that made them, or move runs.csv away"),
                ("recorded-other", "by other code or threads", "--keep-recorded-code CODE keeps the rows of that code "
                 "as recorded (other threads: start with the threads that made them, OMP_NUM_THREADS), "
                 "--rerun-other-code runs them again (their rows replaced)")):
            found = [i for i, s in enumerate(self.states) if s == st]
            if found and (st == "recorded-stale" or not self.rerun_other):
                return (f"{len(found)} finished run(s) recorded in runs.csv only (their folders not in --out "
                        f"{self.out}) were made {what}: {self.specs[found[0]].run_id}: {self.others[found[0]]}"
                        f"{'; ...' if len(found) > 1 else ''}; {how}")
        other = [i for i, st in enumerate(self.states) if st == "other"]
        if not other or self.rerun_other:
            return None
        first = self.specs[other[0]].run_id
        return (f"{len(other)} finished run(s) in --out {self.out} were made by other code or threads, not reused: "
                f"{first}: {self.others[other[0]]}{'; ...' if len(other) > 1 else ''}; --rerun-other-code runs them "
                f"again (their folders moved to {self.out / STALE_DIR}, kept), or start from the code and threads "
                "that made them")

    @property
    def todo(self) -> list[int]:
        return [i for i in range(len(self.specs)) if self.runs(i)]

    @property
    def aside(self) -> list[int]:
        """The runs that run again although their folder holds a ``run.json``: moved to ``<out>/stale`` first."""
        return [i for i in self.todo if self.before[i]]

    def line(self, costs: Costs, jobs: int) -> str:
        """The study's start line: counts, estimate, and the runs redone with where their old folders go."""
        kept_failed = 0 if self.retry_failed else self.states.count("failed") + self.states.count("recorded-failed")
        todo = [self.specs[i] for i in self.todo]
        recorded = self.states.count("recorded")
        text = (f"{len(self.specs)} runs: {self.states.count('done') + recorded} finished"
                + (f" ({recorded} of them recorded in runs.csv only, their folders not in --out: kept as recorded)"
                   if recorded else "") + f", {kept_failed} failed (not retried "
                f"without --retry-failed), {len(todo)} to run, {jobs} at a time (estimate "
                f"{fmt_duration(costs.grid_s(todo, jobs))}); output {self.out}")
        before = [self.before[i] if self.states[i] != "other" else "other" for i in self.aside]
        what = {"done": "finished run(s) will be redone (their settings changed)",
                "other": "finished run(s) of other code or threads will be redone (--rerun-other-code)",
                "failed": "failed run(s) run again", "unreadable": f"run(s) with an unreadable {RUN_RECORD} run again"}
        parts = [f"{before.count(k)} {text}" for k, text in what.items() if k in before]
        if parts:
            text += f"; {', '.join(parts)}: their old folders are moved to {self.out / STALE_DIR} (kept)"
        if self.rerun_other and (redone := self.states.count("recorded-other")):
            text += (f"; {redone} finished run(s) recorded in runs.csv only, of other code or threads, will be redone "
                     "(their rows replaced when they finish)")
        return text


def survey(specs: list[RunSpec], out: Path, retry_failed: bool = False, rerun_other: bool = False,
           outputs: tuple[Path, ...] = (), recorded: dict[str, dict] | None = None,
           keep_codes: tuple[str, ...] = ()) -> Survey:
    """The overrides, identity, threads and state of each run in ``out`` against the code now (reads only;
    ``outputs``: the study's other folders, ``--report-dir``, which are no code: ``code_state``); ``recorded``: the
    finished rows of the study's runs.csv by run id, standing for runs whose folder is gone (the module's docstring),
    ``keep_codes`` the other codes whose rows are kept."""
    from rpg_lab.study.plan_and_results import settings_digest

    out, recorded = Path(out), recorded or {}
    overrides = [spec_overrides(s, out) for s in specs]
    identities = [spec_identity(s, out, ov) for s, ov in zip(specs, overrides)]
    threads = [threads_of(run_env(s, ov)) for s, ov in zip(specs, overrides)]
    code = code_state((out, *outputs)) if specs else {}
    states, before, others = [], [], []
    for spec, ident, n in zip(specs, identities, threads):
        rec = read_record(out, spec)
        row = recorded.get(spec.run_id) if rec is None else None
        if row is not None:
            st, why = _recorded_state(row, settings_digest({"identity": ident}), code, n, keep_codes)
            states.append(st)
            others.append(why)
            before.append("")
            continue
        st = _state(rec, spec, ident)
        others.append(other_run(rec, code, n) if st == "done" else None)
        states.append("other" if others[-1] else st)
        if rec is None:
            before.append("unreadable" if (run_dir(out, spec) / RUN_RECORD).exists() else "")
        else:
            before.append(rec["status"] if rec.get("status") in ("done", "failed") else "unreadable")
    return Survey(out, list(specs), overrides, identities, states, before, retry_failed, threads, others, rerun_other)


def _recorded_state(row: dict, digest: str, code: dict, threads: str,
                    keep_codes: tuple[str, ...]) -> tuple[str, str | None]:
    """The state of a run kept only as its runs.csv ``row`` and why it is not reused: ``recorded`` (reused),
    ``recorded-stale`` (other settings than ``digest``, or none recorded: the start refuses), ``recorded-other`` (other
    code than ``code`` and not in ``keep_codes``, or other threads), ``recorded-failed`` (failed with these settings:
    run again only with ``--retry-failed``) or ``todo`` (failed with other settings: runs)."""
    if row["status"] == "failed":
        return ("recorded-failed" if row.get("settings") == digest else "todo"), None
    if row.get("settings") is None:
        return "recorded-stale", f"runs.csv does not record its settings digest, now {digest}"
    if row.get("settings") != digest:
        return "recorded-stale", f"recorded with settings {row.get('settings')}, now {digest}"
    why = []
    if row.get("code") not in keep_codes:
        if row.get("commit") is None:  # the code alone cannot say whether it had uncommitted changes
            why.append(f"code {row.get('code')} without its commit and uncommitted changes recorded: kept only when "
                       "named")
        elif w := other_code({k: row.get(k) for k in ("code", "commit", "changes")}, code):
            why.append(w)
    if str(row.get("threads")) != threads:
        why.append(f"threads {row.get('threads') or 'not recorded'}, now {threads}")
    return ("recorded-other", "; ".join(why)) if why else ("recorded", None)


def move_aside(out: Path, spec: RunSpec) -> Path:
    """Move the run's folder to ``<out>/stale/<run id>.<n>`` (the first free n >= 1); returns where it went."""
    stale = Path(out) / STALE_DIR
    stale.mkdir(parents=True, exist_ok=True)
    n = 1
    while (stale / f"{spec.run_id}.{n}").exists():
        n += 1
    dest = stale / f"{spec.run_id}.{n}"
    run_dir(out, spec).rename(dest)
    return dest
