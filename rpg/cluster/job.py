"""A run submitted to a Ray cluster (``ray job submit``): its submission id and,
when the launcher waits for it (``RAY_JOB_WAIT=1``), a Ctrl-C that stops the job rather than only the client.

``ray job submit`` without ``--no-wait`` tails the job's logs; Ray's client answers Ctrl-C with a
``KeyboardInterrupt`` traceback and leaves the job running on the cluster. ``follow`` runs the same ``ray job
submit`` as a child in its own process group (the terminal's Ctrl-C reaches only the launcher), and on SIGINT,
SIGTERM or SIGHUP asks Ray to stop the job (``ray job stop <submission id>``: Ray sends the driver SIGTERM, and
the driver prints its stop line, which the still-running tail shows), waits for the tail to end, then says so in
one line (exit 128 + signum).
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from rpg.stop_signals import StopSignal, raise_on_stop_signals

STOP_WAIT_S = 120.0  # for the job's own stop (the driver's stop line, Ray shut down) to reach the tail


def submission_id() -> str:
    """A new job's submission id: ``rpg-<UTC time>-<6 hex>`` (names its rendezvous file and its logs)."""
    return f"rpg-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def follow(cmd: Sequence[str], env: Mapping[str, str], address: str, submission: str,
           detach_on: Sequence[int] = ()) -> int:
    """Run ``cmd`` (``ray job submit`` that tails the job) to its end; a stop signal stops the job (see the
    module's text), except a signal in ``detach_on`` (an elastic job: SIGHUP, a terminal that went away), which
    ends only the tail and says that the job goes on. Returns the client's exit code, or 128 + signum."""
    handlers = raise_on_stop_signals()
    proc = None
    try:
        proc = subprocess.Popen(list(cmd), env=dict(env), start_new_session=True)
        return proc.wait()
    except StopSignal as stop:
        handlers.hold()
        if stop.signum in detach_on:
            if proc is not None:
                proc.terminate()  # the tail only: the job runs on the cluster, supervised there
                proc.wait(timeout=STOP_WAIT_S)
            print(f"rpg.launch: {stop.name}: stopped following job {submission}, which goes on (its supervisor runs on "
                  f"the cluster); ray job logs --address {address} {submission} -f follows it, ray job stop stops it",
                  file=sys.stderr, flush=True)
            return stop.code
        print(f"rpg.launch: {stop.name}: stopping job {submission} (ray job stop) ...", file=sys.stderr, flush=True)
        ray = cmd[0]
        subprocess.run([ray, "job", "stop", "--address", address, submission], env=dict(env),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=STOP_WAIT_S, check=False)
        if proc is not None:
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.terminate()
        print(f"rpg.launch: stopped by {stop.name}: job {submission} stopped; its logs: ray job logs --address "
              f"{address} {submission}", file=sys.stderr, flush=True)
        return stop.code
    finally:
        handlers()
