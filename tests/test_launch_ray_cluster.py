"""recipe/rpg/ray_cluster.sh: the Ray token file is private (0600, also when it already existed) and
PRINT_ONLY=1 prints every step that would run, the token step included, never the token itself."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
    assert lines[:3] == [
        f"(umask 077 && {fake} get-auth-token --generate >/dev/null)",
        f"chmod 600 {token}",
        f"{fake} start --head --port=6379 --dashboard-host=127.0.0.1 --dashboard-port=8265 ",
    ]
    assert not token.exists() and _calls(tmp_path) == []  # printed, not run
    token.parent.mkdir(parents=True)
    token.write_text(TOKEN)
    r = _run(tmp_path, "head", PRINT_ONLY="1")
    assert TOKEN not in r.stdout + r.stderr and _calls(tmp_path) == []
    r = _run(tmp_path, "head", PRINT_ONLY="1", RAY_AUTH_MODE="disabled")
    assert r.stdout.splitlines()[0].startswith(f"{fake} start --head") and "auth_token" not in r.stdout


def test_worker_needs_the_token_and_makes_it_private(tmp_path):
    r = _run(tmp_path, "worker", "10.0.0.1")
    assert r.returncode == 2 and _calls(tmp_path) == []
    assert r.stderr.splitlines() == [
        f"[ray_cluster] error: no Ray token at {tmp_path / 'home' / '.ray' / 'auth_token'} and RAY_AUTH_TOKEN is "
        "not set: copy ~/.ray/auth_token from the head node (chmod 600), or set RAY_AUTH_MODE=disabled"]
    token = tmp_path / "home" / ".ray" / "auth_token"
    token.parent.mkdir(parents=True)
    token.write_text(TOKEN)
    token.chmod(0o644)
    r = _run(tmp_path, "worker", "10.0.0.1")
    assert r.returncode == 0, r.stderr
    assert _mode(token) == 0o600 and _calls(tmp_path) == ["start --address=10.0.0.1:6379"]
    r = _run(tmp_path, "worker", "10.0.0.1", PRINT_ONLY="1")
    assert r.stdout.splitlines() == [f"chmod 600 {token}", f"{tmp_path / 'bin' / 'ray'} start --address=10.0.0.1:6379 "]
