"""The elastic supervisor's decisions (``rpg.cluster.elastic``): start the trainer at a node count, restart it after
a node loss, grow it when nodes come back, stop when it cannot go on.

The trainer's node count: the largest allowed size (``--sizes``) <= N - P, where N counts the alive nodes, each once,
that have ``Plan.node_gpus`` GPUs free or held by the running trainer's Ray job (``cluster.run_nodes``), and P is
the standalone rollout pool's nodes (separate_async's ``actor_rollout_ref.rollout.nnodes``, 0 in another mode). A
node counts when it holds the larger of a trainer rank group (``trainer.n_gpus_per_node``) and a pool node
(``rollout.n_gpus_per_node``): verl creates the trainer's placement groups first, one node each, so whichever k
counted nodes Ray gives them, P counted nodes are left that each hold a pool node. Conservative: a node that could
hold a rank group and a pool node side by side is still counted once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rpg.node_counts import largest_fit
from rpg.cluster.elastic.cluster import Cluster
from rpg.cluster.elastic.attempts import Plan, attempt_env, set_aside_incomplete, wandb_run_id
from rpg.verl.errors import ELASTIC_EXIT, ELASTIC_GROW_SUFFIX, ELASTIC_JOB_SUFFIX

PREFIX = "rpg.elastic:"
POLL_S = 2.0
SETTLE_S = 10.0  # after a loss, before counting nodes again: losses come in groups (a rack, a preemption wave)
WAIT_FOR_NODES_S = 300.0  # below MIN after a loss: how long to wait for nodes to come back
RELEASE_TIMEOUT_S = 180.0  # for the old trainer's Ray job to be gone
HANG_S = 180.0  # fewer nodes alive than the trainer runs on, and the trainer still running: it waits on a dead node
STOP_WAIT_S = 120.0  # for the trainer's own stop (its stop line) after a SIGTERM


def say(line: str) -> None:
    print(f"{PREFIX} {line}", flush=True)


def _step(checkpoint: Path | None) -> int:
    return 0 if checkpoint is None else int(checkpoint.name.removeprefix("global_step_"))


def _prctl():
    """libc's ``prctl``, resolved here, before any fork (None where there is none)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


@dataclass
class Supervisor:
    plan: Plan
    cluster: Cluster
    environ: Mapping[str, str]
    settle_s: float = SETTLE_S
    wait_for_nodes_s: float = WAIT_FOR_NODES_S
    release_timeout_s: float = RELEASE_TIMEOUT_S
    hang_s: float = HANG_S
    poll_s: float = POLL_S
    child: subprocess.Popen | None = None
    status: Path | None = None  # the running attempt's status file
    stop_line: str | None = None  # the last trainer's stop line (printed when the run ends without it)
    counted: int | None = None  # the nodes counted by the last ``choose``

    # ------------------------------------------------------------------ what the cluster holds
    def _count(self, ask) -> int | None:
        try:
            return ask(self.plan.node_gpus)
        except Exception:  # noqa: BLE001 - the GCS or the dashboard did not answer this time: ask again later
            return None

    def choose(self, job_id: str | None = None) -> int | None:
        """The largest allowed count the nodes can hold with the rollout pool's kept aside (module text): the alive
        nodes with free GPUs and, with ``job_id``, those the running trainer's Ray job holds, each node once
        (``rpg.cluster.elastic.cluster.run_nodes``). The count of nodes is kept in ``counted`` for the log."""
        self.counted = nodes = self._count(lambda gpus: self.cluster.run_groups(gpus, job_id))
        return None if nodes is None else largest_fit(self.plan.sizes, nodes - self.plan.pool_nodes)

    def choice(self, k: int) -> str:
        """How ``k`` was chosen, for the log (a rollout pool's run only)."""
        p = self.plan
        if not p.pool_nodes:
            return ""
        return (f"; {self.counted} node(s) with {p.node_gpus} free GPU(s): {p.pool_nodes} kept for {p.pool_text()}, "
                f"{k} for the trainer")

    def too_few(self) -> str:
        """The nodes a start needs, for the line that says they are not there."""
        p = self.plan
        if not p.pool_nodes:
            return f"fewer than {p.low} node(s) with {p.gpus_per_node} free GPU(s) each"
        return (f"fewer than {p.low + p.pool_nodes} node(s) with {p.node_gpus} free GPU(s) each (NNODES={p.low}:"
                f"{p.high}: at least {p.low} for the trainer and {p.pool_nodes} for {p.pool_text()}"
                + ("" if self.counted is None else f"; {self.counted} counted") + ")")

    def job_id(self) -> str | None:
        """The running trainer's Ray job (written by the trainer once Ray is up), or None before."""
        if self.status is None:
            return None
        try:
            return self.status.with_suffix(ELASTIC_JOB_SUFFIX).read_text().strip() or None
        except OSError:  # not written yet
            return None

    def wait_for_size(self, timeout_s: float) -> int | None:
        deadline = time.time() + timeout_s
        while (k := self.choose()) is None and time.time() < deadline:
            time.sleep(self.poll_s)
        return k

    def wait_released(self) -> bool:
        """Whether the last trainer's Ray job is gone (none of its workers writes into the checkpoint folder any
        more), within ``release_timeout_s``."""
        job_id = self.job_id()
        deadline = time.time() + self.release_timeout_s
        while True:
            try:
                if self.cluster.released(job_id):
                    return True
            except Exception:  # noqa: BLE001 - Ray's state API did not answer: ask again
                pass
            if time.time() > deadline:
                return False
            time.sleep(self.poll_s)

    # ------------------------------------------------------------------ the trainer
    def start(self, nnodes: int, attempt: int) -> None:
        moved = set_aside_incomplete(self.plan.folder, attempt)
        if moved:
            say(f"set aside step folder(s) without their marker (a save cut short): {', '.join(moved)}")
        self.status = self.plan.state / f"attempt-{attempt}.json"
        self.status.parent.mkdir(parents=True, exist_ok=True)
        for suffix in (".json", ELASTIC_JOB_SUFFIX, ELASTIC_GROW_SUFFIX):
            self.status.with_suffix(suffix).unlink(missing_ok=True)
        env = attempt_env(self.environ, attempt, self.status, wandb_run_id(self.plan, self.environ))
        prctl = _prctl()
        self.child = subprocess.Popen(self.plan.command(nnodes, resume=attempt > 0), env=env,
                                      preexec_fn=None if prctl is None else lambda: prctl(1, signal.SIGTERM))

    def stop_child(self) -> int:
        """SIGTERM to the trainer (it prints its stop line), SIGKILL after ``STOP_WAIT_S``; its exit code."""
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
            try:
                self.child.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()
        return self.child.returncode

    def run_child(self, nnodes: int) -> tuple[int, str | None]:
        """Wait for the trainer; returns its exit code and why the supervisor stopped it ("grow", "hang") or None.
        A larger count grows the run at the next complete checkpoint, unless that checkpoint is the run's last
        step (the trainer then only validates and ends: nothing is left to train on more nodes)."""
        from rpg.verl.checkpoints import is_last_step, last_complete

        mark = None  # the last complete checkpoint when a larger count became possible
        ending = False  # the last step is saved: no grow any more
        short_since = None  # since when fewer nodes are alive than the trainer runs on
        while (rc := self.child.poll()) is None:
            time.sleep(self.poll_s)
            alive = self._count(self.cluster.alive_groups)
            used = nnodes + self.plan.pool_nodes  # the trainer's nodes and its rollout pool's
            short_since = (short_since or time.time()) if alive is not None and alive < used else None
            if short_since is not None and time.time() - short_since > self.hang_s:
                runs_on = "the trainer runs on" if not self.plan.pool_nodes else \
                    f"the trainer ({nnodes}) and its rollout pool ({self.plan.pool_nodes}) run on"
                say(f"{alive} node(s) alive of the {used} {runs_on} for {self.hang_s:.0f} s and it has not "
                    "stopped (waiting on a lost node): stopping it")
                return self.stop_child(), "hang"
            if ending:
                continue
            bigger = self.choose(self.job_id())
            if bigger is None:  # Ray's state API did not answer this time: nothing changed, the grow stays announced
                continue
            if bigger <= nnodes:
                mark = None
                continue
            latest = last_complete(self.plan.folder)
            if is_last_step(latest):
                ending = True
                say(f"{bigger} node(s) can hold the run now (it runs on {nnodes}), but its last step is saved "
                    f"({latest.name}): it ends on {nnodes}")
                continue
            if mark is None:
                mark = (latest,)
                say(f"{bigger} node(s) can hold the run now (it runs on {nnodes}): growing at the next checkpoint")
            elif latest != mark[0]:
                self.status.with_suffix(ELASTIC_GROW_SUFFIX).write_text(str(bigger))
                return self.stop_child(), "grow"
        return rc, None

    # ------------------------------------------------------------------ the run
    def end(self, why: str, code: int = 1) -> int:
        say(why)
        if self.stop_line:
            print(self.stop_line, file=sys.stderr, flush=True)
        return code

    def run(self) -> int:
        from rpg.verl.checkpoints import last_complete

        plan, g = self.plan, self.plan.gpus_per_node
        restarts_left, attempt = plan.max_restarts, 0
        k = self.wait_for_size(self.wait_for_nodes_s)
        if k is None:
            return self.end(f"{self.too_few()} (allowed counts {plan.sizes}): nothing started")
        say(f"starting on {k} node(s) x {g} GPU(s) (NNODES={plan.low}:{plan.high}, allowed {plan.sizes}; restarts "
            f"left {restarts_left}{self.choice(k)})")
        while True:
            self.start(k, attempt)
            rc, stopped = self.run_child(k)
            if rc == 0 or (stopped is None and rc != ELASTIC_EXIT):
                return rc if rc >= 0 else 128 - rc  # killed by a signal: the shell's 128 + signum
            attempt, old = attempt + 1, k
            record = json.loads(self.status.read_text()) if self.status.is_file() else {}
            self.stop_line = record.get("stop_line") or self.stop_line
            if stopped != "grow":
                if restarts_left == 0:
                    return self.end(f"restart budget spent (--max-restarts {plan.max_restarts}): the run stops")
                time.sleep(self.settle_s)
            if not self.wait_released():
                return self.end(f"the last trainer's Ray job was not gone within {self.release_timeout_s:.0f} s (ray "
                                "list actors): the run stops rather than start a second trainer beside it")
            k = self.wait_for_size(self.wait_for_nodes_s if stopped != "grow" else 0)
            if k is None:
                return self.end(f"{self.too_few()} after {self.wait_for_nodes_s:.0f} s: the run stops")
            resumed = last_complete(plan.folder)
            redone = [s for s in record.get("logged_steps", []) if s > _step(resumed)]
            where = f"world size {old} x {g} -> {k} x {g}; resuming {resumed or 'from step 0 (nothing saved)'} " \
                    f"(step {_step(resumed)}){self.choice(k)}"
            if stopped == "grow":
                say(f"grown at a checkpoint: {where}; restarts left {restarts_left}")
                continue
            restarts_left -= 1
            reason = record.get("reason") or "the trainer waited on a lost node"
            say(f"restart {plan.max_restarts - restarts_left}/{plan.max_restarts}: {reason}; {where}; {len(redone)} "
                f"logged step(s) after it trained again{f' {redone}' if redone else ''}; restarts left {restarts_left}")
