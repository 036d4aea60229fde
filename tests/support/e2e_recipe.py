"""Helpers of the recipe's end-to-end tests on the CPU backend (tiny model): a run of the RPG recipe
with RPG defaults (``rpg_run``), metric access, and the assertions of what the RPG loss metrics
guarantee (``assert_off_policy``; tests/e2e/test_e2e_assertions.py checks them against the loss library).

Each assertion states what the quantity guarantees, not what it usually shows: a k3-type KL is >= 0
(up to float32 rounding), a normalized one has no sign; the ratio range of a step contains 1; equal
only where the math makes two quantities equal (then within float32 rounding). Where an assertion
needs the policy to have moved ("> 0", "!= before"), its premise is a non-zero gradient, and the
threshold (1e-4 on log-probs, 1e-6 on a KL) lies far above float32 recomputation noise (~1e-6 on
log-probs, ~1e-12 on a KL) and far below what one update of the tiny model moves.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from rpg.tiny.overrides import MINI_BATCH_SIZE

ROOT = Path(__file__).resolve().parents[2]
ENTRY = str(ROOT / "recipe" / "rpg" / "main_rpg.py")
_WEIGHTS_LINE = re.compile(r"\[hf-rollout\] weights v\d+ loaded \(global_steps=(\w+), checksum=([-0-9.e]+)")


def rpg_run(cpu_trainer, tmp_path, overrides, steps=2, mini=MINI_BATCH_SIZE, n=8, validate=False, name="run"):
    """Run the recipe on the tiny task (conftest's ``cpu_trainer``) with RPG defaults (``rpg_defaults``)."""
    ov = [*rpg_defaults(mini, n, validate), f"trainer.default_local_dir={tmp_path / 'ckpt'}", *overrides]
    run = cpu_trainer(ov, steps=steps, entry=ENTRY, name=name)
    assert run.last_step() == steps, run.tail()
    assert not run.leftover_pids
    return run


def rpg_defaults(mini=MINI_BATCH_SIZE, n=8, validate=False) -> list[str]:
    """The overrides of ``rpg_run`` on top of the tiny task and demo algorithm: rpg advantage, no verl KL,
    ``mini`` prompts per mini-batch (8 per step) and 2 micro-batches per mini-batch."""
    return [
        "actor_rollout_ref.actor.use_kl_loss=False",
        "algorithm.adv_estimator=rpg",
        "algorithm.norm_adv_by_std_in_grpo=False",
        # the recipe's 10 warm-up steps start at lr 0 (verl's schedule): step 1 would not move the actor
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={max(1, mini * n // 2)}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={8 * n}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={8 * n}",
        f"trainer.val_before_train={validate}",
        f"trainer.test_freq={1 if validate else -1}",
    ]


def world_size_overrides(world_size: int) -> list[str]:
    """The tiny task's batches with 4 responses per prompt (tests/e2e/test_verl_reference_resume_e2e.py's PERIODIC_K2:
    8 responses per mini-batch, 32 per step) served by ``world_size`` ranks, split evenly (the driver refuses
    micro-batches that do not divide per rank)."""
    return [f"trainer.n_gpus_per_node={world_size}",  # the harness gives the private Ray that many logical GPUs
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={8 // world_size}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={32 // world_size}",
            f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={32 // world_size}"]


# float32 rounding of a k3-type mean: exp(x) near 1 is rounded by up to 6e-8 (half an ulp of 1), so
# w - 1 - log w can come out a few 1e-8 below 0 on a token where w is 1 or nearly
K3_ROUNDING = 1e-6
# on-policy tokens (the first mini-batch of a step, pi_theta == pi_old) give |log w| of float32
# recomputation noise only (~1e-6: other micro-batching than the old-log-prob pass); moved ones far more
ON_POLICY = 1e-3
# (eps_low, eps_high, c) of the runs that check RPG-Style Clip: a band narrower than the paper's
# (0.2, 0.28) so that "some token was clipped" needs only a ratio 5 % away from 1, not a large update
NARROW_CLIP = (0.05, 0.05, 10.0)
NARROW_CLIP_OVERRIDES = [f"actor_rollout_ref.actor.clip_ratio_low={NARROW_CLIP[0]}",
                         f"actor_rollout_ref.actor.clip_ratio_high={NARROW_CLIP[1]}",
                         f"actor_rollout_ref.actor.clip_ratio_c={NARROW_CLIP[2]}"]


def assert_off_policy(run, steps, clip=None):
    """What the RPG loss metrics guarantee at every step, then that the run was off-policy.

    Several mini-batches per step: the first is on-policy (pi_theta == pi_old), the later ones see the
    earlier updates. Guaranteed at every step, whatever was sampled:

    * the ratio range contains 1 (the first mini-batch) and ratio_min > 0;
    * mean(w) - 1 - mean(log w) = mean(w - 1 - log w) >= 0 (k3 token by token; each logged mean is the
      mean over the mini-batch's tokens, rpg.verl.actor_loss._global_means, averaged over mini-batches);
    * kl_estimate >= 0 for the unnormalized surrogates (ufkl: w - 1 - log w against the sampler,
      r_ref * k3(rho) against a reference; urkl: r_ref * (rho log rho - rho + 1)), both >= 0 token by
      token; nothing for the normalized ones (fkl: -log rho, rkl: w log rho have a zero-mean part and
      their sample mean can be negative: -6.2e-4 was measured for rkl at step 1);
    * with RPG-Style Clip (``clip`` = (eps_low, eps_high, c)): the clipped share splits into its
      three kinds, and a kind can be counted only where the ratio range reaches its bound (a positive
      token is clipped only at w >= 1 + eps_high, a negative one below at w <= 1 - eps_low, by the dual
      clip at w >= c).

    Off-policy (the point of these runs): some step's ratio range leaves 1. Premise: an update before
    a step's last mini-batch has a non-zero gradient (a group with mixed rewards in it); with clip,
    premise: some ratio also leaves the clip band (``clip`` is chosen narrow for that)."""
    divergence = _divergence(run)
    for s in steps:
        assert_step_guarantees(run, s, divergence, clip)
    ranges = [(s, at(run, s, "actor/rpg/ratio_min"), at(run, s, "actor/rpg/ratio_max")) for s in steps]
    assert any(hi > 1 + ON_POLICY or lo < 1 - ON_POLICY for _, lo, hi in ranges), ranges
    if clip is not None:
        assert any(at(run, s, "actor/rpg/clipfrac") > 0 for s in steps)


def assert_step_guarantees(run, s, divergence, clip=None):
    """The guaranteed part of ``assert_off_policy`` for step ``s`` (tests/e2e/test_e2e_assertions.py feeds it
    steps built from the loss library: it must hold whatever was sampled)."""
    kl = at(run, s, "actor/rpg/kl_estimate")
    if divergence in ("ufkl", "urkl"):
        assert kl >= -K3_ROUNDING, (s, divergence, kl)
    lo, hi = at(run, s, "actor/rpg/ratio_min"), at(run, s, "actor/rpg/ratio_max")
    assert 0 < lo <= 1 + ON_POLICY and hi >= 1 - ON_POLICY, (s, lo, hi)
    k3 = at(run, s, "actor/rpg/ratio_mean") - 1 - at(run, s, "actor/rpg/log_ratio_mean")
    assert k3 >= -K3_ROUNDING, (s, k3)
    if clip is not None:
        eps_low, eps_high, c = clip
        parts = {k: at(run, s, f"actor/rpg/clipfrac{k}") for k in ("", "_high", "_low", "_dual")}
        assert 0 <= parts[""] <= 1 and parts[""] == pytest.approx(
            parts["_high"] + parts["_low"] + parts["_dual"], abs=1e-6), (s, parts)
        assert parts["_high"] == 0 or hi >= (1 + eps_high) * (1 - 1e-6), (s, parts, hi)
        assert parts["_low"] == 0 or lo <= (1 - eps_low) * (1 + 1e-6), (s, parts, lo)
        assert parts["_dual"] == 0 or hi >= c * (1 - 1e-6), (s, parts, hi)


def _divergence(run) -> str:
    """The run's rpg.loss.divergence, from the driver's one-line description of the loss."""
    found = re.search(r"divergence=(\w+)", run.log)
    assert found, "the driver's 'rpg: loss=...' line is missing from the log"
    return found.group(1)


def weight_syncs(run) -> list[tuple[str, float]]:
    """(global_steps, checksum) of every actor -> rollout weight sync, in order."""
    return [(g, float(c)) for g, c in _WEIGHTS_LINE.findall(run.log)]


def synced_weights(run) -> dict[str, float]:
    """global_steps -> checksum of the weights the actor sent to the rollout server."""
    return dict(weight_syncs(run))


def at(run, step, key):
    value = run.metrics[step][key]
    assert math.isfinite(value), (key, value)
    return value


def keys(run):
    return {k for d in run.metrics.values() for k in d}


RPG_LOSS_KEYS = ["actor/rpg/kl_estimate", "actor/rpg/ratio_max", "actor/rpg/ratio_min", "actor/rpg/clipfrac",
                 "actor/rpg/clipfrac_high", "actor/rpg/clipfrac_low", "actor/rpg/clipfrac_dual",
                 "actor/rpg/reg_adv_mean", "actor/pg_loss"]


def is_loopback(ip: str) -> bool:
    """Loopback, also as an IPv4-mapped IPv6 address (gRPC's ``::ffff:127.0.0.1``; Python < 3.13's
    ``IPv6Address.is_loopback`` is true for ``::1`` only)."""
    addr = ipaddress.ip_address(ip.split("%")[0])
    return addr.is_loopback or bool(getattr(addr, "ipv4_mapped", None) and addr.ipv4_mapped.is_loopback)


def network_listeners(procs: list[psutil.Process]) -> list[str]:
    """Every listening socket of ``procs`` on a non-loopback address, as ``name pid address:port``; one that
    is torch.distributed's rendezvous store (the port in its process's ``MASTER_PORT``) is marked
    ``[torch.distributed store]``: torch's TCPStore server binds every interface whatever ``MASTER_ADDR``
    says, and verl creates it through ``init_process_group`` (no bind address to give)."""
    pids = {p.pid: p for p in procs}
    found = []
    for c in psutil.net_connections("inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids and not is_loopback(c.laddr.ip):
            try:
                name, env = pids[c.pid].name(), pids[c.pid].environ()
            except psutil.Error:
                name, env = "?", {}
            store = " [torch.distributed store]" if env.get("MASTER_PORT") == str(c.laddr.port) else ""
            found.append(f"{name} {c.pid} {c.laddr.ip}:{c.laddr.port}{store}")
    return found


# ----------------------------------------------------------------------------- a run's Ray cluster, from outside
# A client that runs a task in the cluster at ``argv[1]`` writing the file ``argv[2]``: what another user's
# client would run as the run's user. ``num_cpus=0``: it needs no CPU of the run's, so it can run at any moment.
RAY_CLIENT = textwrap.dedent("""
    import sys, ray
    ray.init(address=sys.argv[1], log_to_driver=False)
    @ray.remote(num_cpus=0)
    def write(path):
        open(path, "w").write("ran as the run's user")
    ray.get(write.remote(sys.argv[2]), timeout=60)
""")


def network_address() -> str | None:
    """This machine's first non-loopback IPv4 address (what another node would connect to), or None."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not is_loopback(a.address):
                return a.address
    return None


def run_exposure(procs: list[psutil.Process]) -> list[str]:
    """Each listener of ``procs`` on a non-loopback address whose process does not require Ray's token
    (``RAY_AUTH_MODE=token`` and a token in its environment), as ``name pid address:port``; [] when none.
    (With the run's loopback mode there is no non-loopback listener at all; this is the weaker rule the
    token alone guarantees.)"""
    pids = {p.pid: p for p in procs}
    bad = []
    for c in psutil.net_connections("inet"):
        if c.status != psutil.CONN_LISTEN or c.pid not in pids or is_loopback(c.laddr.ip):
            continue
        p = pids[c.pid]
        try:
            env, name = p.environ(), p.name()
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:  # cannot be verified: counted as exposed
            env, name = {}, "?"
        if env.get("RAY_AUTH_MODE") != "token" or not (env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH")):
            bad.append(f"{name} {c.pid} {c.laddr.ip}:{c.laddr.port}")
    return bad


def ray_client(home: Path, address: str, target: Path, token: str | None) -> subprocess.CompletedProcess:
    """Run ``RAY_CLIENT`` against ``address`` with ``token`` (None: none at all, no token file either)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # a client of a loopback cluster runs in the same single-machine mode (its core worker must find the
    # raylet on loopback), so only the token tells the two clients apart
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    if token is not None:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    try:
        return subprocess.run([sys.executable, "-c", RAY_CLIENT, address, str(target)], env=env, capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, -1, "", "timed out")


def reachable(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port is accepted."""
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False
