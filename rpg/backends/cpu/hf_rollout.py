"""``rollout.name=hf``: a HuggingFace-generate rollout server for verl's async rollout interface.

verl 0.9.1 reaches rollout only through server backends (vLLM/SGLang/TRT-LLM), all GPU-only.
This module provides the three pieces verl's server mode expects, for tiny models on CPU:

* ``HFRolloutServer`` (a Ray actor, ``num_cpus=0``): keeps a float32 copy of the policy and
  serves ``generate(prompt_ids, sampling_params) -> TokenOutput`` (token ids + log-probs).
  On the CPU backend the copy lives on the CPU; elsewhere, when CUDA is visible, on the GPU of
  its replica (``rollout_device``, ``HFReplica._gpu_placement``; registered for CUDA by
  ``rpg.backends.gpu.register``). Every weight load prints the device.
  Requests that arrive together are decoded as one left-padded batch with ``model.generate``.
* ``HFReplica`` (a ``RolloutReplica``): launches one named server per replica.
* ``HFServerAdapter`` (a ``BaseRollout``, lives in the FSDP actor worker): receives the actor's
  weights from verl's weight-sync path (``ActorRolloutRefWorker.update_weights`` ->
  ``rollout.update_weights(per-tensor generator)``) and ships them to the server, so training
  and validation always sample from the current actor weights.

Sampling semantics (vLLM's, as verl sends them): ``temperature`` (0 = greedy), ``top_p`` (1 =
off), ``top_k`` (-1 or 0 = off), ``max_tokens``/``max_new_tokens`` (default: the rollout's
response_length), bounded by ``prompt_length + response_length``; generation stops after the
first EOS token, which is returned. ``log_probs`` are log pi(token) under the temperature-scaled
distribution *before* top-k/top-p filtering, i.e. what verl's actor recomputes (it divides the
logits by the same temperature), so ``training/rollout_probs_diff_*`` measures real mismatch.

Reproducible sampling: every sequence draws from its own random generator, seeded by
(rollout seed, training step of the loaded weights, prompt, how many samples of that prompt were
drawn since those weights were loaded). A response therefore does not depend on which other
requests happened to share its decode batch (request timing varies from run to run); two runs
with the same seed and weights sample the same responses (up to the order of identical prompts),
and so does a run resumed from a checkpoint at the steps after the checkpoint. (verl still orders
a training batch by completion, so mini-batch membership, and hence later updates, can differ.)
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from typing import Any

import ray
import torch

from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

logger = logging.getLogger(__name__)

# Collect requests until none arrived for _BATCH_QUIET_S, or _BATCH_MAX_WAIT_S after the first one.
# The agent loop sends a step's requests one by one over a few hundred ms on a busy machine; with
# 10 ms / 100 ms a step's 64 requests were often decoded in 5-7 separate batches (one generate loop
# each), so a little more patience makes a step's generation cheaper.
_BATCH_QUIET_S = 0.05
_BATCH_MAX_WAIT_S = 0.3


def server_name(replica_rank: int, suffix: str = "") -> str:
    """Ray actor name of the HF rollout server of one replica."""
    return f"rpg_hf_rollout_server_{replica_rank}{suffix}"


def row_seed(*parts) -> int:
    """A 63-bit seed derived from ``parts`` (stable across processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


class SeededRowSampler(LogitsProcessor):
    """Sampling with one generator per row, as the last logits processor of a *greedy* generate.

    Applies temperature, top-k and top-p with transformers' own warpers, draws u ~ U(0, 1) from
    the row's generator and takes the inverse CDF of the warped distribution; it returns scores
    that are 0 at the drawn token and -inf elsewhere, so greedy selection picks exactly that token.
    """

    def __init__(self, generators: list[torch.Generator], temperature: float, top_k: int, top_p: float):
        self.generators = generators
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
        if top_k > 0:
            self.warpers.append(TopKLogitsWarper(top_k=top_k))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=top_p))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = torch.softmax(self.warpers(input_ids, scores).float(), dim=-1)
        cdf = probs.cumsum(dim=-1)
        # the generators are CPU ones (seeded per row, see module docstring); the draws follow the scores
        u = torch.cat([torch.rand(1, generator=g, dtype=cdf.dtype) for g in self.generators]).to(cdf.device)
        # u * total < total = cdf[-1], so the index is valid and its probability is > 0
        token = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, token.unsqueeze(-1), 0.0)


def rollout_device(platform: str | None = None, cuda_available: bool | None = None) -> torch.device:
    """Where the HF rollout server keeps its model: the CPU on the CPU backend (``VERL_PLATFORM=cpu``,
    even on a machine with a GPU), else ``cuda:0`` when CUDA is visible, else the CPU.

    Off the CPU backend ``HFReplica`` starts the server with ``CUDA_VISIBLE_DEVICES`` set to its
    replica's GPU, so ``cuda:0`` is that GPU. Without CUDA (e.g. a server built directly in a test)
    the CPU; every weight load prints the device, and the GPU smoke run fails on a CPU one.
    """
    platform = os.environ.get("VERL_PLATFORM", "") if platform is None else platform
    if platform.strip().lower() == "cpu":
        return torch.device("cpu")
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    return torch.device("cuda", 0) if cuda else torch.device("cpu")


def _limit(sampling_params: dict[str, Any], default: int) -> int:
    for key in ("max_tokens", "max_new_tokens"):
        if sampling_params.get(key) is not None:
            return int(sampling_params[key])
    return int(default)


class HFRolloutServer:
    """Token-in/token-out generation with a HuggingFace causal LM (see module docstring)."""

    def __init__(self, config: RolloutConfig, model_config: Any, replica_rank: int = 0):
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.config: RolloutConfig = omega_conf_to_dataclass(config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        self.seed = int(getattr(self.config, "seed", 0) or 0) + replica_rank
        self.device = rollout_device()
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path, dtype=torch.float32, attn_implementation="sdpa"
        ).to(self.device).eval()
        gen_cfg = self.model.generation_config or GenerationConfig()
        tok = self.model_config.tokenizer
        eos = gen_cfg.eos_token_id if gen_cfg.eos_token_id is not None else tok.eos_token_id
        self.eos_ids = {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None}
        if not self.eos_ids:
            raise ValueError(f"model at {self.model_config.local_path} defines no eos_token_id")
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else min(self.eos_ids)
        self.response_length = int(self.config.response_length)
        self.max_model_len = int(self.config.max_model_len or (self.config.prompt_length + self.config.response_length))
        self.global_steps: int | None = None
        self.weight_version = 0
        self._queue: list[tuple[list[int], dict, asyncio.Future, int]] = []
        self._draws: dict[tuple[int, ...], int] = {}  # samples drawn per prompt since the last weight load
        self.batch_sizes: list[int] = []  # requests per decoded batch (diagnostics)
        self._drainer: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None  # created lazily inside the actor's event loop

    # ---------------------------------------------------------------- verl server interface
    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data is not None or video_data is not None or kwargs.get("audio_data") is not None:
            raise ValueError("rollout.name=hf serves text-only models; got image/video/audio data")
        fut = asyncio.get_running_loop().create_future()
        prompt = tuple(map(int, prompt_ids))
        draw = self._draws.get(prompt, 0)
        self._draws[prompt] = draw + 1
        seed = row_seed(self.seed, self._weights_key(), prompt, draw)
        self._queue.append((list(prompt), dict(sampling_params), fut, seed))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await fut

    async def load_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Replace the policy weights (names as in the HF checkpoint); returns the new version."""
        async with self._get_lock():
            own = self.model.state_dict()
            unexpected = sorted(set(state_dict) - set(own))
            if unexpected:
                raise ValueError(f"weight sync: unexpected parameter names {unexpected[:5]}")
            missing = set(own) - set(state_dict)
            if self.model.config.tie_word_embeddings:
                missing.discard("lm_head.weight")
            if missing:
                raise ValueError(f"weight sync: missing parameter names {sorted(missing)[:5]}")
            for name, t in state_dict.items():
                if tuple(t.shape) != tuple(own[name].shape):
                    raise ValueError(f"weight sync: {name} has shape {tuple(t.shape)}, expected {tuple(own[name].shape)}")
            self.model.load_state_dict(state_dict, strict=False)
            if self.model.config.tie_word_embeddings:
                self.model.tie_weights()
            self.global_steps = global_steps
            self.weight_version += 1
            self._draws = {}
            print(
                f"[hf-rollout] weights v{self.weight_version} loaded (global_steps={global_steps}, "
                f"checksum={self._checksum():.6f}, batches since last: {self.batch_sizes[-50:]}, device={self.device})",
                flush=True,
            )
            self.batch_sizes = []
            return self.weight_version

    def _weights_key(self) -> tuple:
        """Which weights are loaded: the trainer's global step when known (stable across resume)."""
        return ("step", self.global_steps) if self.global_steps is not None else ("version", self.weight_version)

    def _checksum(self) -> float:
        return float(sum(p.double().sum().item() for p in self.model.parameters()))

    async def get_weights_checksum(self) -> float:
        """Sum of all parameters (a cheap fingerprint; also printed on every weight load)."""
        return self._checksum()

    async def ready(self) -> bool:
        return True

    # control methods of verl's server interface: nothing to release on the CPU
    async def wake_up(self, *args, **kwargs):
        return None

    async def sleep(self, *args, **kwargs):
        return None

    async def abort_all_requests(self, reject_request: bool = False, **kwargs) -> dict:
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self, *args, **kwargs):
        return None

    async def clear_kv_cache(self, *args, **kwargs):
        return None

    async def release_kv_cache(self, *args, **kwargs):
        return None

    async def resume_kv_cache(self, *args, **kwargs):
        return None

    async def start_profile(self, *args, **kwargs):
        return None

    async def stop_profile(self, *args, **kwargs):
        return None

    async def wait_for_requests_to_drain(self, *args, **kwargs):
        while self._queue or (self._drainer is not None and not self._drainer.done()):
            await asyncio.sleep(0.01)

    # ---------------------------------------------------------------- batching
    def _get_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            start, size = loop.time(), -1
            while len(self._queue) != size and loop.time() - start < _BATCH_MAX_WAIT_S:
                size = len(self._queue)
                await asyncio.sleep(_BATCH_QUIET_S)
            batch, self._queue = self._queue, []
            self.batch_sizes.append(len(batch))
            groups: dict[tuple, list] = {}
            for item in batch:
                p = item[1]
                key = (
                    float(p.get("temperature", 1.0)),
                    float(p.get("top_p", 1.0)),
                    int(p.get("top_k", -1) if p.get("top_k") is not None else -1),
                    _limit(p, self.response_length),
                )
                groups.setdefault(key, []).append(item)
            for key, items in groups.items():
                try:
                    async with self._get_lock():
                        outs = await asyncio.to_thread(
                            self._generate_batch, [it[0] for it in items], *key, seeds=[it[3] for it in items]
                        )
                    for (_, _, fut, _), out in zip(items, outs):
                        if not fut.done():
                            fut.set_result(out)
                except Exception as e:  # surface the error in every waiting request
                    logger.exception("HF rollout generation failed")
                    for _, _, fut, _ in items:
                        if not fut.done():
                            fut.set_exception(e)

    @torch.no_grad()
    def _generate_batch(
        self,
        prompts: list[list[int]],
        temperature: float,
        top_p: float,
        top_k: int,
        max_tokens: int,
        seeds: list[int] | None = None,
    ) -> list[TokenOutput]:
        from transformers import GenerationConfig

        limits = [max(0, min(max_tokens, self.max_model_len - len(p))) for p in prompts]
        if max(limits) == 0:
            return [TokenOutput(token_ids=[], log_probs=[], stop_reason="length") for _ in prompts]
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        greedy = temperature <= 0.0
        gen_cfg = GenerationConfig(  # greedy selection; sampling (if any) is done by SeededRowSampler
            max_new_tokens=max(limits),
            do_sample=False,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        processors = LogitsProcessorList()
        if not greedy:
            seeds = seeds if seeds is not None else [row_seed(self.seed, self._weights_key(), tuple(p)) for p in prompts]
            generators = [torch.Generator().manual_seed(s) for s in seeds]
            processors.append(SeededRowSampler(generators, temperature, top_k, top_p))
        out = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), generation_config=gen_cfg,
            logits_processor=processors,
        )
        new = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float()  # raw (unprocessed) logits [B, T, V]
        if not greedy:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, new[:, : logits.shape[1]].unsqueeze(-1)).squeeze(-1)
        results = []
        for i in range(len(prompts)):
            toks = new[i].tolist()[: limits[i]]
            stop = "length"
            for j, t in enumerate(toks):
                if t in self.eos_ids:
                    toks, stop = toks[: j + 1], "completed"
                    break
            results.append(
                TokenOutput(
                    token_ids=toks,
                    log_probs=logp[i, : len(toks)].tolist(),
                    stop_reason=stop,
                    extra_fields={"global_steps": self.global_steps},
                )
            )
        return results


class HFReplica(RolloutReplica):
    """One HF rollout server per replica, colocated with the hybrid actor worker (CPU only)."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self):
        if self.rollout_mode is None:
            raise ValueError("HFReplica: launch_servers called before init_hybrid/init_colocated")
        kind = "_reward" if self.is_reward_model else ("_teacher" if self.is_teacher_model else "")
        name = server_name(self.replica_rank, kind + self.name_suffix)
        placement = await self._gpu_placement()
        server = (
            ray.remote(HFRolloutServer)
            .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency, **placement)
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf://{name}"

    async def _gpu_placement(self) -> dict:
        """Off the CPU backend: the node and GPU of this replica's first worker, as verl places its vLLM
        servers (node affinity; Ray told not to touch ``CUDA_VISIBLE_DEVICES``, which is set to that
        GPU, so the server's ``cuda:0`` is its replica's GPU). On the CPU backend: nothing."""
        if os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu" or not self.workers:
            return {}
        node_id, gpu = await self.workers[0].__ray_call__.remote(_node_and_gpu)
        if gpu is None:
            return {}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        env = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": str(gpu)}
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                "runtime_env": {"env_vars": env}}

    async def init_standalone(self):
        raise NotImplementedError("rollout.name=hf supports the hybrid (colocated) mode only")


def _node_and_gpu(actor) -> tuple[str, str | None]:
    """(node id, first GPU id Ray assigned) of the actor it runs in (``__ray_call__`` target)."""
    ctx = ray.get_runtime_context()
    gpus = ctx.get_accelerator_ids().get("GPU") or [None]
    return ctx.get_node_id(), gpus[0]


class HFServerAdapter(BaseRollout):
    """Worker-side adapter: forwards the actor's weights to this replica's HF server."""

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.is_sender = rank % world == 0
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
        if wire_format != "named_tensors":
            raise ValueError(f"rollout.name=hf supports wire_format='named_tensors' only, got {wire_format!r}")
        state: dict[str, torch.Tensor] = {}
        if hasattr(weights, "__aiter__"):
            async for name, t in weights:
                state[name] = _to_host(t)
        else:
            for name, t in weights:
                state[name] = _to_host(t)
        if self.is_sender:
            await self._server_handle().load_weights.remote(state, global_steps=kwargs.get("global_steps"))


def _to_host(t: torch.Tensor) -> torch.Tensor:
    if hasattr(t, "full_tensor"):  # DTensor shard -> full tensor (collective across the FSDP group)
        t = t.full_tensor()
    return t.detach().to("cpu", torch.float32).clone()
