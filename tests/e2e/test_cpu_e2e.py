"""End-to-end: verl's real trainer on the CPU backend with the tiny model: verl's stock GRPO through
the recipe (``rpg.loss.name=verl``: the path of the paper's GRPO scripts and of the tiny demo's
``ALGO=grpo``), 2 steps, each trained in 4 mini-batches (off-policy after the first), a fixed
reference with verl's k3 KL loss.

One run is shared by the assertions below (about a minute on 2 cores), the run's Ray cluster seen from
outside included: while the run starts up, a client on this machine without the run's token is refused and
one with it is not (``test_a_runs_ray_cluster_refuses_a_client_without_its_token``). Resuming from a
checkpoint: tests/e2e/test_verl_reference_resume_e2e.py.
"""

import math
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from e2e_recipe import network_address, network_listeners, ray_client, reachable, run_exposure

from rpg.trainer_process import run_trainer
from rpg.tiny.overrides import tiny_algorithm, tiny_overrides

pytestmark = [pytest.mark.e2e, pytest.mark.trainer_e2e]  # a CI stage: README's suite runs no trainer launch

ROOT = Path(__file__).resolve().parents[2]

_WEIGHTS_LINE = re.compile(r"\[hf-rollout\] weights v(\d+) loaded \(global_steps=(\w+), checksum=([-0-9.e]+)")
# float32 rounding of verl's k3 ("low_var_kl": exp(x) - x - 1, exp near 1 rounded by up to 6e-8)
K3_ROUNDING = 1e-6


def weight_loads(run) -> list[tuple[int, str, float]]:
    """(version, global_steps, checksum) of every actor->rollout weight sync, in order."""
    return [(int(v), g, float(c)) for v, g, c in _WEIGHTS_LINE.findall(run.log)]


def val_acc(data: dict) -> float | None:
    keys = [k for k in data if k.startswith("val-core/math_dapo/acc/mean@")]
    return data[keys[0]] if keys else None


@pytest.fixture(scope="module")
def grpo(tiny_assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo")
    entry, _ = tiny_algorithm("grpo")
    listeners: dict[int, list[str]] = {}

    def on_metrics(step, _data):  # while the run is up: every process of it (Ray's daemons included)
        listeners[step] = network_listeners(psutil.Process().children(recursive=True))

    cluster = ClusterProbe(out)
    run = run_trainer(
        [*tiny_overrides(tiny_assets, steps=2, test_freq=2, algo="grpo"), f"trainer.default_local_dir={out / 'ckpt'}"],
        output_dir=out / "run",
        entry=str(ROOT / entry),
        timeout_s=600,
        on_metrics=on_metrics,
        on_line=cluster.on_line,
    )
    cluster.join()
    run.network_listeners = listeners
    run.cluster = cluster.found
    return run


class ClusterProbe:
    """The run's Ray cluster seen from outside, probed once it has started (the driver's "Started a local
    Ray instance" line) and while the run starts its trainer and workers (30 s or more on an idle machine,
    longer under load): the run's listeners beyond loopback, whether its GCS port answers on this machine's
    network address, and two clients on loopback, one without the run's token and one with it (taken from
    the environment of the run's GCS server), each running a task that writes a file. The client without
    the token gives up after about 20 s of Ray's retries (wall-clock, whatever the load); whether the GCS
    server was still running when both had ended is recorded, so that a refusal by a cluster already gone
    never passes for the token's."""

    def __init__(self, out: Path):
        self.out, self.found, self.started = out, {}, threading.Event()
        self.thread = threading.Thread(target=self._probe, daemon=True)

    def on_line(self, line: str) -> None:  # the harness's reader thread: never block it
        if "Started a local Ray instance" in line and not self.started.is_set():
            self.started.set()
            self.thread.start()

    def join(self) -> None:
        if self.started.is_set():
            self.thread.join(timeout=180)

    def _probe(self) -> None:
        found = self.found
        try:
            procs = psutil.Process().children(recursive=True)  # the run's process tree (Ray's daemons included)
            gcs = next(p for p in procs if _name(p) == "gcs_server")
            # started with --gcs_server_port=0: the port the OS gave it is the one it listens on
            (port,) = {c.laddr.port for c in psutil.net_connections("inet")
                       if c.pid == gcs.pid and c.status == psutil.CONN_LISTEN}
            found["listeners"], found["exposed"] = network_listeners(procs), run_exposure(procs)
            ip = found["ip"] = network_address()
            found["network"] = reachable(ip, port) if ip is not None else None
            address, token = f"127.0.0.1:{port}", _token(gcs.environ())
            with ThreadPoolExecutor(2) as pool:  # both at once: the probe stays short beside the run's start-up
                without = pool.submit(ray_client, self.out / "client-home", address, self.out / "without", None)
                with_token = pool.submit(ray_client, self.out / "client-home", address, self.out / "with", token)
                found["without"], found["with"] = without.result(), with_token.result()
            found["gcs_alive_after"] = gcs.is_running()
        except Exception as e:  # reported by the test, with what was found before
            found["error"] = repr(e)


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:  # a short-lived child already gone
        return ""


def _token(env: dict) -> str:
    """The run's Ray token: its own (``RAY_AUTH_TOKEN``) or the file a user exported (``RAY_AUTH_TOKEN_PATH``)."""
    if env.get("RAY_AUTH_TOKEN"):
        return env["RAY_AUTH_TOKEN"]
    if env.get("RAY_AUTH_TOKEN_PATH"):
        return Path(env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    raise AssertionError(f"the run's GCS server has no Ray token (RAY_AUTH_MODE={env.get('RAY_AUTH_MODE')!r})")


def test_two_steps_reach_the_end_with_validation(grpo):
    run = grpo
    assert run.returncode == 0
    assert run.metrics[1]["training/global_step"] == 1
    assert run.metrics[2]["training/global_step"] == 2
    assert run.last_step() == 2
    # validation before training (logged at step 0) and after the last step
    assert val_acc(run.metrics[0]) is not None and val_acc(run.metrics[2]) is not None
    assert 0.0 <= val_acc(run.metrics[0]) <= 1.0


def test_verls_own_loss_and_a_fixed_reference_through_the_recipe(grpo):
    """rpg.loss.name=verl with a reference mode: verl builds the reference model and adds its own KL
    term; the RPG loss never runs; the recipe's trainer logs the reference diagnostics."""
    run = grpo
    all_keys = {k for d in run.metrics.values() for k in d}
    assert "loss=verl:vanilla" in run.log and "anchor=reference mode=fixed" in run.log
    assert "timing_s/ref" in all_keys and not any(k.startswith("actor/rpg/") for k in all_keys)
    assert "actor/pg_clipfrac_lower" in all_keys and "actor/kl_loss" in all_keys  # verl's vanilla loss + KL term
    assert "rpg/ref_reset" not in all_keys  # fixed: never reset


def test_updates_move_away_from_the_reference(grpo):
    """verl's k3 KL loss against the fixed reference (= the initial actor) is >= 0 token by token, so
    at every step up to float32 rounding; at step 2 pi_theta is the actor after step 1's update (a
    non-zero gradient: test_actor_weights_change_and_reach_the_rollout), so every token's log-ratio to
    the reference is non-zero and the loss is > 0. The same for the recipe's k3 estimate of
    KL(pi_old || pi_ref) on the step's batch (``rpg/ref_kl``): pi_old of step 1 is the reference.
    (verl's ``ppo_kl`` is k1 against pi_old: no sign, and recomputation noise makes it non-zero even
    on-policy, so it proves nothing here.)"""
    run = grpo
    for step in (1, 2):
        assert run.metrics[step]["actor/kl_loss"] >= -K3_ROUNDING, step
        assert run.metrics[step]["rpg/ref_kl"] >= -K3_ROUNDING, step
    assert run.metrics[2]["actor/kl_loss"] > K3_ROUNDING
    assert run.metrics[1]["rpg/ref_kl"] < K3_ROUNDING < run.metrics[2]["rpg/ref_kl"]


def test_rollout_and_actor_agree_after_weight_sync(grpo):
    run = grpo
    for step in (1, 2):
        m = run.metrics[step]
        # verl compares the rollout's log-probs with the actor's recomputation of the same tokens
        # (float32 on both sides here; the GPU path only reports it, bf16 vs bf16: docs/gpu-smoke.md)
        assert m["training/rollout_probs_diff_max"] < 1e-3, m["training/rollout_probs_diff_max"]
        assert m["training/rollout_actor_probs_pearson_corr"] > 0.999


def test_actor_weights_change_and_reach_the_rollout(grpo):
    run = grpo
    loads = weight_loads(run)
    # initial sync (global_steps=0) + one after each of the 2 updates (global_steps=1, 2)
    assert [g for _, g, _ in loads] == ["0", "1", "2"], run.tail()
    checksums = [c for _, _, c in loads]
    assert checksums[0] != checksums[1] != checksums[2]
    assert run.metrics[1]["actor/grad_norm"] > 0


def test_metrics_are_finite(grpo):
    run = grpo
    bad = {
        (s, k): v
        for s, d in run.metrics.items()
        for k, v in d.items()
        if isinstance(v, (int, float)) and not math.isfinite(v)
    }
    assert not bad


def test_no_ray_process_left_behind(grpo):
    assert grpo.leftover_pids == []


def test_no_process_of_the_run_listens_beyond_loopback(grpo):
    """Checked at every logged step, while the trainer, Ray's daemons, the rollout server and the
    workers are up. Before: gcs_server, raylet, workers and the agents listened on every interface or the
    node's address (fixed by Ray's single-machine mode, rpg.backends.run_env), and so did torch.distributed's
    TCPStore of the FSDP worker group (fixed by a file rendezvous, rpg.trainer_process)."""
    assert sorted(grpo.network_listeners) == [0, 1, 2]
    assert all(found == [] for found in grpo.network_listeners.values()), grpo.network_listeners


def test_a_runs_ray_cluster_refuses_a_client_without_its_token(grpo):
    """The run's Ray cluster is not open to the network, and on this machine only the run's token opens it
    (rpg.backends.run_env: Ray's single-machine mode and token authentication with a token per run). Before:
    gcs_server, raylet, workers and the agents listened on every interface or the node's address, and a
    client on this machine without any token ran a task as the run's user."""
    found, out = grpo.cluster, grpo.output_dir.parent
    assert found and "error" not in found, found
    assert found["listeners"] == [] and found["exposed"] == []  # loopback only, while the cluster is up
    assert found["gcs_alive_after"]  # both clients met the running cluster, not one already shut down
    # refused by the token check itself (Ray's AuthenticationError), not by anything else that fails a client
    assert not (out / "without").exists(), found["without"].stderr[-2000:]
    assert found["without"].returncode != 0 and "AuthenticationError" in found["without"].stderr, \
        found["without"].stderr[-2000:]
    assert (out / "with").read_text() == "ran as the run's user", found["with"].stderr[-2000:]
    if found["ip"] is None:
        pytest.skip("this machine has no non-loopback address to connect through (the clients' checks passed)")
    assert found["network"] is False  # the GCS port is not reachable through the machine's network address
