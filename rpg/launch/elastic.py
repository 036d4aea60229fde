"""The elastic supervisor: a run submitted with ``NNODES=MIN:MAX`` goes on by itself after a node is lost.

``python -m rpg.launch.elastic --nnodes MIN:MAX --sizes K,... --max-restarts R -- PYTHON main_rpg.py OVERRIDES``
is the Ray job's entrypoint (``rpg.launch`` submits it; Ray's job supervisor runs it on the head, so no client
needs to stay). It holds the checkpoint folder (``rpg.verl.folder_lock``) for the whole run and records its PID in
``<checkpoints>/.rpg_elastic/supervisor.json``, then starts the trainer (the driver, ``main_rpg.py``) as its child,
in its process group (Ray's ``ray job stop`` and its kill of the job's group reach both; the child also gets
SIGTERM if the supervisor dies), at the largest node count in ``--sizes`` (the counts in [MIN, MAX] that pass
the driver's rules, checked by the launcher) that the alive nodes can hold. Every count is global-batch
preserving: ``trainer.nnodes`` changes and the per-GPU micro-batches are re-split (``rpg.common.nnodes``).

* **A node lost**: the trainer writes why (``ELASTIC_STATUS_ENV``) and exits ``ELASTIC_EXIT``. While restarts are
  left (``--max-restarts``, like torchrun's: node losses count, growing does not) and at least MIN nodes remain,
  the supervisor waits for the old trainer's Ray resources to be released, sets aside step folders above the last
  complete checkpoint that have no marker (``global_step_N.incomplete-aK``: a save cut short; saving into one
  again would mix two world sizes), and restarts from the last complete checkpoint (``trainer.resume_mode=auto``:
  resharded to the new world size as any resume is) with one line: why, the node, world size old -> new, the
  step resumed, the steps trained again, restarts left. Otherwise it prints the trainer's stop line (its resume
  command asks for an ``NNODES`` the cluster can hold now) and exits 1.
* **Nodes back**: when the alive nodes can hold a larger count, the supervisor waits for the next complete
  checkpoint, stops the trainer (SIGTERM: its stop line) and restarts it at the larger count, one line saying so.
* **Stopped** (``ray job stop``: SIGTERM to the job's processes): the trainer prints its stop line; the
  supervisor waits for it and exits 128 + signum, restarting nothing.

Each attempt has its own torch.distributed rendezvous file (``DIST_INIT_METHOD``: the CPU backend's) and the same
W&B run (``WANDB_RUN_ID``, ``WANDB_RESUME=allow``): set for the trainer and, through the job's config that Ray
hands every driver of the job (``RAY_JOB_CONFIG_JSON_ENV_VAR``), for its Ray workers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rpg.common.nnodes import GPUS_KEY, largest_fit, parse_nnodes, resized_values
from rpg.common.overrides import merge_overrides, values
from rpg.common.signals import StopSignal, raise_on_stop_signals
from rpg.verl.errors import ELASTIC_EXIT, ELASTIC_STATUS_ENV

PREFIX = "rpg.elastic:"
STATE_DIR = ".rpg_elastic"  # under the checkpoint folder: supervisor.json, attempt-N.json
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # ray._private.runtime_env.constants: the job's config for its drivers
POLL_S = 2.0
SETTLE_S = 10.0  # after a loss, before counting nodes again: losses come in groups (a rack, a preemption wave)
WAIT_FOR_NODES_S = 300.0  # below MIN after a loss: how long to wait for nodes to come back
RELEASE_TIMEOUT_S = 180.0  # for the old trainer's actors and GPUs to be released
STOP_WAIT_S = 120.0  # for the trainer's own stop (its stop line) after a SIGTERM


@dataclass
class Plan:
    """What the supervisor was asked (its command line)."""

    low: int
    high: int
    sizes: list[int]
    max_restarts: int
    argv: list[str]  # the trainer's command: PYTHON main_rpg.py OVERRIDES

    @property
    def overrides(self) -> list[str]:
        return self.argv[2:]

    @property
    def gpus_per_node(self) -> int:
        return int(values(self.overrides).get(GPUS_KEY, 1))

    @property
    def folder(self) -> Path:
        return Path(os.path.abspath(str(values(self.overrides)["trainer.default_local_dir"])))

    def command(self, nnodes: int, resume: bool) -> list[str]:
        """The trainer's command at ``nnodes`` nodes (global batch kept: ``resized_values``), resuming or not."""
        changed = resized_values(values(self.overrides), nnodes)
        extra = [f"{k}={v}" for k, v in changed.items()] + (["trainer.resume_mode=auto"] if resume else [])
        return [*self.argv[:2], *merge_overrides(self.overrides, extra)]


def parse_args(argv: Sequence[str]) -> Plan:
    p = argparse.ArgumentParser(prog="python -m rpg.launch.elastic", description=__doc__.split("\n\n")[0])
    p.add_argument("--nnodes", required=True, help="MIN:MAX")
    p.add_argument("--sizes", required=True, help="the node counts in [MIN, MAX] the run may take, comma separated")
    p.add_argument("--max-restarts", type=int, required=True)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- PYTHON main_rpg.py OVERRIDES")
    a = p.parse_args(list(argv))
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    try:
        count = parse_nnodes(a.nnodes, "--nnodes")
        sizes = sorted({int(s) for s in a.sizes.split(",") if s.strip()})
    except ValueError as e:
        p.error(str(e))
    if not sizes or not all(count.low <= k <= count.high for k in sizes) or a.max_restarts < 0 or len(command) < 2:
        p.error(f"--sizes {a.sizes!r} must lie in --nnodes {a.nnodes}, --max-restarts >= 0, and a trainer command "
                "follows --")
    return Plan(count.low, count.high, sizes, a.max_restarts, command)


@dataclass
class Cluster:
    """What the supervisor asks of Ray (a fake in the unit tests)."""

    alive_groups: Callable[[int], int]  # nodes alive that hold that many GPUs
    released: Callable[[int], bool]  # the previous trainer's actors gone and that many GPUs free


def ray_cluster() -> Cluster:
    import ray

    from rpg.verl.cluster import alive_nodes

    def alive_groups(gpus: int) -> int:
        return sum(1 for n in alive_nodes() if n["gpus"] >= gpus)

    def released(gpus: int) -> bool:
        try:  # verl's TransferQueue controller is named and reused by the next trainer if still alive
            ray.get_actor("TransferQueueController", namespace="transfer_queue")
            return False
        except ValueError:
            pass
        return ray.available_resources().get("GPU", 0) >= gpus

    return Cluster(alive_groups, released)


def say(line: str) -> None:
    print(f"{PREFIX} {line}", flush=True)


def set_aside_incomplete(folder: Path, attempt: int) -> list[str]:
    """Step folders above the last complete checkpoint without its marker, renamed ``<name>.incomplete-a<attempt>``
    (never deleted); their names."""
    from rpg.verl.checkpoints import MARKER, last_complete, step_dirs

    last = last_complete(folder)
    last_step = -1 if last is None else int(last.name.removeprefix("global_step_"))
    moved = []
    for n, path in step_dirs(folder):
        if n > last_step and not (path / MARKER).is_file():
            target = path.with_name(f"{path.name}.incomplete-a{attempt}")
            path.rename(target)
            moved.append(target.name)
    return moved


def attempt_env(environ: Mapping[str, str], attempt: int, status: Path, folder: Path) -> dict[str, str]:
    """The trainer's environment for ``attempt``: its status file, its own rendezvous file, the run's W&B id; the
    same variables in the job config Ray hands the trainer's workers."""
    env = dict(environ)
    extra = {"WANDB_RUN_ID": env.get("WANDB_RUN_ID") or hashlib.sha256(str(folder).encode()).hexdigest()[:16],
             "WANDB_RESUME": env.get("WANDB_RESUME") or "allow"}
    if (method := env.get("DIST_INIT_METHOD", "")).startswith("file://"):
        extra["DIST_INIT_METHOD"] = f"{method}-a{attempt}"
    env.update(extra)
    env[ELASTIC_STATUS_ENV] = str(status)
    if JOB_CONFIG_ENV in env:
        job = json.loads(env[JOB_CONFIG_ENV])
        runtime = job.setdefault("runtime_env", {}) or {}
        job["runtime_env"] = runtime
        runtime["env_vars"] = {**(runtime.get("env_vars") or {}), **extra}
        env[JOB_CONFIG_ENV] = json.dumps(job)
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class Supervisor:
    plan: Plan
    cluster: Cluster
    environ: Mapping[str, str]
    settle_s: float = SETTLE_S
    wait_for_nodes_s: float = WAIT_FOR_NODES_S
    release_timeout_s: float = RELEASE_TIMEOUT_S
    poll_s: float = POLL_S
    child: subprocess.Popen | None = None
    events: list[str] = field(default_factory=list)

    def choose(self) -> int | None:
        return largest_fit(self.plan.sizes, self.cluster.alive_groups(self.plan.gpus_per_node))

    def wait_for_size(self, timeout_s: float) -> int | None:
        deadline = time.time() + timeout_s
        while (k := self.choose()) is None and time.time() < deadline:
            time.sleep(self.poll_s)
        return k

    def wait_released(self, nnodes: int) -> bool:
        """Whether the previous trainer's Ray resources were released (its workers gone: none of them writes into
        the checkpoint folder any more) and ``nnodes`` nodes' GPUs are free, within ``release_timeout_s``."""
        deadline = time.time() + self.release_timeout_s
        while not (free := self.cluster.released(nnodes * self.plan.gpus_per_node)) and time.time() < deadline:
            time.sleep(self.poll_s)
        return free

    def not_released(self, nnodes: int, stop_line: str) -> int:
        say(f"the previous trainer's Ray actors or {nnodes * self.plan.gpus_per_node} GPU(s) were not released within "
            f"{self.release_timeout_s:.0f} s (ray list actors; ray status): the run stops rather than start a second "
            "trainer beside them")
        print(stop_line, file=sys.stderr, flush=True)
        return 1

    def start(self, nnodes: int, attempt: int) -> Path:
        status = self.plan.folder / STATE_DIR / f"attempt-{attempt}.json"
        status.parent.mkdir(parents=True, exist_ok=True)
        status.unlink(missing_ok=True)
        env = attempt_env(self.environ, attempt, status, self.plan.folder)
        self.child = subprocess.Popen(self.plan.command(nnodes, resume=attempt > 0), env=env,
                                      preexec_fn=_die_with_parent)
        return status

    def run_child(self, nnodes: int) -> tuple[int, bool]:
        """Wait for the trainer; stop it at a checkpoint boundary when more nodes can hold the run. Returns its exit
        code and whether the supervisor stopped it to grow."""
        from rpg.verl.checkpoints import last_complete

        mark = None  # the last complete checkpoint when a larger count became possible
        while (rc := self.child.poll()) is None:
            time.sleep(self.poll_s)
            bigger = self.choose()
            if bigger is None or bigger <= nnodes:
                mark = None
                continue
            latest = last_complete(self.plan.folder)
            if mark is None:
                mark = (latest,)
                say(f"{bigger} node(s) can hold the run now (it runs on {nnodes}): growing at the next checkpoint")
            elif latest != mark[0]:
                say(f"checkpoint {latest} complete: stopping the trainer to grow to {bigger} node(s)")
                self.child.send_signal(signal.SIGTERM)
                return self.child.wait(timeout=STOP_WAIT_S), True
        return rc, False

    def run(self) -> int:
        from rpg.verl.checkpoints import last_complete

        plan, g = self.plan, self.plan.gpus_per_node
        restarts_left, attempt = plan.max_restarts, 0
        k = self.wait_for_size(self.wait_for_nodes_s)
        if k is None:
            say(f"fewer than {plan.low} node(s) with {g} GPU(s) each are alive (allowed counts: {plan.sizes}); nothing "
                "started")
            return 1
        say(f"starting on {k} node(s) x {g} GPU(s) (NNODES={plan.low}:{plan.high}, allowed {plan.sizes}; restarts "
            f"left {restarts_left})")
        while True:
            status = self.start(k, attempt)
            rc, grow = self.run_child(k)
            if not grow and rc != ELASTIC_EXIT:
                return rc
            attempt += 1
            old = k
            if grow:
                k = self.choose() or k
                if not self.wait_released(k):
                    return self.not_released(k, "rpg.elastic: the trainer was stopped to grow: its stop line above "
                                                "names the command that resumes the run")
                resumed = last_complete(plan.folder)
                say(f"grown: world size {old} x {g} -> {k} x {g}; resuming {resumed} (restarts left {restarts_left})")
                continue
            record = json.loads(status.read_text()) if status.is_file() else {}
            stop_line = record.get("stop_line") or "rpg: stopped: a node of the run was lost"
            if restarts_left == 0:
                say(f"restart budget spent (--max-restarts {plan.max_restarts}): the run stops")
                print(stop_line, file=sys.stderr, flush=True)
                return 1
            time.sleep(self.settle_s)
            k = self.wait_for_size(self.wait_for_nodes_s)
            if k is None:
                say(f"fewer than {plan.low} node(s) with {g} GPU(s) each are alive after {self.wait_for_nodes_s:.0f} s: "
                    "the run stops")
                print(stop_line, file=sys.stderr, flush=True)
                return 1
            if not self.wait_released(k):
                return self.not_released(k, stop_line)
            moved = set_aside_incomplete(plan.folder, attempt)
            resumed = last_complete(plan.folder)
            step = 0 if resumed is None else int(resumed.name.removeprefix("global_step_"))
            redone = [s for s in record.get("logged_steps", []) if s > step]
            restarts_left -= 1
            say(f"restart {plan.max_restarts - restarts_left}/{plan.max_restarts}: {record.get('reason', 'node lost')}; "
                f"world size {old} x {g} -> {k} x {g}; resuming {resumed or 'from step 0 (nothing saved)'} (step "
                f"{step}); {len(redone)} logged step(s) after it trained again{f' {redone}' if redone else ''}"
                f"{f'; set aside {moved}' if moved else ''}; restarts left {restarts_left}")


def submission_id(environ: Mapping[str, str]) -> str | None:
    """The Ray job's submission id (the job config's metadata, ``job_submission_id``), or None outside a job."""
    try:
        return json.loads(environ[JOB_CONFIG_ENV]).get("metadata", {}).get("job_submission_id")
    except (KeyError, ValueError, AttributeError):
        return None


def write_record(plan: Plan, environ: Mapping[str, str]) -> Path:
    path = plan.folder / STATE_DIR / "supervisor.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
              "submission": submission_id(environ), "command": plan.argv}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    import ray

    from rpg.config import RPGConfigError
    from rpg.verl import folder_lock
    from rpg.verl.errors import ERROR_PREFIX

    plan = parse_args(sys.argv[1:] if argv is None else argv)
    ray.init(address="auto", log_to_driver=False, logging_level="ERROR")
    handlers = raise_on_stop_signals()  # after ray.init, which installs its own SIGTERM handler
    supervisor = Supervisor(plan, ray_cluster(), os.environ)
    try:
        plan.folder.mkdir(parents=True, exist_ok=True)
        try:
            _, token = folder_lock.acquire(str(plan.folder), f"elastic supervisor pid {os.getpid()} on "
                                                            f"{socket.gethostname()}")
        except RPGConfigError as e:
            print(f"{ERROR_PREFIX}: {e}", file=sys.stderr, flush=True)
            return 2
        supervisor.environ = {**os.environ, folder_lock.TOKEN_ENV: token}
        say(f"supervisor pid {os.getpid()} recorded in {write_record(plan, os.environ)}")
        return supervisor.run()
    except StopSignal as stop:
        handlers.hold()
        child = supervisor.child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)  # Ray's job stop sent it one too; the trainer prints its stop line
            try:
                child.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        say(f"stopped by {stop.name}; nothing restarted")
        return stop.code
    finally:
        handlers()
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
