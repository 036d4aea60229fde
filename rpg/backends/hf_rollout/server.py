"""``HFRolloutServer``, the Ray actor (``num_cpus=0``) behind ``rollout.name=hf``: it keeps a float32 copy of
the policy and serves verl's server interface, ``generate(prompt_ids, sampling_params) -> TokenOutput``
(token ids + log-probs), takes the actor's weights from the worker-side adapter (``load_weights``,
adapter.py), and answers verl's sleep / wake / KV-cache controls with no-ops.

On the CPU backend the copy lives on the CPU; elsewhere, when CUDA is visible, on the GPU of its replica
(``rollout_device``; replica.py places the actor; registered for CUDA by ``rpg.backends.gpu.external_module``).
Every weight load prints the device. Requests that arrive together are decoded as one left-padded batch
per set of sampling parameters (sampling.py), each sequence with its own seed, so a response's random numbers
do not depend on which other requests shared its batch.

The prompts' common prefix (a chat template's system turn, a worked example) is computed once per decode batch and
its key/value cache shared by every row (sampling.py); verl's ``rollout.enable_prefix_caching`` (default True, vLLM's
switch for its own prefix cache) turns that off.

With verl's ``rollout.full_determinism=True`` every sequence is decoded alone instead: a batched product's
numbers depend on the batch's size and a row's place in it (sampling.py), so only a batch of one gives a sequence
the same log-probs (and, at a boundary, the same token) whatever the requests' timing.

A request's seed: with a ``sample_key`` (what the agent loop of agent_loop.py sends: the prompt's dispatch step,
dataset row and sample index), ``row_seed(rollout.seed, "sample", sample_key, prompt)``, the same on every replica
and at any arrival order, so whichever server answers draws the same random numbers for that sample; without one
(a direct caller), the older per-server scheme: ``rollout.seed + replica_rank``, the loaded weights and a count
of the prompt's draws since they were loaded.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch

from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.replica import TokenOutput

from rpg.backends import PLATFORM_ENV, on_cpu_platform
from rpg.backends.hf_rollout.sampling import _limit, generate_batch, row_seed, shared_prefix_support
from rpg.backends.weight_digest import WeightDigest

logger = logging.getLogger(__name__)

# Collect requests until none arrived for _BATCH_QUIET_S, or _BATCH_MAX_WAIT_S after the first one. The agent
# loop sends a batch's requests one by one, a few ms apart on 2 busy cores, and every decode batch costs a whole
# generate loop (up to the response limit) whatever its size: with 10 ms / 100 ms a tiny step's 64 requests were
# decoded in 5-7 batches; with 50 ms / 300 ms SmolLM2's 200 validation requests (about 0.75 s to arrive) in two,
# 81 + 119: three generate loops of 96 tokens instead of two (docs/smol.md, Cost). Two seconds of waiting at most
# is little against one generate loop (96 decoding steps of 0.4-1.5 s each on CPU). A burst (any model's sync step
# or validation) closes 0.1 s after its last request; the 2 s bound binds only while requests keep arriving (the
# asynchronous trainer modes' streams).
_BATCH_QUIET_S = 0.1
_BATCH_MAX_WAIT_S = 2.0


def server_name(replica_rank: int, suffix: str = "") -> str:
    """Ray actor name of the HF rollout server of one replica."""
    return f"rpg_hf_rollout_server_{replica_rank}{suffix}"


def rollout_device(platform: str | None = None, cuda_available: bool | None = None) -> torch.device:
    """Where the HF rollout server keeps its model: the CPU on the CPU backend (``VERL_PLATFORM=cpu``,
    even on a machine with a GPU), else ``cuda:0`` when CUDA is visible, else the CPU.

    Off the CPU backend ``HFReplica`` starts the server with ``CUDA_VISIBLE_DEVICES`` set to its
    replica's GPU, so ``cuda:0`` is that GPU. Without CUDA (e.g. a server built directly in a test)
    the CPU; every weight load prints the device, and the GPU smoke run fails on a CPU one.
    """
    if on_cpu_platform(None if platform is None else {PLATFORM_ENV: platform}):
        return torch.device("cpu")
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    return torch.device("cuda", 0) if cuda else torch.device("cpu")


class HFRolloutServer:
    """Token-in/token-out generation with a HuggingFace causal LM (see module docstring)."""

    def __init__(self, config: RolloutConfig, model_config: Any, replica_rank: int, pool: str):
        """``pool``: verl's rollout mode of the replica (``RolloutMode``: hybrid, colocated, standalone), named with
        ``replica_rank`` in every weight load's line."""
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.config: RolloutConfig = omega_conf_to_dataclass(config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank, self.pool = replica_rank, pool
        self.base_seed = int(getattr(self.config, "seed", 0) or 0)  # keyed requests: the same on every replica
        self.one_per_decode = bool(getattr(self.config, "full_determinism", False))
        self.seed = self.base_seed + replica_rank
        self.device = rollout_device()
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path, dtype=torch.float32, attn_implementation="sdpa"
        ).to(self.device).eval()
        if self.device.type == "cpu":  # the grouped key/value heads as they are (attention.py)
            from rpg.backends.hf_rollout import attention

            self.model.set_attn_implementation(attention.register())
        self.share_prefix = bool(getattr(self.config, "enable_prefix_caching", True))
        why_not = shared_prefix_support(self.model) if self.share_prefix else None
        if why_not:
            print(f"[hf-rollout] rollout.enable_prefix_caching: no shared prompt prefix with this model ({why_not})",
                  flush=True)
            self.share_prefix = False
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
        sample_key: tuple | list | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data is not None or video_data is not None or kwargs.get("audio_data") is not None:
            raise ValueError("rollout.name=hf serves text-only models; got image/video/audio data")
        fut = asyncio.get_running_loop().create_future()
        prompt = tuple(map(int, prompt_ids))
        seed = self.request_seed(prompt, sample_key)
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
            loaded = self.model.state_dict()
            received = WeightDigest()  # the model's weights read back under the names received
            for name in state_dict:
                received.add(name, loaded[name])
            print(
                f"[hf-rollout] weights v{self.weight_version} loaded (global_steps={global_steps}, "
                f"checksum={self._checksum():.6f}, batches since last: {self.batch_sizes[-50:]}, device={self.device}, "
                f"pool={self.pool}, replica={self.replica_rank}, received_digest={received.hexdigest()})",
                flush=True,
            )
            self.batch_sizes = []
            return self.weight_version

    def request_seed(self, prompt: tuple[int, ...], sample_key: tuple | list | None = None) -> int:
        """The seed of one request's sampling (module docstring); a keyless request counts a draw."""
        if sample_key is not None:
            return row_seed(self.base_seed, "sample", tuple(sample_key), prompt)
        draw = self._draws.get(prompt, 0)
        self._draws[prompt] = draw + 1
        return row_seed(self.seed, self._weights_key(), prompt, draw)

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
            # full determinism: one sequence per decode (batch invariance; sampling.py), else one batch per group
            decodes = [([it], key) for key, items in groups.items() for it in items] if self.one_per_decode \
                else [(items, key) for key, items in groups.items()]
            for items, key in decodes:
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

    def _generate_batch(
        self,
        prompts: list[list[int]],
        temperature: float,
        top_p: float,
        top_k: int,
        max_tokens: int,
        seeds: list[int] | None = None,
    ) -> list[TokenOutput]:
        """One decode batch with this server's model, EOS ids and length limit (sampling.generate_batch);
        without request seeds, each prompt's seed follows from the server's seed and loaded weights."""
        if seeds is None and not temperature <= 0.0:
            seeds = [row_seed(self.seed, self._weights_key(), tuple(p)) for p in prompts]
        return generate_batch(
            self.model, prompts, temperature, top_p, top_k, max_tokens, seeds, eos_ids=self.eos_ids,
            pad_id=self.pad_id, max_model_len=self.max_model_len, device=self.device, global_steps=self.global_steps,
            share_prefix=self.share_prefix,
        )
