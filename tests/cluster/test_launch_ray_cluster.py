"""recipe/rpg/ray_cluster.sh: the Ray token file is private (0600, also when it already existed, under
umask 022 and 077) and PRINT_ONLY=1 prints every step that would run, the token step and the variables
the script sets included, never the token itself: pasted into a shell, the printed lines make exactly
the calls a run makes (same arguments, same environment, same token file, same refusals)."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from messages import names, one_line

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "recipe" / "rpg" / "ray_cluster.sh"
TOKEN = "SECRET-TOKEN-5f0c"

# Stands in for `ray`: logs its arguments; `get-auth-token --generate` writes a new token the way Ray
# 2.60 does (ray/_private/authentication/authentication_token_setup.py: mkdir + open(path, "w"), so
# with the caller's umask) and prints the token on stdout.
FAKE_RAY = f"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_RAY_LOG"
if [[ "$1" == get-auth-token ]]; then
    f="$HOME/.ray/auth_token"
    if [[ ! -e "$f" ]]; then mkdir -p "$HOME/.ray"; printf '%s' {TOKEN} > "$f"; fi
    cat "$f"
fi
"""


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "bin" / "ray"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE_RAY)
    fake.chmod(0o755)
    full = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "RAY": str(fake),
            "FAKE_RAY_LOG": str(tmp_path / "ray.log"), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], env=full, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: os.umask(0o022))  # the usual umask: new files 0644


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "ray.log"
    return log.read_text().splitlines() if log.exists() else []


def test_head_creates_the_token_file_0600(tmp_path):
    r = _run(tmp_path, "head")
    assert r.returncode == 0, r.stderr
    token = tmp_path / "home" / ".ray" / "auth_token"
    assert token.read_text() == TOKEN and _mode(token) == 0o600 and _mode(token.parent) == 0o700
    assert _calls(tmp_path)[0] == "get-auth-token --generate" and _calls(tmp_path)[1].startswith("start --head")
    assert TOKEN not in r.stdout + r.stderr


def test_head_makes_an_existing_token_file_private(tmp_path):
    token = tmp_path / "home" / ".ray" / "auth_token"
    token.parent.mkdir(parents=True)
    token.write_text("existing")
    token.chmod(0o644)
    r = _run(tmp_path, "head")
    assert r.returncode == 0, r.stderr
    assert token.read_text() == "existing" and _mode(token) == 0o600
    assert "existing" not in r.stdout + r.stderr


def test_print_only_prints_every_step_and_never_the_token(tmp_path):
    fake = tmp_path / "bin" / "ray"
    home = tmp_path / "home"
    token = home / ".ray" / "auth_token"
    r = _run(tmp_path, "head", PRINT_ONLY="1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:4] == [
        "export RAY_AUTH_MODE=token",
        f"(umask 077 && {fake} get-auth-token --generate >/dev/null)",
        f"chmod 600 {token}",
        f"{fake} start --head --port=6379 --dashboard-host=127.0.0.1 --dashboard-port=8265",
    ]
    assert all(line.startswith("# ") for line in lines[4:])  # messages are comments: the output runs as is
    assert not token.exists() and _calls(tmp_path) == []  # printed, not run
    token.parent.mkdir(parents=True)
    token.write_text(TOKEN)
    r = _run(tmp_path, "head", PRINT_ONLY="1")
    assert TOKEN not in r.stdout + r.stderr and _calls(tmp_path) == []
    r = _run(tmp_path, "head", PRINT_ONLY="1", RAY_AUTH_MODE="disabled")
    assert r.stdout.splitlines()[:2] == ["export RAY_AUTH_MODE=disabled", f"{fake} start --head --port=6379 "
                                         "--dashboard-host=127.0.0.1 --dashboard-port=8265"]
    assert "auth_token" not in r.stdout


def test_worker_needs_the_token_and_makes_it_private(tmp_path):
    r = _run(tmp_path, "worker", "10.0.0.1")
    assert r.returncode == 2 and _calls(tmp_path) == []
    assert one_line(r.stderr).startswith("[ray_cluster] error: ")
    names(r.stderr, str(tmp_path / "home" / ".ray" / "auth_token"), "RAY_AUTH_TOKEN ", "~/.ray/auth_token", "chmod 600",
          "RAY_AUTH_MODE=disabled")
    token = tmp_path / "home" / ".ray" / "auth_token"
    token.parent.mkdir(parents=True)
    token.write_text(TOKEN)
    token.chmod(0o644)
    r = _run(tmp_path, "worker", "10.0.0.1")
    assert r.returncode == 0, r.stderr
    assert _mode(token) == 0o600 and _calls(tmp_path) == ["start --address=10.0.0.1:6379"]
    r = _run(tmp_path, "worker", "10.0.0.1", PRINT_ONLY="1")
    assert r.stdout.splitlines() == ["export RAY_AUTH_MODE=token", f"chmod 600 {token}",
                                     f"{tmp_path / 'bin' / 'ray'} start --address=10.0.0.1:6379"]


# --- PRINT_ONLY=1 prints exactly what a run does: its lines, pasted into a shell, make the same calls ---------------

# Stands in for `ray` as Ray 2.60 behaves for these commands: logs the environment the script sets and its
# arguments; `get-auth-token --generate` reads RAY_AUTH_TOKEN, then RAY_AUTH_TOKEN_PATH (an error when that file
# is missing or empty), then ~/.ray/auth_token, which it creates (with the caller's umask) when there is no token.
FAKE_RAY_ENV = """#!/usr/bin/env bash
echo "RAY_AUTH_MODE=${RAY_AUTH_MODE-} RAY_ADDRESS=${RAY_ADDRESS-} NNODES=${NNODES-} ray $*" >> "$FAKE_RAY_LOG"
case "$1" in
    get-auth-token)
        if [[ -n "${RAY_AUTH_TOKEN-}" ]]; then printf '%s' "$RAY_AUTH_TOKEN"; exit 0; fi
        if [[ -n "${RAY_AUTH_TOKEN_PATH-}" ]]; then
            [[ -s "$RAY_AUTH_TOKEN_PATH" ]] || { echo "AuthenticationError: RAY_AUTH_TOKEN_PATH is set but file cannot be opened" >&2; exit 1; }
            cat "$RAY_AUTH_TOKEN_PATH"; exit 0
        fi
        f="$HOME/.ray/auth_token"
        if [[ ! -s "$f" ]]; then mkdir -p "$HOME/.ray"; printf '%s' "$FAKE_NEW_TOKEN" > "$f"; fi
        cat "$f" ;;
    list) echo '[{"state": "ALIVE", "resources_total": {"GPU": 8.0}}, {"state": "ALIVE", "resources_total": {"CPU": 8.0}},
                 {"state": "ALIVE", "resources_total": {"GPU": 8.0}}, {"state": "DEAD", "resources_total": {"GPU": 8.0}}]' ;;
esac
"""
JOB = """echo "RAY_AUTH_MODE=${RAY_AUTH_MODE-} RAY_ADDRESS=${RAY_ADDRESS-} NNODES=${NNODES-} job $*" >> "$FAKE_RAY_LOG"
"""


def _env(tmp_path: Path, **env: str) -> dict[str, str]:
    fake = tmp_path / "bin" / "ray"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE_RAY_ENV)
    fake.chmod(0o755)
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "RAY": str(fake), "PYTHON": sys.executable,
            "FAKE_RAY_LOG": str(tmp_path / "ray.log"), "FAKE_NEW_TOKEN": TOKEN, **env}


def _state(tmp_path: Path, token: str | None) -> None:
    """A fresh node: no log; ~/.ray/auth_token absent, or holding ``token`` with mode 0644."""
    for p in (tmp_path / "ray.log", tmp_path / "home" / ".ray" / "auth_token"):
        p.unlink(missing_ok=True)
    if token is not None:
        f = tmp_path / "home" / ".ray" / "auth_token"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(token)
        f.chmod(0o644)


def _outcome(tmp_path: Path, r: subprocess.CompletedProcess) -> tuple:
    token = tmp_path / "home" / ".ray" / "auth_token"
    return (r.returncode, r.stderr if r.returncode else "", _calls(tmp_path),
            (token.read_text(), _mode(token)) if token.exists() else None)


def _bash(args: list[str], env: dict[str, str], umask: int = 0o022, stdin: str | None = None):
    return subprocess.run(["bash", *args], env=env, input=stdin, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: os.umask(umask))


@pytest.mark.parametrize("umask", [0o022, 0o077])
@pytest.mark.parametrize("args, env, token", [
    (["head"], {}, None),
    (["head"], {}, "existing"),
    (["head"], {"RAY_AUTH_TOKEN": TOKEN}, None),
    (["head"], {"RAY_AUTH_TOKEN_PATH": "{home}/custom"}, None),
    (["head", "--num-cpus=4"], {"RAY_AUTH_MODE": "disabled", "NODE_IP": "10.0.0.1", "NUM_GPUS": "8"}, None),
    (["worker", "10.0.0.1"], {}, TOKEN),
    (["worker", "10.0.0.1:6380"], {"RAY_AUTH_TOKEN": TOKEN}, None),
    (["worker", "10.0.0.1"], {}, None),
    (["worker", "10.0.0.1"], {}, ""),
    (["submit", "{job}", "a=1", "b=[x,y]", "c=it's"], {}, TOKEN),
    (["submit", "{job}"], {"NNODES": "3", "RAY_ADDRESS": "http://10.0.0.1:8265"}, TOKEN),
    (["status"], {}, TOKEN),
    (["stop"], {}, TOKEN),
], ids=lambda v: str(v))
def test_print_only_prints_exactly_what_runs(tmp_path, args, env, token, umask):
    job = tmp_path / "job.sh"
    job.write_text(JOB)
    args = [a.format(job=job) for a in args]
    full = _env(tmp_path, **{k: v.format(home=tmp_path / "home") for k, v in env.items()})
    _state(tmp_path, token)
    printed = _bash([str(SCRIPT), *args], {**full, "PRINT_ONLY": "1"}, umask)
    assert _calls(tmp_path) == [] and (token is None) == (not (tmp_path / "home" / ".ray" / "auth_token").exists())
    assert TOKEN not in printed.stdout + printed.stderr
    _state(tmp_path, token)
    ran = _bash([str(SCRIPT), *args], full, umask)
    did = _outcome(tmp_path, ran)
    _state(tmp_path, token)
    pasted = _bash(["-euo", "pipefail"], full, umask, stdin=printed.stdout) if printed.returncode == 0 else printed
    assert _outcome(tmp_path, pasted) == did, printed.stdout
    assert printed.returncode == ran.returncode and (ran.returncode == 0 or printed.stderr == ran.stderr)
    if ran.returncode == 0 and "RAY_AUTH_TOKEN" not in env and env.get("RAY_AUTH_MODE") != "disabled" \
            and args[0] in ("head", "worker"):
        assert did[3] == (token or TOKEN, 0o600)  # the token file: private


@pytest.mark.parametrize("value, runs", [("true", False), ("no", True), ("", True)])
def test_print_only_reads_the_usual_spellings(tmp_path, value, runs):
    r = _run(tmp_path, "head", PRINT_ONLY=value)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ray.log").exists() == runs  # the fake ray ran only when PRINT_ONLY is off


def test_a_mistyped_print_only_is_refused_before_anything_runs(tmp_path):
    """Before: anything but exactly "1" (PRINT_ONLY=true) ran the real commands."""
    r = _run(tmp_path, "head", PRINT_ONLY="ture")
    assert r.returncode == 2, r.stderr
    names(one_line(r.stderr), "ray_cluster.sh", "PRINT_ONLY='ture'", "1, 0, true, false")
    assert not (tmp_path / "ray.log").exists() and not (tmp_path / "home" / ".ray").exists()


@pytest.mark.parametrize("mode", ["tokne", " token", "token ", "TOKEN", "Disabled", "off"])
@pytest.mark.parametrize("cmd", [["head"], ["worker", "10.0.0.1"], ["status"]])
@pytest.mark.parametrize("print_only", ["1", "0"])
def test_a_mistyped_auth_mode_is_refused_before_anything_runs(tmp_path, mode, cmd, print_only):
    """Before: any RAY_AUTH_MODE but exactly "token" skipped the token steps and exited 0 (Ray reads "TOKEN"
    as token mode, so it then wrote ~/.ray/auth_token with the umask, 0644). Only Ray's two modes, spelled
    exactly, are accepted."""
    token = tmp_path / "home" / ".ray" / "auth_token"
    r = _run(tmp_path, *cmd, PRINT_ONLY=print_only, RAY_AUTH_MODE=mode)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.splitlines() == [
        f"ray_cluster.sh: RAY_AUTH_MODE='{mode}' is invalid; allowed values: token (the default), disabled"]
    assert _calls(tmp_path) == [] and not token.parent.exists()


@pytest.mark.parametrize("mode", ["token", "disabled", ""])
def test_the_documented_auth_modes_are_accepted(tmp_path, mode):
    r = _run(tmp_path, "head", PRINT_ONLY="1", RAY_AUTH_MODE=mode)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"export RAY_AUTH_MODE={mode or 'token'}"
    assert (mode != "disabled") == any("get-auth-token" in ln for ln in r.stdout.splitlines())


# --- no cluster where one is expected ------------------------------------------------------------------------

# `ray list nodes --address A --format json` as Ray 2.60 fails (checked by hand: nothing listening at A, exit 2 and
# a click error; no token on this machine with RAY_AUTH_MODE=token, exit 1 and an AuthenticationError traceback).
FAKE_RAY_FAILS = """#!/usr/bin/env bash
echo "ray $*" >> "$FAKE_RAY_LOG"
[[ "$1" == list ]] || exit 0
if [[ "$FAKE_CASE" == "no cluster" ]]; then
    printf 'Usage: ray list [OPTIONS] {actors|jobs|placement-\\nTry %s for help.\\n\\n' "'ray list --help'" >&2
    echo "Error: Failed to make request to $4/api/v0/nodes. Failed to connect to API server. Please check the API server log for details." >&2
    exit 2
fi
echo "Traceback (most recent call last):" >&2
echo "ray.exceptions.AuthenticationError: Token authentication is enabled but Ray couldn't find an authentication token." >&2
exit 1
"""
NO_CLUSTER = ("[ray_cluster] error: no Ray cluster answers at RAY_ADDRESS={address}: start one with recipe/rpg/ray_cluster.sh "
              "head, or reach a running head through an SSH tunnel (ssh -L 8265:localhost:8265 user@HEAD, then "
              "RAY_ADDRESS=http://127.0.0.1:8265)")
NO_TOKEN = ("[ray_cluster] error: RAY_AUTH_MODE=token but this machine has no Ray token for RAY_ADDRESS={address}: "
            "give this machine the cluster's token: the token file ~/.ray/auth_token copied from the head node "
            "(chmod 600), or RAY_AUTH_TOKEN_PATH, or RAY_AUTH_TOKEN")


@pytest.mark.parametrize("case, line", [("no cluster", NO_CLUSTER), ("no token", NO_TOKEN)])
@pytest.mark.parametrize("address", [None, "http://10.0.0.1:8265"])
def test_submit_without_a_cluster_is_one_line(tmp_path, case, line, address):
    """Before: Ray's error, then the NNODES one-liner fed empty input (JSONDecodeError traceback), exit 1."""
    job = tmp_path / "job.sh"
    job.write_text(JOB)
    env = _env(tmp_path, FAKE_CASE=case, **({"RAY_ADDRESS": address} if address else {}))
    (tmp_path / "bin" / "ray").write_text(FAKE_RAY_FAILS)
    address = address or "http://127.0.0.1:8265"
    ran = _bash([str(SCRIPT), "submit", str(job)], env)
    assert (ran.returncode, ran.stderr.splitlines()) == (2, [line.format(address=address)])
    assert _calls(tmp_path) == [f"ray list nodes --address {address} --format json"]  # the job never ran
    # PRINT_ONLY=1: the printed lines, pasted, stop the same way
    printed = _bash([str(SCRIPT), "submit", str(job)], {**env, "PRINT_ONLY": "1"})
    assert printed.returncode == 0 and _calls(tmp_path) == [f"ray list nodes --address {address} --format json"]
    (tmp_path / "ray.log").unlink()
    pasted = _bash(["-euo", "pipefail"], env, stdin=printed.stdout)
    assert (pasted.returncode, pasted.stderr, _calls(tmp_path)) == (ran.returncode, ran.stderr, _calls(tmp_path))
    assert _calls(tmp_path) == [f"ray list nodes --address {address} --format json"]


# --- the dashboard's host: authentication, the job address -------------------------------------------------

@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "fe80::1", "head.example.org"])
@pytest.mark.parametrize("print_only", ["1", "0"])
def test_an_unauthenticated_dashboard_on_the_network_needs_an_explicit_opt_in(tmp_path, host, print_only):
    """Before: RAY_AUTH_MODE=disabled with DASHBOARD_HOST=0.0.0.0 started the job API (it runs code) on the network,
    without authentication and without a word."""
    r = _run(tmp_path, "head", RAY_AUTH_MODE="disabled", DASHBOARD_HOST=host, PRINT_ONLY=print_only)
    assert r.returncode == 2 and _calls(tmp_path) == [], r.stderr
    assert one_line(r.stderr).startswith("[ray_cluster] error: ")
    names(r.stderr, "RAY_AUTH_MODE=disabled", f"DASHBOARD_HOST={host} ", "8265", "RAY_AUTH_MODE=token",
          "DASHBOARD_HOST=127.0.0.1", "ALLOW_UNAUTHENTICATED_DASHBOARD=1")
    assert "start" not in r.stdout
    r = _run(tmp_path, "head", RAY_AUTH_MODE="disabled", DASHBOARD_HOST=host, PRINT_ONLY=print_only,
             ALLOW_UNAUTHENTICATED_DASHBOARD="1")
    assert r.returncode == 0, r.stderr
    assert one_line(r.stderr).startswith("[ray_cluster] warning: ")
    names(r.stderr, f"{host}:8265", "no authentication", "ALLOW_UNAUTHENTICATED_DASHBOARD=1")
    assert (_calls(tmp_path) == [f"start --head --port=6379 --dashboard-host={host} --dashboard-port=8265"]) == (
        print_only == "0")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "localhost", "::1"])
def test_an_unauthenticated_dashboard_on_loopback_is_not_warned_about(tmp_path, host):
    r = _run(tmp_path, "head", RAY_AUTH_MODE="disabled", DASHBOARD_HOST=host)
    assert r.returncode == 0 and r.stderr == "" and len(_calls(tmp_path)) == 1


def test_the_opt_in_is_read_like_print_only(tmp_path):
    r = _run(tmp_path, "head", ALLOW_UNAUTHENTICATED_DASHBOARD="yes please")
    assert r.returncode == 2, r.stderr
    names(one_line(r.stderr), "ray_cluster.sh", "ALLOW_UNAUTHENTICATED_DASHBOARD='yes please'", "1, 0, true, false")
    assert _calls(tmp_path) == []


@pytest.mark.parametrize("host, address", [
    ("127.0.0.1", "http://127.0.0.1:8265"), ("0.0.0.0", "http://127.0.0.1:8265"), ("::", "http://127.0.0.1:8265"),
    ("10.1.2.3", "http://10.1.2.3:8265"), ("fe80::1", "http://[fe80::1]:8265"), ("[fe80::1]", "http://[fe80::1]:8265"),
    ("head.example.org", "http://head.example.org:8265"),
])
def test_the_job_address_follows_the_dashboard_host(tmp_path, host, address):
    """Before: `head` printed and `submit` used http://127.0.0.1:8265 whatever DASHBOARD_HOST was (with 10.1.2.3
    nothing listens there)."""
    r = _run(tmp_path, "head", DASHBOARD_HOST=host, PRINT_ONLY="1")
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith(f"# [ray_cluster] jobs: RAY_ADDRESS={address}")
    job = tmp_path / "job.sh"
    job.write_text(JOB)
    r = _bash([str(SCRIPT), "submit", str(job)], _env(tmp_path, DASHBOARD_HOST=host, PRINT_ONLY="1"))
    assert r.returncode == 0 and ["export", f"RAY_ADDRESS={address}"] in [shlex.split(ln) for ln in r.stdout.splitlines()]
