"""2-rank (gloo, CPU) reference-reset scenario for tests/verl/test_verl_reference_fsdp.py.

Run as ``python tests/support/fsdp_reference_ranks.py OUT.json``: spawns 2 ranks, each builds a tiny
Qwen2 actor and reference wrapped like verl's FSDP engine (decoder layers as units, the root unit
holding embeddings, final norm and lm_head; the reference forward-only), and for each case runs
the trainer's order of events:

    actor update (forward + backward + step)  ->  reference no-grad forward (ref_log_prob)
    ->  copy reference <- actor               ->  compare the two models' outputs

then a second round (another update, reference forward, copy). Rank 0 writes one JSON record per
case: the probe logit difference before the copies (> 0: the test can fail) and after each copy,
the shard difference after each copy, or the error raised.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

# (name, strategy, reference reshard_after_forward, FSDP param dtype)
CASES = [
    ("fsdp1", "fsdp", True, torch.float32),
    ("fsdp1_bf16", "fsdp", True, torch.bfloat16),
    ("fsdp1_ref_no_reshard", "fsdp", False, torch.float32),
    ("fsdp2", "fsdp2", True, torch.float32),
    ("fsdp2_ref_no_reshard", "fsdp2", False, torch.float32),
]


DEVICE = "cpu"  # tests/gpu/reference_offload_ranks.py runs the same cases with "cuda" (one GPU per rank)


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")


def init_rank(rank: int, world: int, init_file: str, device: str = "cpu") -> None:
    """Join the group and set ``DEVICE``: gloo on the CPU, nccl with one GPU per rank on CUDA."""
    global DEVICE
    DEVICE = device
    if device == "cpu":
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        return
    torch.cuda.set_device(rank)  # verl's get_device_id() is the current device
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))


def _tiny_model(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    return Qwen2ForCausalLM(cfg).float()


def _wrap(model, strategy: str, reshard_after_forward: bool, param_dtype, forward_only: bool):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    mesh = init_device_mesh(DEVICE, (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    if strategy == "fsdp":  # as verl's FSDPEngine._build_fsdp_module (strategy=fsdp)
        from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FSDP(
            model,
            auto_wrap_policy=ModuleWrapPolicy({Qwen2DecoderLayer}),
            sharding_strategy=ShardingStrategy.FULL_SHARD if reshard_after_forward else ShardingStrategy.SHARD_GRAD_OP,
            mixed_precision=MixedPrecision(param_dtype=param_dtype, reduce_dtype=torch.float32,
                                           buffer_dtype=torch.float32),
            device_mesh=mesh,
            device_id=_device(),  # verl passes its device; FSDP1 needs it explicit on CPU
            use_orig_params=False,
            # verl offloads the forward-only reference (CPUOffload(offload_params=True)); pinning the
            # host shard needs an accelerator, so on CPU the reference keeps its shard in place (the
            # gathered-buffer reuse under test happens with and without offload)
            cpu_offload=CPUOffload(offload_params=True) if forward_only and torch.accelerator.is_available() else None,
        )
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    model.to(_device())  # FSDP1 moves the module to device_id itself (and keeps an offloaded one on the CPU)
    kw = {"mesh": mesh, "reshard_after_forward": reshard_after_forward,
          "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)}
    if forward_only and torch.accelerator.is_available():
        # verl 0.9.1's forward-only reference (verl/workers/engine/fsdp/transformer_impl.py:459-463): FSDP2 keeps
        # its shards in pinned CPU memory and moves them to the device for each forward, whatever
        # ref.fsdp_config.param_offload says (pinning needs an accelerator: on CPU the shards stay in place)
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    for layer in model.model.layers:  # as verl's apply_fsdp2: the layers, then the root
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def _train_step(actor, opt, ids):
    actor.train()
    out = actor(input_ids=ids, use_cache=False)
    loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].float().reshape(-1, out.logits.shape[-1]),
                                             ids[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _case(name, strategy, ref_reshard, param_dtype, rank):
    from rpg.verl.reference_copy import copy_actor_to_reference, max_shard_diff, probe_logits, probe_token_ids

    actor = _wrap(_tiny_model(0), strategy, True, param_dtype, forward_only=False)
    ref = _wrap(_tiny_model(0), strategy, ref_reshard, param_dtype, forward_only=True)
    ref.eval()
    opt = torch.optim.SGD(actor.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(1 + rank)
    batch = lambda: torch.randint(0, 96, (2, 12), generator=gen).to(_device())  # noqa: E731  (per-rank data, like DP)
    probe = probe_token_ids(96)

    def logit_diff():
        actor.eval()
        a = probe_logits(actor, probe, DEVICE, autocast_dtype=param_dtype)
        r = probe_logits(ref, probe, DEVICE, autocast_dtype=param_dtype)
        return float((a - r).abs().max())

    rec = {"case": name}
    try:
        for round_ in (1, 2):
            _train_step(actor, opt, batch())
            with torch.no_grad():
                ref(input_ids=batch(), use_cache=False)  # the step's ref_log_prob forward
            rec[f"logit_diff_before_copy_{round_}"] = logit_diff()
            with torch.no_grad():
                ref(input_ids=batch(), use_cache=False)  # leave the reference freshly forwarded
            copy_actor_to_reference(actor, ref)
            rec[f"shard_diff_after_copy_{round_}"] = max_shard_diff(actor, ref)
            rec[f"logit_diff_after_copy_{round_}"] = logit_diff()
    except Exception as e:  # noqa: BLE001 - reported to the test
        rec["error"] = f"{type(e).__name__}: {e}"
    return rec


def write_gathered(records, rank: int, world: int, out: str) -> None:
    """Every rank's records, gathered; rank 0 writes them to ``out`` as JSON (a list, one entry per
    rank); returns once all ranks are here and the file is written."""
    gathered = [None] * world
    dist.all_gather_object(gathered, records)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    dist.barrier()


def run_ranks_script(script, out) -> list:
    """Run a ranks script (``python SCRIPT OUT.json``, which spawns its ranks and ends with ``write_gathered``) in a
    subprocess and return the gathered records (one entry per rank); a failure shows the script's output tail."""
    import subprocess

    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out) as f:
        return json.load(f)


def _rank(rank: int, world: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    records = [_case(name, s, rr, dt, rank) for name, s, rr, dt in CASES]
    write_gathered(records, rank, world, out)
    # Leave without tearing gloo down: its threads can abort the interpreter's exit with "terminate
    # called without an active exception" (SIGABRT, seen once in a CI rehearsal after all records were
    # written). Any failure before this line still exits non-zero through the exception.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(2, os.path.join(tmp, "init"), out), nprocs=2, join=True)


if __name__ == "__main__":
    main(sys.argv[1])
