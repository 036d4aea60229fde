"""Forward+backward cost of the RPG losses vs verl's own ``compute_policy_loss_vanilla`` (dual-clip
PPO, with its metrics) on the same tensors, measured in one run: operator count, time, peak memory.

    python benchmarks/bench_losses.py                          # 64 x 8192 tokens, float32, CPU
    python benchmarks/bench_losses.py --device cuda --reps 40  # CUDA events, max_memory_allocated
    python benchmarks/bench_losses.py --variants all           # every form/divergence/clip/anchor
    python benchmarks/bench_losses.py --batch 2 --length 64 --reps 1   # smoke (tests/benchmarks/test_bench_losses.py)
    python benchmarks/bench_losses.py --baseline ../other-checkout      # this tree's losses against another's

Every candidate returns its loss and its metrics as floats (so each pays its host syncs); RPG rows
use ``rpg_policy_loss`` (eager) or the same with ``RPGLossConfig(compile=True)`` (torch.compile,
inductor), plus one row through the verl glue (``rpg.verl.policy_loss.rpg_policy_loss``: verl's ``agg_loss``).

* ops: top-level aten operators of one forward+backward (torch.profiler; an aten op counts when no
  other aten op encloses it, so an op and its internal calls count once), at 4 x 1024 tokens,
  counted the same way for every candidate (``count_ops``; tests/math/test_losses_opcount.py asserts
  RPG <= vanilla for every variant). Not given for compiled rows (their graph runs fused kernels).
* time: median over ``--reps`` round-robin passes in one process. CPU: thread CPU time (torch
  intra-op threads = ``--threads``). CUDA: CUDA events around each pass.
* memory: peak bytes of live tensors during one forward+backward above what existed before it.
  CUDA: ``torch.cuda.max_memory_allocated``. CPU: the profiler's allocation events (allocator-exact;
  the resident set size would also count the C allocator's caching).
Printed ratios are against verl's vanilla loss; with ``--baseline DIR`` a second table gives each RPG row's
time against the same loss of another checkout's library (before/after a change), timed in the same passes.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

VANILLA = "verl vanilla (dual-clip PPO)"
CORE = [  # the table of benchmarks/README.md#bench_lossespy: clip on, anchor = sampler
    dict(form="reinforce", divergence="ufkl"), dict(form="reinforce", divergence="urkl"),
    dict(form="differentiable", divergence="ufkl"), dict(form="differentiable", divergence="urkl"),
]
VARIANTS = [  # every RPG loss: both forms, all four divergences, clip on/off, sampler/reference anchor
    dict(form=f, divergence=d, clip=c, anchor=a)
    for f, d, c, a in itertools.product(("reinforce", "differentiable"), ("fkl", "rkl", "ufkl", "urkl"),
                                        (True, False), ("sampler", "reference"))
] + [
    dict(form="differentiable", divergence=d, clip=c, anchor="sampler", fd_clip="algorithm1")
    for d, c in itertools.product(("rkl", "urkl"), (True, False))
] + [
    dict(form="reinforce", divergence="ufkl", clip=True, anchor="sampler", branch_on="raw"),
    dict(form="differentiable", divergence="urkl", clip=True, anchor="reference", kl_clamp=5.0),
]


def label(variant: dict, compiled: bool = False, glue: bool = False) -> str:
    v = dict(variant)
    name = f"rpg {v.pop('form')} {v.pop('divergence')} clip={'on' if v.pop('clip', True) else 'off'} {v.pop('anchor', 'sampler')}"
    name += "".join(f" {k}={x}" for k, x in v.items())
    return name + (" [compiled]" if compiled else "") + (" [verl glue]" if glue else "")


def make_inputs(batch: int, length: int, device: str = "cpu", seed: int = 0):
    """Old log-probs in [-3, 0], log-prob = old + 0.05*N(0,1), per-sequence advantages, 10% masked."""
    import torch

    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g) * 3
    log_prob = old + 0.05 * torch.randn(batch, length, generator=g)
    adv = torch.randn(batch, 1, generator=g).expand(batch, length).contiguous()
    mask = (torch.rand(batch, length, generator=g) > 0.1).float()
    ref = old + 0.05 * torch.randn(batch, length, generator=g)
    return tuple(t.to(device) for t in (log_prob, old, adv, mask, ref))


def _actor_config(variant: dict | None):
    """The actor config the loss gets: verl's ``ActorConfig`` as a worker holds it (the RPG policy loss builds its
    settings once per such frozen config); vanilla reads the clip ratios only."""
    clips = dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0)
    if variant is None:
        from omegaconf import OmegaConf

        return OmegaConf.create({**clips, "global_batch_info": {}})
    from verl.workers.config.actor import ActorConfig

    from rpg.verl.policy_loss import RPGPolicyLossConfig

    pl = RPGPolicyLossConfig(loss_mode="rpg", rpg_anchor="sampler", rpg_loss=_lib_kwargs(variant))
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=pl, **clips)


def _lib_kwargs(variant: dict) -> dict:
    return {k: v for k, v in variant.items() if k != "anchor"}


def load_library(checkout: str):
    """The loss library (``RPGLossConfig``, ``rpg_policy_loss``) of another checkout of this project, loaded beside
    this tree's: its ``rpg`` modules are imported from ``checkout``, then taken out of ``sys.modules`` again (its
    functions keep their own module globals)."""
    import importlib
    import sys

    def ours():
        return [name for name in sys.modules if name == "rpg" or name.startswith("rpg.")]

    saved = {name: sys.modules.pop(name) for name in ours()}
    sys.path.insert(0, checkout)
    try:
        for name in ("rpg.math.fused", "rpg.math.losses", "rpg.losses"):  # the library's module, newest first
            try:
                return importlib.import_module(name)
            except ModuleNotFoundError:
                continue
        raise SystemExit(f"--baseline {checkout}: none of rpg/math/fused.py, rpg/math/losses.py, rpg/losses.py "
                         "is there")
    finally:
        sys.path.remove(checkout)
        for name in ours():
            del sys.modules[name]
        sys.modules.update(saved)


def make_step(variant: dict | None, inputs, compiled: bool = False, glue: bool = False, lib=None):
    """A closure running one forward+backward (loss and metrics as floats); variant None = vanilla; ``lib``: the
    loss library to run (``load_library``; default this tree's)."""
    log_prob0, old, adv, mask, ref = inputs
    if variant is None:
        from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

        config = _actor_config(None)

        def loss_fn(lp):
            return compute_policy_loss_vanilla(old, lp, adv, mask, "token-mean", config)
    elif glue:  # the training path: verl's agg_loss on the library's token loss (sampler anchor)
        from rpg.verl.policy_loss import rpg_policy_loss as glue_loss

        config = _actor_config(variant)

        def loss_fn(lp):
            return glue_loss(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask,
                             loss_agg_mode="token-mean", config=config)
    else:
        if lib is None:
            import rpg.math.fused as lib

        cfg = lib.RPGLossConfig(**_lib_kwargs(variant), compile=compiled)
        anchor = ref if variant.get("anchor") == "reference" else None

        def loss_fn(lp):
            return lib.rpg_policy_loss(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, config=cfg,
                                       ref_log_prob=anchor)

    def step(lp):
        loss, metrics = loss_fn(lp)
        loss.backward()
        return metrics

    def once():
        step(log_prob0.clone().requires_grad_(True))

    once.step, once.log_prob0 = step, log_prob0
    return once


def count_ops(once) -> int:
    """Top-level aten operators of one forward+backward (inputs prepared outside the count)."""
    from torch.profiler import ProfilerActivity, profile

    once()  # warm-up (lazy imports, caches)
    lp = once.log_prob0.clone().requires_grad_(True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        once.step(lp)
    count = 0
    for event in prof.events():
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        count += parent is None
    return count


def peak_bytes(once, device: str) -> int:
    """Peak live tensor bytes of one forward+backward above the level before it."""
    import torch

    once()
    lp = once.log_prob0.clone().requires_grad_(True)
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        once.step(lp)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        once.step(lp)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def time_passes(steps: dict, reps: int, device: str) -> dict[str, list[float]]:
    """Seconds per forward+backward, ``reps`` round-robin passes over the candidates."""
    import torch

    times = {name: [] for name in steps}
    for once in steps.values():
        once()
        once()  # warm-up (compilation happens here)
    for _ in range(reps):
        for name, once in steps.items():
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                once()
                end.record()
                torch.cuda.synchronize()
                times[name].append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.thread_time()
                once()
                times[name].append(time.thread_time() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads on CPU (CPU time is per thread)")
    ap.add_argument("--variants", choices=("core", "all"), default="core", help="core: the 4 clip-on sampler losses")
    ap.add_argument("--no-compiled", action="store_true", help="skip the torch.compile rows")
    ap.add_argument("--baseline", metavar="DIR", help="another checkout of this project: its losses are timed in the "
                    "same passes and each RPG row's time is printed against its own")
    args = ap.parse_args()
    for flag in ("batch", "length", "reps", "threads"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    import torch

    torch.set_num_threads(args.threads)
    variants = CORE if args.variants == "core" else VARIANTS
    variants = [dict(dict(clip=True, anchor="sampler"), **v) for v in variants]
    candidates = {VANILLA: (None, False, False)}
    candidates.update({label(v): (v, False, False) for v in variants})
    candidates[label(variants[0], glue=True)] = (variants[0], False, True)
    if not args.no_compiled:
        candidates.update({label(v, compiled=True): (v, True, False) for v in variants})

    small = make_inputs(4, 1024)
    ops = {name: count_ops(make_step(v, small, glue=g)) for name, (v, c, g) in candidates.items() if not c}
    inputs = make_inputs(args.batch, args.length, args.device)
    steps = {name: make_step(v, inputs, compiled=c, glue=g) for name, (v, c, g) in candidates.items()}
    memory = {name: peak_bytes(once, args.device) for name, once in steps.items()}
    base = load_library(args.baseline) if args.baseline else None
    before = {} if base is None else {name: (v, c) for name, (v, c, g) in candidates.items() if v is not None and not g}
    steps.update({(name, "before"): make_step(v, inputs, compiled=c, lib=base) for name, (v, c) in before.items()})
    times = time_passes(steps, args.reps, args.device)

    where = f"CUDA ({torch.cuda.get_device_name()}), CUDA events" if args.device == "cuda" else \
        f"CPU ({args.threads} thread), thread CPU time"
    print(f"{args.batch} x {args.length} tokens, float32, {where}; median of {args.reps} round-robin forward+backward "
          f"passes; ops at 4 x 1024 tokens; torch {torch.__version__}")
    t_ref, m_ref, o_ref = statistics.median(times[VANILLA]), max(memory[VANILLA], 1), ops[VANILLA]
    print(f"{'loss':62s} {'ops':>4s} {'ops ratio':>9s} {'time ms':>8s} {'time ratio':>10s} {'peak MiB':>9s} {'mem ratio':>9s}")
    for name in candidates:
        t = statistics.median(times[name])
        o = f"{ops[name]:4d} {ops[name] / o_ref:9.2f}" if name in ops else f"{'-':>4s} {'-':>9s}"
        print(f"{name:62s} {o} {1e3 * t:8.3f} {t / t_ref:10.2f} {memory[name] / 2**20:9.1f} {memory[name] / m_ref:9.2f}")
    if before:
        print(f"\nagainst --baseline {args.baseline}, timed in the same passes (ops at 4 x 1024 tokens):")
        print(f"{'loss':62s} {'ops before':>10s} {'ops':>4s} {'before ms':>9s} {'ms':>8s} {'after/before':>12s}")
        ratios = []
        for name, (v, c) in before.items():
            t_before, t = statistics.median(times[(name, "before")]), statistics.median(times[name])
            ratios.append(t / t_before)
            o = f"{count_ops(make_step(v, small, lib=base)):10d} {ops[name]:4d}" if not c else f"{'-':>10s} {'-':>4s}"
            print(f"{name:62s} {o} {1e3 * t_before:9.3f} {1e3 * t:8.3f} {t / t_before:12.3f}")
        print(f"{'geometric mean':62s} {'':10s} {'':4s} {'':9s} {'':8s} {statistics.geometric_mean(ratios):12.3f}")


if __name__ == "__main__":
    main()
