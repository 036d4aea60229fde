"""A paper script with ``RAY_ADDRESS`` (``python -m rpg.cluster``): an address that is not a Ray job API, no cluster there, or one
that refuses this client's token is one line on stderr (exit 2) before anything is submitted, instead of
``ray job submit``'s tracebacks (63 to 126 lines); under DRY_RUN=1 a cluster that does not answer is a
warning (the dry run works away from the cluster), a malformed address still an error.

The cluster is asked through the same ``ray`` executable the submission uses (``rpg.cluster.ray_job_api``):
here a stub on PATH that fails the way Ray 2.60's CLI does (its last lines, checked by hand against a real
``ray start --head`` with token authentication), and the real ``ray`` for a port where nothing listens."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from messages import names, one_line
from launching import env as _env, launch as main

from rpg.cluster import ray_job_api

ROOT = Path(__file__).resolve().parents[2]
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens
FORMS = "expected http(s)://HOST:PORT of the Ray dashboard's job API, e.g. http://127.0.0.1:8265"
START = ("start one with recipe/rpg/ray_cluster.sh head, or reach a running head through an SSH tunnel "
         "(ssh -L 8265:localhost:8265 user@HEAD, then RAY_ADDRESS=http://127.0.0.1:8265)")
FORMS_FACTS = ("http(s)://HOST:PORT", "http://127.0.0.1:8265")  # what a refused address is told to be
TOKEN_FACTS = ("~/.ray/auth_token", "chmod 600", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")  # where a token comes from
TOKEN = ("give this machine the cluster's token: the token file ~/.ray/auth_token copied from the head node "
         "(chmod 600), or RAY_AUTH_TOKEN_PATH, or RAY_AUTH_TOKEN")

# What Ray 2.60's `ray job list` / `ray job submit` print last and exit with, per case.
RAY_SAYS = {
    "no cluster": (1, "ConnectionError: Failed to connect to Ray at address: {address}."),
    "no token here": (1, "ray.exceptions.AuthenticationError: Token authentication is enabled but Ray couldn't "
                         "find an authentication token. Create a token file at ~/.ray/auth_token, ..."),
    "token not sent": (1, "ray.exceptions.AuthenticationError: Authentication required: Unauthorized: Missing "
                          "authentication token"),
    "wrong token": (1, "ray.exceptions.AuthenticationError: Authentication failed: Forbidden: Invalid "
                       "authentication token"),
    "answers": (0, ""),
}
STUB = """#!/usr/bin/env bash
echo "$*" >> "$STUB_LOG"
[[ "$STUB_CASE" == slow ]] && exec sleep 30
address=""; prev=""; for a in "$@"; do [[ "$prev" == --address ]] && address="$a"; prev="$a"; done
printf 'Traceback (most recent call last):\\n  File "ray/dashboard/modules/job/cli.py", line 1\\n' >&2
printf '%s\\n' "${STUB_SAYS//\\{address\\}/$address}" >&2
exit "$STUB_RC"
"""


def _stub(tmp_path: Path, case: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ray").write_text(STUB)
    (bin_dir / "ray").chmod(0o755)
    rc, says = RAY_SAYS.get(case, (0, ""))
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "STUB_LOG": str(tmp_path / "ray.log"),
            "STUB_CASE": case, "STUB_SAYS": says, "STUB_RC": str(rc)}


def _stub_calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "ray.log"
    return log.read_text().splitlines() if log.exists() else []


def _launch(*args: str, **env: str) -> subprocess.CompletedProcess:
    """A paper script in a process of its own (without DRY_RUN it execs ``ray job submit``)."""
    full = _env(PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", PYTHON=sys.executable, **env)
    return subprocess.run(["bash", str(ROOT / "recipe/rpg/7b" / f"{args[0]}.sh"), *args[1:]], env=full, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("address", ["notaurl", "127.0.0.1:8265", "ray://10.0.0.1:10001", "http://", "ftp://h:8265",
                                     "http://127.0.0.1:99999", "http://127.0.0.1:8265 ", "auto"])
def test_an_address_that_is_not_a_job_api_is_one_line_also_under_dry_run(tmp_path, address, capsys):
    """Before: DRY_RUN=1 passed (exit 0), and a submission ran `ray job submit`: 54 to 63 lines of tracebacks
    (Ray takes an address without http(s):// for a GCS address)."""
    assert main(["run_grpo_7b"], _env(DRY_RUN="1", RAY_ADDRESS=address, **_stub(tmp_path, "answers"))) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"rpg.launch: RAY_ADDRESS={address!r} is not a Ray job API address; {FORMS}"]
    assert _stub_calls(tmp_path) == []  # refused before Ray is asked


def test_a_malformed_address_is_refused_before_submitting(tmp_path):
    p = _launch("run_grpo_7b", RAY_ADDRESS="notaurl", **_stub(tmp_path, "answers"))
    assert p.returncode == 2, p.stderr[-3000:]
    assert one_line(p.stderr).startswith("rpg.launch: ")
    names(p.stderr, "RAY_ADDRESS='notaurl'", *FORMS_FACTS)
    assert _stub_calls(tmp_path) == []


@pytest.mark.parametrize("case, line", [
    ("no cluster", f"no Ray cluster answers at RAY_ADDRESS={NOWHERE}: {START}"),
    ("no token here", f"RAY_AUTH_MODE=token but this machine has no Ray token for RAY_ADDRESS={NOWHERE}: {TOKEN}"),
    ("token not sent", f"the Ray cluster at RAY_ADDRESS={NOWHERE} refuses this client: no token was sent; set "
                       f"RAY_AUTH_MODE=token and {TOKEN}"),
    ("wrong token", f"the Ray cluster at RAY_ADDRESS={NOWHERE} refuses this client: the token sent is not the "
                    f"cluster's (RAY_AUTH_MODE=token); {TOKEN}"),
    ("answers", None),
])
def test_the_job_api_is_asked_through_the_ray_executable(tmp_path, case, line):
    env = _stub(tmp_path, case)
    ray = str(tmp_path / "bin" / "ray")
    assert ray_job_api.job_api_problem(ray, NOWHERE, {**os.environ, **env}) == line
    assert _stub_calls(tmp_path) == [f"job list --address {NOWHERE}"]


def test_a_job_api_that_does_not_answer_in_time(tmp_path, monkeypatch):
    monkeypatch.setattr(ray_job_api, "TIMEOUT_S", 1)
    env = {**os.environ, **_stub(tmp_path, "slow")}
    assert ray_job_api.job_api_problem(str(tmp_path / "bin" / "ray"), NOWHERE, env) == (
        f"no Ray cluster answered at RAY_ADDRESS={NOWHERE} within 1 s: {START}")


def test_a_cluster_refusing_the_token_is_one_line_and_nothing_is_submitted(tmp_path):
    """Before: `ray job submit` ran and printed its AuthenticationError traceback (exit 1)."""
    p = _launch("run_grpo_7b", RAY_ADDRESS=NOWHERE, **_stub(tmp_path, "wrong token"))
    assert p.returncode == 2, p.stderr[-3000:]
    assert one_line(p.stderr).startswith("rpg.launch: ")
    names(p.stderr, f"RAY_ADDRESS={NOWHERE}", "RAY_AUTH_MODE=token", *TOKEN_FACTS)
    assert _stub_calls(tmp_path) == [f"job list --address {NOWHERE}"]  # asked, never submitted


def test_no_cluster_with_the_real_ray_is_one_line(tmp_path):
    """The real `ray` (the one next to this Python), nothing listening. Before: 126 lines, 5 tracebacks."""
    p = _launch("run_grpo_7b", RAY_ADDRESS=NOWHERE, PATH=str(Path(sys.executable).parent) + os.pathsep + "/usr/bin:/bin",
                RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0f" * 16)
    assert (p.returncode, p.stderr.splitlines()) == (2, [
        f"rpg.launch: no Ray cluster answers at RAY_ADDRESS={NOWHERE}: {START}"]), p.stderr[-3000:]
    assert "Traceback" not in p.stdout


def test_dry_run_away_from_the_cluster_is_a_warning(tmp_path, capsys):
    """Before: no word about the cluster (exit 0 either way)."""
    assert main(["run_grpo_7b"], _env(DRY_RUN="1", RAY_ADDRESS=NOWHERE, DATA_DIR=str(tmp_path),
                                      **_stub(tmp_path, "no cluster"))) == 0
    cap = capsys.readouterr()
    assert f"rpg.launch: warning: no Ray cluster answers at RAY_ADDRESS={NOWHERE}: {START} (DRY_RUN=1: nothing is " \
           "submitted)" in cap.err.splitlines()
    assert "composed and validated config" in cap.out and _stub_calls(tmp_path) == [f"job list --address {NOWHERE}"]
