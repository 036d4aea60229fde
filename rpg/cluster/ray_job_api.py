"""Is there a Ray job API at ``RAY_ADDRESS``, and does it let this client in? Asked before anything is submitted.

``python -m rpg.cluster`` (a paper script with ``RAY_ADDRESS``) and ``recipe/rpg/ray_cluster.sh submit`` hand the
address to the ``ray`` CLI, which answers a mistyped address, a cluster that is not there or a missing token with tracebacks
(63 to 126 lines). Here the address is read first (only the dashboard's job API, ``http(s)://HOST:PORT``: Ray
takes anything else for a GCS address), then the same ``ray`` executable is asked (``ray job list``: Ray's
own address reading, token lookup and version check, as ``ray job submit`` does them), for at most
``TIMEOUT_S`` seconds, and its failure becomes one line that says what to do.

Run as a script by ``ray_cluster.sh submit`` (by path: standard library only), ``python3 ray_job_api.py RAY
ADDRESS`` prints the number of alive nodes with GPUs (``ray list nodes``, at least 1), or one line on stderr
and exits 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Mapping, Sequence
from urllib.parse import urlsplit

TIMEOUT_S = 30  # the `ray` CLI itself takes seconds to start (10 s seen on a loaded 2-core machine); a refused connection answers at once
FORMS = "http(s)://HOST:PORT of the Ray dashboard's job API, e.g. http://127.0.0.1:8265"
START = ("start one with recipe/rpg/ray_cluster.sh head, or reach a running head through an SSH tunnel "
         "(ssh -L 8265:localhost:8265 user@HEAD, then RAY_ADDRESS=http://127.0.0.1:8265)")
TOKEN = ("give this machine the cluster's token: the token file ~/.ray/auth_token copied from the head node "
         "(chmod 600), or RAY_AUTH_TOKEN_PATH, or RAY_AUTH_TOKEN")
# Ray 2.60's AuthenticationError texts: the cluster's answer (401, 403) and why
REFUSED = {"Missing authentication token": "no token was sent; set RAY_AUTH_MODE=token and ",
           "Invalid authentication token": "the token sent is not the cluster's (RAY_AUTH_MODE=token); "}


def address_problem(address: str) -> str | None:
    """Why ``address`` is not a job API address (``None``: it is one)."""
    try:
        parts = urlsplit(address)
        parts.port  # noqa: B018 (ValueError: not a port number)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or address.split() != [address]:
        return f"RAY_ADDRESS={address!r} is not a Ray job API address; expected {FORMS}"
    return None


def _ask(cmd: Sequence[str], address: str, env: Mapping[str, str]) -> tuple[str | None, str]:
    """Run ``cmd`` (a ``ray`` command with ``--address address``): ``(None, stdout)``, or ``(one line, "")``."""
    try:
        r = subprocess.run(list(cmd), env=dict(env), capture_output=True, text=True, timeout=TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"no Ray cluster answered at RAY_ADDRESS={address} within {TIMEOUT_S} s: {START}", ""
    except OSError as e:
        return f"cannot run {cmd[0]!r} to reach RAY_ADDRESS={address}: {e.strerror or e}", ""
    if r.returncode == 0:
        return None, r.stdout
    if "AuthenticationError" in r.stderr:
        why = next((why for text, why in REFUSED.items() if text in r.stderr), None)
        if why is None:  # the client's own: RAY_AUTH_MODE=token and no token here (nothing was sent)
            return f"RAY_AUTH_MODE=token but this machine has no Ray token for RAY_ADDRESS={address}: {TOKEN}", ""
        return f"the Ray cluster at RAY_ADDRESS={address} refuses this client: {why}{TOKEN}", ""
    if "Failed to connect" in r.stderr:  # `ray job ...`: ConnectionError; `ray list ...`: "Failed to connect to API server"
        return f"no Ray cluster answers at RAY_ADDRESS={address}: {START}", ""
    said = [line.strip() for line in (r.stderr + r.stdout).splitlines() if line.strip()]
    return (f"no Ray job API at RAY_ADDRESS={address}: `ray {' '.join(cmd[1:3])}` exited {r.returncode}"
            + (f": {said[-1]}" if said else "")), ""


def job_api_problem(ray: str, address: str, env: Mapping[str, str]) -> str | None:
    """Why a job cannot be submitted to ``address`` with ``ray`` (``None``: its job API answers and lets us in)."""
    return address_problem(address) or _ask([ray, "job", "list", "--address", address], address, env)[0]


def gpu_nodes(ray: str, address: str, env: Mapping[str, str]) -> tuple[str | None, int]:
    """``(None, alive nodes with GPUs, at least 1)``, or ``(why not, 0)``."""
    if (why := address_problem(address)) is not None:
        return why, 0
    why, out = _ask([ray, "list", "nodes", "--address", address, "--format", "json"], address, env)
    if why is not None:
        return why, 0
    try:
        nodes = json.loads(out)
        return None, sum(1 for n in nodes if n["state"] == "ALIVE" and float(n["resources_total"].get("GPU", 0)) > 0) or 1
    except (ValueError, TypeError, KeyError, AttributeError):
        return f"`ray list nodes --address {address}` printed no node list: {out.strip()[:200]!r}", 0


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 ray_job_api.py RAY ADDRESS", file=sys.stderr)
        return 2
    why, n = gpu_nodes(argv[0], argv[1], os.environ)
    if why is not None:
        print(f"[ray_cluster] error: {why}", file=sys.stderr)
        return 2
    print(n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
