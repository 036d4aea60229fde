"""The only runtime monkeypatches of verl internals in this project (CPU backend only).

Each exists because verl 0.9.1 offers no hook for the behaviour; all are applied only when
``VERL_PLATFORM=cpu`` (by rpg.backends.cpu.external_module), never on a GPU run. verl is pinned to
0.9.1 and the CPU e2e tests guard these.

1. Process-group backend string. ``verl.utils.distributed.initialize_global_process_group_ray``
   builds ``f"cpu:gloo,{device}:{backend}"``, which on the CPU platform is
   ``"cpu:gloo,cpu:gloo"`` and torch rejects it ("Duplicate device type cpu"). The platform API
   has no way to express "CPU only", so we default the backend to plain ``"gloo"``. Must run
   before ``verl.workers.engine_workers`` is imported (it binds the function by name); the
   register module runs inside ``import verl``, which guarantees that.
2. FSDP2 reference model pinning. ``FSDPEngine._build_fsdp_module`` hard-codes
   ``CPUOffloadPolicy(pin_memory=True)`` for forward-only (reference) models
   (``workers/engine/fsdp/transformer_impl.py``); pinning needs an accelerator and raises on a
   CPU-only torch. We rebind that module's ``CPUOffloadPolicy`` name to a subclass that forces
   ``pin_memory=False`` (semantics otherwise unchanged).
3. v1 replay-buffer polling interval. ``verl.trainer.ppo.v1.replay_buffer.ReplayBuffer`` waits
   for finished rollouts by polling TransferQueue every ``poll_interval`` seconds, a constructor
   default of 2.0 that no config key reaches (``trainer_base._build_replay_buffer`` does not pass
   it; a ``custom_sampler`` would receive it but loses the built-in DAPO filter arguments). A
   tiny rollout takes well under a second, so every training step and validation waited for the
   next 2 s tick (``timing_s/gen`` was exactly 2.02 s at every step). On CPU the default becomes
   ``REPLAY_POLL_INTERVAL_S``; an explicit ``poll_interval`` argument is kept. Sampling logic is
   unchanged.
4. Validation's bootstrap loop. ``verl.trainer.ppo.metric_utils.bootstrap_metric`` (best@N / worst@N
   of every validation, for every prompt, numeric reward field and N) reduces its 1000 resamples one
   Python call each (``np.max``/``np.min`` on a 2-element object array); in the TaskRunner that took
   about 3 s of each 5-8 s validation of the tiny demo (py-spy) and no config key sets the resample
   count. On CPU, when every reduction is ``np.max`` or ``np.min`` (the only ones verl passes besides
   majority voting), the same resamples (same seed, same ``np.random.choice`` call) are reduced along
   an axis in one call per function: the same values, so the same means and standard deviations bit
   for bit (tested against verl's function); any other reduction runs verl's own loop.

Nothing else in torch or verl is touched.
"""

from __future__ import annotations

import functools
import types

_APPLIED: set[str] = set()
REPLAY_POLL_INTERVAL_S = 0.05


def patch_process_group_backend() -> None:
    import verl.utils.distributed as dist_utils

    if "pg_backend" in _APPLIED:
        return
    original = dist_utils.initialize_global_process_group_ray

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    dist_utils.initialize_global_process_group_ray = initialize_global_process_group_ray
    _APPLIED.add("pg_backend")


def patch_fsdp2_unpinned_offload(transformer_impl: types.ModuleType) -> None:
    """Rebind ``transformer_impl.CPUOffloadPolicy`` to an unpinned variant (see item 2)."""
    if "fsdp2_unpinned" in _APPLIED:
        return
    base = transformer_impl.CPUOffloadPolicy
    if base is None:  # torch without FSDP2: verl itself will raise with a clear message
        return

    class UnpinnedCPUOffloadPolicy(base):
        def __init__(self, pin_memory: bool = False, **kwargs):
            super().__init__(pin_memory=False, **kwargs)

    UnpinnedCPUOffloadPolicy.__name__ = UnpinnedCPUOffloadPolicy.__qualname__ = "CPUOffloadPolicy"
    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy
    _APPLIED.add("fsdp2_unpinned")


def patch_replay_buffer_poll_interval(replay_buffer: types.ModuleType) -> None:
    """Default ``ReplayBuffer(poll_interval=...)`` to REPLAY_POLL_INTERVAL_S (see item 3)."""
    if "replay_poll" in _APPLIED:
        return
    cls = replay_buffer.ReplayBuffer  # ReplayBufferAsync inherits this __init__
    original = cls.__init__
    n_positional = original.__code__.co_varnames.index("poll_interval")  # self counts as one

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if len(args) + 1 <= n_positional:
            kwargs.setdefault("poll_interval", REPLAY_POLL_INTERVAL_S)
        original(self, *args, **kwargs)

    cls.__init__ = __init__
    _APPLIED.add("replay_poll")


def patch_vectorized_bootstrap(metric_utils: types.ModuleType) -> None:
    """Reduce ``bootstrap_metric``'s resamples along an axis for ``np.max``/``np.min`` (see item 4);
    ``process_validation_metrics`` looks the name up in its module at call time."""
    if "bootstrap" in _APPLIED:
        return
    import numpy as np

    original = metric_utils.bootstrap_metric
    along_axis = {id(np.max): np.max, id(np.min): np.min}

    @functools.wraps(original)
    def bootstrap_metric(data, subset_size, reduce_fns, n_bootstrap=1000, seed=42):
        if not reduce_fns or any(id(fn) not in along_axis for fn in reduce_fns):
            return original(data, subset_size, reduce_fns, n_bootstrap=n_bootstrap, seed=seed)
        np.random.seed(seed)  # verl's own draws, in its order
        data_np = np.array(data, dtype=object)
        idxs = np.random.choice(len(data_np), size=(n_bootstrap, subset_size), replace=True)
        samples = data_np[idxs]  # (n_bootstrap, subset_size), row b = verl's sample b
        results = []
        for fn in reduce_fns:
            values = np.asarray(fn(samples, axis=1), dtype=np.float64)  # verl: float64 array, one per row
            results.append((float(np.mean(values)), float(np.std(values))))
        return results

    metric_utils.bootstrap_metric = bootstrap_metric
    _APPLIED.add("bootstrap")
