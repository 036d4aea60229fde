"""Ranks of tests/verl/test_dp_equivalence.py: one update from the same global mini-batch at world sizes 4, 2 and 1.

Run as ``python tests/support/dp_equivalence_ranks.py OUT.json``: spawns 4 gloo ranks (file rendezvous) once; for every
configuration (a loss, its settings, an aggregation mode) they run three phases, each a whole update as verl's
FSDP engine makes it (verl/workers/engine/fsdp/transformer_impl.py forward_backward_batch):

* world size 4: all ranks, one FSDP2 (``fully_shard``) group;
* world size 2: groups {0, 1} and {2, 3}, each the same update (two independent runs of it);
* world size 1: each rank alone, with its own micro-batch size (1, 2, 4 or 8 rows).

In each phase a group's ranks take equal row counts of the global mini-batch (verl's ``mini_batch_size //
dp_size``, verl/workers/engine_workers.py:267-270) but very unequal token counts (responses of 1 to 9 tokens, one
fully masked, one with a masked interior token: the long ones land on the first ranks), split into equal numbers of micro-batches per rank; ``batch_num_tokens`` is the
rank's ``loss_mask`` sum all-reduced over the group, ``dp_size`` the group size, ``global_batch_size`` the
mini-batch's row count (what verl's engine and trainer assign, transformer_impl.py:729-735,
trainer/ppo/v1/trainer_base.py:1829-1851). Each micro-batch's loss is the loss verl's worker calls
(``rpg.verl.actor_loss.rpg_actor_loss``, verl's ``ppo_loss``, ``verl_loss_with_sampler_kl``) on the engine's
no-padding layout; backward; FSDP2 averages the gradients over the group; one SGD step. Metrics are reduced with
verl's own functions (``append_to_dict`` per rank, ``allgather_dict_into_dict`` over the group,
``Metric.aggregate_dp``), and the logged loss as ``_postprocess_output`` does (sum over micro-batches, AVG over ranks).

Rank 0 writes ``{config: {phase: {"update": [...], "metrics": {...}}}}`` (the full parameter update, gathered
from the shards) and the run's wall time.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SUPPORT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SUPPORT)
sys.path.insert(0, os.path.join(os.path.dirname(SUPPORT), "verl"))  # test_verl_adapter's builders
sys.path.insert(0, os.path.dirname(os.path.dirname(SUPPORT)))

WORLD = 4
V, D = 24, 8  # vocabulary and width of the model: tiny, so that one configuration costs milliseconds
# 8 responses of the global mini-batch: lengths 0..9 (row 5 fully masked, an interior masked token in row 0)
RESP_LENS = [9, 8, 7, 6, 1, 3, 2, 1]
PROMPT_LENS = [2, 3, 1, 2, 3, 2, 1, 2]
B, T = len(RESP_LENS), max(RESP_LENS)
LR = 0.5
AGGS = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
NORM_SCALE = 16  # seq-mean-token-sum-norm's constant (the driver sets data.max_response_length)


def configurations() -> dict[str, dict]:
    """name -> settings of one update: loss ('rpg', 'grpo_corrected', 'vanilla_kl', 'vanilla_sampler_kl',
    'vanilla_is'), agg, anchor, rpg settings, stale sampler level, and the negative controls' ``control``."""
    out = {}
    for div in ("fkl", "rkl", "ufkl", "urkl"):
        for form in ("reinforce", "differentiable"):
            for clip in (True, False):
                for anchor in ("sampler", "reference"):
                    out[f"rpg-{div}-{form}-clip{int(clip)}-{anchor}"] = dict(
                        loss="rpg", anchor=anchor, rpg=dict(divergence=div, form=form, clip=clip))
    for div in ("rkl", "urkl"):
        out[f"rpg-{div}-differentiable-algorithm1"] = dict(loss="rpg", anchor="reference", rpg=dict(
            divergence=div, form="differentiable", clip=True, fd_clip="algorithm1"))
    for agg in AGGS:
        out[f"agg-{agg}-rpg-ufkl-reinforce"] = dict(loss="rpg", agg=agg, anchor="sampler",
                                                    rpg=dict(divergence="ufkl", form="reinforce", clip=True))
        out[f"agg-{agg}-rpg-rkl-differentiable-ref"] = dict(loss="rpg", agg=agg, anchor="reference",
                                                            rpg=dict(divergence="rkl", form="differentiable", clip=True))
        out[f"agg-{agg}-grpo_corrected"] = dict(loss="grpo_corrected", agg=agg, anchor="reference")
        out[f"agg-{agg}-vanilla_kl"] = dict(loss="vanilla_kl", agg=agg)
        out[f"agg-{agg}-stale-token-rpg-urkl-reinforce"] = dict(
            loss="rpg", agg=agg, anchor="reference", stale="token", rpg=dict(divergence="urkl", form="reinforce", clip=True))
    for level in ("token", "sequence"):
        out[f"stale-{level}-rpg-fkl-differentiable"] = dict(loss="rpg", anchor="sampler", stale=level,
                                                           rpg=dict(divergence="fkl", form="differentiable", clip=True))
        out[f"stale-{level}-grpo_corrected"] = dict(loss="grpo_corrected", anchor="sampler", stale=level)
    out["stale-token-capped-rpg-ufkl"] = dict(loss="rpg", anchor="sampler", stale="token",
                                              rpg=dict(divergence="ufkl", form="reinforce", clip=True, behavior_weight_cap=1.2))
    out["vanilla_sampler_kl"] = dict(loss="vanilla_sampler_kl")
    out["vanilla_rollout_is"] = dict(loss="vanilla_is")
    out["rpg_rollout_is"] = dict(loss="rpg_is", anchor="sampler", rpg=dict(divergence="ufkl", form="reinforce", clip=True))
    out["entropy-rpg"] = dict(loss="rpg", anchor="sampler", entropy=0.01, rpg=dict(divergence="ufkl", form="reinforce", clip=True))
    # negative controls: each must differ across world sizes / micro-batch sizes
    out["control-norm-without-scale"] = dict(loss="rpg", agg="seq-mean-token-sum-norm", anchor="sampler", scale=None,
                                             control="norm", rpg=dict(divergence="ufkl", form="reinforce", clip=True))
    out["control-per-rank-token-count"] = dict(loss="rpg", anchor="sampler", control="local_tokens",
                                               rpg=dict(divergence="ufkl", form="reinforce", clip=True))
    return out


class Model(torch.nn.Module):
    """p(token_{j+1} | tokens_{<=j}): embeddings averaged over the prefix, tanh, a linear head."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.head = torch.nn.Linear(D, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Full-sequence log-probs of one sequence in verl's layout: entry j = log p(ids[j+1]), the last 0."""
        h = torch.cumsum(self.emb(ids), 0) / torch.arange(1, len(ids) + 1)[:, None]
        logp = torch.log_softmax(self.head(torch.tanh(h)), -1)
        return torch.cat([logp[:-1].gather(1, ids[1:, None])[:, 0], logp.new_zeros(1)])


def global_batch(seed: int = 0) -> dict:
    """The global mini-batch: token ids, masks and the rollout-side log-probs, identical on every rank."""
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, V, (p + max(r, 1),), generator=g) for p, r in zip(PROMPT_LENS, RESP_LENS)]
    mask = torch.zeros(B, T)
    for i, n in enumerate(RESP_LENS):
        mask[i, :n] = 1.0
    mask[0, 4] = 0.0  # an interior masked token
    mask[5] = 0.0  # a fully masked response
    torch.manual_seed(0)
    with torch.no_grad():
        model = Model()
        cur = torch.zeros(B, T)
        for i, (p, r) in enumerate(zip(PROMPT_LENS, RESP_LENS)):
            cur[i, :r] = model(ids[i])[p - 1 : p - 1 + r]
    old = cur + 0.3 * torch.randn(B, T, generator=g)  # pi_old != pi_theta: ratios spread over the clip regions
    return dict(ids=ids, mask=mask, old=old, ref=old + 0.3 * torch.randn(B, T, generator=g),
                mu=old + 0.4 * torch.randn(B, T, generator=g),
                adv=torch.randn(B, 1, generator=g).expand(B, T).clone(),
                is_w=torch.exp(0.3 * torch.randn(B, T, generator=g)))


def actor_config(c: dict):
    from test_verl_adapter import _actor_config

    from rpg.verl.actor_loss import with_kl_loss

    agg = c.get("agg", "token-mean")
    scale = c.get("scale", NORM_SCALE) if agg == "seq-mean-token-sum-norm" else None
    loss_mode = {"rpg_is": "rpg", "vanilla_kl": "vanilla", "vanilla_sampler_kl": "vanilla", "vanilla_is": "vanilla"}.get(
        c["loss"], c["loss"])
    rpg = {f"rpg_{k}": v for k, v in {"beta": 0.05, **c.get("rpg", {})}.items()}
    if c.get("stale"):
        rpg["rpg_behavior_weight_level"] = c["stale"]
    config = _actor_config(agg, anchor=c.get("anchor", "sampler"), loss_mode=loss_mode,
                           entropy_coeff=c.get("entropy", 0.0), **rpg)
    pl = dataclasses.replace(config.policy_loss, rpg_stale_sampler=bool(c.get("stale")))
    config = dataclasses.replace(config, policy_loss=pl, loss_scale_factor=scale, kl_loss_coef=0.1,
                                 kl_loss_type="low_var_kl")
    return with_kl_loss(config, c["loss"] in ("vanilla_kl", "vanilla_sampler_kl"))


def loss_fn(c: dict):
    from verl.workers.utils.losses import ppo_loss

    from rpg.verl.actor_loss import rpg_actor_loss, verl_loss_with_sampler_kl

    return {"rpg": rpg_actor_loss, "rpg_is": rpg_actor_loss, "grpo_corrected": rpg_actor_loss,
            "vanilla_sampler_kl": verl_loss_with_sampler_kl}.get(c["loss"], ppo_loss)


def _nested(rows):
    from test_verl_adapter import _nested as nested

    return nested(rows)


def micro_batch(model, gb: dict, rows: list[int], c: dict, gbi: dict):
    """verl's engine view of ``rows``: nested fields, the model's full-sequence log-probs, the global batch info."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    def resp(x):
        return _nested([x[i, : RESP_LENS[i]] for i in rows])

    fields = {"prompts": _nested([gb["ids"][i][: PROMPT_LENS[i]] for i in rows]),
              "responses": _nested([gb["ids"][i][PROMPT_LENS[i]:][: RESP_LENS[i]] for i in rows]),
              "response_mask": resp(gb["mask"]), "old_log_probs": resp(gb["old"]), "advantages": resp(gb["adv"])}
    if c.get("anchor") == "reference" or c["loss"] == "vanilla_kl":
        fields["ref_log_prob"] = resp(gb["ref"])
    if c.get("stale"):
        fields["rollout_log_probs"] = resp(gb["mu"])
    if c["loss"] in ("vanilla_is", "rpg_is"):
        fields["rollout_is_weights"] = resp(gb["is_w"])
    data = TensorDict(fields, batch_size=[len(rows)])
    tu.assign_non_tensor(data, **gbi)
    log_probs = [model(gb["ids"][i])[: PROMPT_LENS[i] + RESP_LENS[i]] for i in rows]
    out = {"log_probs": _nested(log_probs)}
    if c.get("entropy"):
        out["entropy"] = _nested([torch.sigmoid(lp) for lp in log_probs])  # any differentiable per-token quantity
    return out, data


def update(c: dict, gb: dict, group, ranks: list[int], micro: int) -> dict:
    """One update of the group ``ranks`` (this rank among them), micro-batches of ``micro`` rows."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from verl.utils.metric import Metric
    from verl.utils.py_functional import append_to_dict
    from verl.utils.torch_functional import allgather_dict_into_dict

    w, r = len(ranks), ranks.index(dist.get_rank())
    torch.manual_seed(0)
    model = Model()
    before = [p.detach().clone() for p in model.parameters()]
    mesh = DeviceMesh.from_group(group, "cpu", mesh_dim_names=("fsdp",))
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    per_rank = B // w
    mine = list(range(r * per_rank, (r + 1) * per_rank))  # the long responses land on the first ranks
    local_tokens = gb["mask"][mine].sum()
    total = local_tokens.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)  # verl: the loss_mask sum over the dp group
    gbi = dict(dp_size=w, batch_num_tokens=float(total), global_batch_size=B)
    if c.get("control") == "local_tokens":  # negative control: a per-rank normalisation
        gbi["batch_num_tokens"] = float(local_tokens)
    config, fn = actor_config(c), loss_fn(c)
    metrics, losses = {}, []
    for start in range(0, per_rank, micro):
        model_output, data = micro_batch(model, gb, mine[start:start + micro], c, gbi)
        loss, m = fn(config=config, model_output=model_output, data=data)
        loss.backward()
        losses.append(float(loss.detach()))
        append_to_dict(metrics, m)  # verl's postprocess_batch_func: the rank's micro-batches
    opt.step()
    gathered = allgather_dict_into_dict(metrics, group=group)  # verl's _postprocess_output
    logged = {k: float(Metric.aggregate_dp(v)) for k, v in gathered.items() if isinstance(v[0], Metric)}
    loss_sum = torch.tensor(sum(losses))
    dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG, group=group)
    logged["loss"] = float(loss_sum)
    after = [p.full_tensor().detach() for p in model.parameters()]
    delta = torch.cat([(a - b0).reshape(-1) for a, b0 in zip(after, before)])
    return {"update": delta.tolist(), "metrics": logged}


def _rank(rank: int, world: int, init_file: str, out: str) -> None:
    from fsdp_reference_ranks import write_gathered

    import rpg.verl.register  # noqa: F401  (the registered loss modes, as on a worker)

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    t0 = time.time()
    groups = {"w4": (dist.group.WORLD, list(range(world)))}
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group, in one order
    singles = [dist.new_group([i]) for i in range(world)]
    groups["w2"] = (pairs[rank // 2], [0, 1] if rank < 2 else [2, 3])
    groups["w1"] = (singles[rank], [rank])
    # rows per micro-batch: at w4 2 rows per rank in 2 micro-batches, at w2 4 rows per rank in 2, at w1 8 rows in
    # 1, 2, 4 or 8 micro-batches (rank 0: one micro-batch, the reference of the comparisons)
    micro = {"w4": 1, "w2": 2, "w1": (8, 4, 2, 1)[rank]}
    gb = global_batch()
    records = {}
    for name, c in configurations().items():
        rec = {}
        for phase in ("w4", "w2", "w1"):
            group, ranks = groups[phase]
            rec[f"{phase}-rank{rank}"] = update(c, gb, group, ranks, micro[phase])
        records[name] = rec
    records["_wall_s"] = time.time() - t0
    write_gathered(records, rank, world, out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as fsdp_reference_ranks: no gloo teardown at exit


def main(out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(WORLD, os.path.join(tmp, "init"), out), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main(sys.argv[1])
