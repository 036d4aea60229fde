"""Forward+backward time and peak extra memory of the RPG losses vs verl's own
``compute_policy_loss_vanilla`` (dual-clip PPO) on the same tensors, measured in one run.

    python benchmarks/bench_losses.py                 # 64 x 8192 tokens, float32, CPU
    python benchmarks/bench_losses.py --batch 8 --length 1024 --reps 5

Times are CPU time of the measuring thread (torch intra-op threads = 1 by default), taken in one
process, round-robin over the candidates, so that other load on the machine perturbs them little. Peak memory is measured per candidate in its own subprocess: the growth of
the peak resident set (ru_maxrss) over the level reached once the inputs exist, i.e. what one
forward+backward needs on top of its inputs. Printed ratios are against verl's vanilla loss.
Target (issue #2): time ratio <= 1.25 for every form with clipping on.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

CANDIDATES = {
    "verl-vanilla (dual-clip PPO)": None,
    "rpg reinforce ufkl clip": dict(divergence="ufkl", form="reinforce"),
    "rpg reinforce urkl clip": dict(divergence="urkl", form="reinforce"),
    "rpg differentiable ufkl clip": dict(divergence="ufkl", form="differentiable"),
    "rpg differentiable urkl clip": dict(divergence="urkl", form="differentiable"),
}


def make_step(name: str, batch: int, length: int):
    """Inputs and a closure running one forward+backward of candidate `name`."""
    import torch
    from omegaconf import OmegaConf

    torch.manual_seed(0)
    old = -torch.rand(batch, length) * 3
    log_prob0 = old + 0.05 * torch.randn(batch, length)
    adv = torch.randn(batch, 1).expand(batch, length).contiguous()
    mask = (torch.rand(batch, length) > 0.1).float()
    spec = CANDIDATES[name]
    if spec is None:
        from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

        cfg = OmegaConf.create(dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, global_batch_info={}))

        def step(lp):
            return compute_policy_loss_vanilla(old, lp, adv, mask, "token-mean", cfg)
    else:
        from rpg.losses import RPGLossConfig, rpg_policy_loss

        cfg = RPGLossConfig(beta=1e-4, clip=True, **spec)

        def step(lp):
            return rpg_policy_loss(lp, old, adv, mask, cfg)

    def once():
        lp = log_prob0.clone().requires_grad_(True)
        loss, _ = step(lp)
        loss.backward()

    return once


def peak_extra_kib(name: str, batch: int, length: int) -> int:
    once = make_step(name, batch, length)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    once()
    once()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU time is per thread)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(peak_extra_kib(args.one, args.batch, args.length)))
        return
    memory = {}
    for name in CANDIDATES:
        out = subprocess.run([sys.executable, __file__, "--one", name, "--batch", str(args.batch), "--length", str(args.length)],
                             check=True, capture_output=True, text=True)
        memory[name] = json.loads(out.stdout.strip().splitlines()[-1])
    steps = {name: make_step(name, args.batch, args.length) for name in CANDIDATES}
    times = {name: [] for name in CANDIDATES}
    for name, once in steps.items():
        once()  # warm-up
    for _ in range(args.reps):
        for name, once in steps.items():
            t0 = time.thread_time()
            once()
            times[name].append(time.thread_time() - t0)
    ref = "verl-vanilla (dual-clip PPO)"
    t_ref, m_ref = statistics.median(times[ref]), max(memory[ref], 1)
    print(f"{args.batch} x {args.length} tokens, float32, CPU ({args.threads} thread), median thread CPU time of "
          f"{args.reps} round-robin forward+backward passes")
    print(f"{'loss':30s} {'time ms':>8s} {'time ratio':>11s} {'peak extra MiB':>15s} {'mem ratio':>10s}")
    for name in CANDIDATES:
        t = statistics.median(times[name])
        print(f"{name:30s} {1e3 * t:8.1f} {t / t_ref:11.2f} {memory[name] / 1024:15.0f} {memory[name] / m_ref:10.2f}")


if __name__ == "__main__":
    main()
