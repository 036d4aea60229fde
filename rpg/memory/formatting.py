"""The memory plan as text: the per-GPU table with vLLM's KV-cache check (``format_estimate``), host RAM per
node (``format_host``), the checkpoint disk (``format_disk``), and ``report``, the whole plan the launcher
prints for a composed config (a paper script's ``--describe`` and ``DRY_RUN=1``; docs/memory.md).

Only this module imports every estimate, so the imports go one way: gpu.py and disk.py import nothing of
host.py, and no estimate imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rpg.memory.architecture import architecture_for
from rpg.memory.sizes import DEFAULT_GPU_MEM_GIB, HEADROOM_FRACTION
from rpg.memory.disk import DiskEstimate, estimate_disk
from rpg.memory.gpu import MemoryEstimate, _g, cudagraph_gib, estimate, estimate_rollout_pool
from rpg.memory.host import (DEFAULT_HOST_MEM_GIB, HOST_MEM_ENV, HostEstimate, estimate_host,
                                    host_settings_from_config)
from rpg.memory.run_settings import RunSettings, settings_from_config


def format_estimate(e: MemoryEstimate) -> str:
    s, peak = e.settings, e.peak
    pool = (" on the training pool (actor, optimizer, reference, hybrid vLLM replicas)"
            if s.rollout_pool[0] > 0 else "")
    lines = [f"memory per GPU (estimate, docs/memory.md){pool}: {e.arch.name}, {e.arch.params / 1e9:.2f}B parameters, "
             f"{s.n_gpus} GPUs (FSDP shard 1/{s.fsdp_size}), GPU {e.gpu_gib:g} GiB"]
    for ph in e.phases:
        lines.append(f"  {ph.name:<52} {ph.gib:6.1f} GiB" + ("   <- peak" if ph is peak else ""))
    lines.append(f"  peak phase, by term ({peak.name}):")
    lines += [f"    {t.name:<70} {t.gib:6.1f}" for t in peak.terms if t.gib > 0]
    lines.append(f"  vLLM KV cache ~{max(e.kv_cache_gib, 0):.1f} GiB = ~{e.kv_cache_tokens} tokens "
                 f"(~{e.kv_cache_tokens // max(1, s.max_model_len)} full {s.max_model_len}-token sequences at once; "
                 f"CUDA graphs {cudagraph_gib(s):g} GiB taken out)")
    lines.append(format_kv_check(e))
    if s.reference:
        lines.append(f"  reference model: CPU-offloaded by verl (0 GiB on GPU at rest), pinned host memory "
                     f"~{e.host_ref_gib:.1f} GiB per GPU process")
    lines += [f"  note: {n}" for n in e.notes]
    verdict = "FITS" if e.fits else "DOES NOT FIT"
    why = "" if e.kv_fits else f"; vLLM's KV cache cannot hold one {e.vllm_max_model_len}-token sequence"
    lines.append(f"  {verdict}: peak {peak.gib:.1f} of {e.gpu_gib:g} GiB, headroom {e.headroom_gib:.1f} GiB "
                 f"(required >= {e.required_headroom_gib:.1f} GiB = {HEADROOM_FRACTION:.0%}){why}")
    return "\n".join(lines)


def format_rollout_pool(e: MemoryEstimate) -> str:
    """The standalone rollout pool of ``trainer.v1.trainer_mode=separate_async`` (``estimate_rollout_pool``)."""
    s, peak = e.settings, e.peak
    nnodes, per_node = s.rollout_pool
    lines = [f"memory per GPU of the standalone rollout pool (estimate): {nnodes} x {per_node} = {nnodes * per_node} "
             f"GPUs beside the training pool's {s.n_gpus}, vLLM at TP {s.rollout_tp} (its weights + KV cache, the "
             f"{s.sync_engine} receiver), GPU {e.gpu_gib:g} GiB"]
    for ph in e.phases:
        lines.append(f"  {ph.name:<52} {ph.gib:6.1f} GiB" + ("   <- peak" if ph is peak else ""))
    lines.append(f"  peak phase, by term ({peak.name}):")
    lines += [f"    {t.name:<70} {t.gib:6.1f}" for t in peak.terms if t.gib > 0]
    lines.append("  vLLM KV cache and its check: as on the training pool (the same rollout settings)")
    verdict = "FITS" if e.fits else "DOES NOT FIT"
    lines.append(f"  {verdict}: peak {peak.gib:.1f} of {e.gpu_gib:g} GiB, headroom {e.headroom_gib:.1f} GiB "
                 f"(required >= {e.required_headroom_gib:.1f} GiB = {HEADROOM_FRACTION:.0%}); host RAM of its nodes "
                 "not estimated")
    return "\n".join(lines)


def format_kv_check(e: MemoryEstimate) -> str:
    """vLLM's start-up check: one max_model_len sequence must fit its KV cache (else it refuses to start)."""
    need_gib = _g(e.kv_needed_tokens * e.arch.kv_cache_bytes_per_token() / e.settings.rollout_tp)
    head = (f"  KV cache check: max_model_len {e.vllm_max_model_len} ({e.vllm_max_model_len_source}) "
            f"needs {need_gib:.1f} GiB")
    if e.kv_fits:
        return head + f"; the KV cache holds {e.kv_cache_tokens // e.kv_needed_tokens} sequences of that length: OK"
    return (head + f"; NO FIT: the KV cache (~{max(e.kv_cache_gib, 0):.1f} GiB) cannot hold one and vLLM refuses "
            "to start: raise actor_rollout_ref.rollout.gpu_memory_utilization or set actor_rollout_ref.rollout."
            "max_model_len (>= data.max_prompt_length + data.max_response_length)")


def format_disk(d: DiskEstimate, s: RunSettings) -> str:
    lines = [f"checkpoint disk (estimate): {d.per_checkpoint_gb:.1f} GB per checkpoint"]
    lines += [f"    {what:<70} {gb:7.2f} GB" for what, gb in d.items]
    keep = "all" if s.keep is None else str(s.keep)
    if d.saves == 0:
        lines.append("  no checkpoints (trainer.save_freq <= 0)")
    elif d.saves is None:
        lines.append(f"  every {s.save_freq} steps; trainer.total_training_steps unset: number of saves unknown")
    else:
        lines.append(f"  {d.saves} saves (save_freq {s.save_freq}, {s.total_steps} steps, and the last step), "
                     f"max_actor_ckpt_to_keep={keep}: {d.kept} kept, up to {d.peak_kept} on disk while saving "
                     f"= {d.peak_gb:.0f} GB")
    return "\n".join(lines)


def format_host(e: HostEstimate) -> str:
    lines = [f"host RAM per node (estimate, docs/memory.md): {e.gpus_per_node} GPUs per node, host {e.host_gib:g} GiB"]
    lines += [f"    {what:<70} {gib:7.1f}" for what, gib in e.terms if gib > 0]
    verdict = "FITS" if e.fits else "DOES NOT FIT"
    lines.append(f"  host RAM {verdict}: {e.total_gib:.1f} of {e.host_gib:g} GiB, headroom {e.headroom_gib:.1f} GiB "
                 f"(required >= {e.required_headroom_gib:.1f} GiB = {HEADROOM_FRACTION:.0%}; set the node's size with "
                 f"--host-mem-gib / {HOST_MEM_ENV})")
    return "\n".join(lines)


def report(cfg: Mapping[str, Any], gpu_gib: float = DEFAULT_GPU_MEM_GIB, host_gib: float | None = None) -> str:
    """The whole plan the launcher prints for a composed config (a plain nested mapping): the per-GPU memory
    table and the checkpoint-disk lines around the host RAM per node; host_gib None: the default node
    size. Here, beside the text of each estimate, so that the imports go one way."""
    s = settings_from_config(cfg)
    arch = architecture_for(s.model_path)
    host = estimate_host(host_settings_from_config(cfg, s), arch, DEFAULT_HOST_MEM_GIB if host_gib is None else host_gib)
    trainer = estimate(s, arch, gpu_gib)
    pool = estimate_rollout_pool(s, trainer)
    return "\n".join((format_estimate(trainer), *(() if pool is None else (format_rollout_pool(pool),)),
                      format_host(host), format_disk(estimate_disk(s, arch), s)))
