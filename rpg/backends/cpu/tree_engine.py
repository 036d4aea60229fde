"""verl's FSDP language-model engine on the CPU backend, with each micro-batch computed as a prefix tree.

``PrefixTreeEngine`` is verl's ``FSDPEngineWithLMHead`` whose ``forward_step`` runs the model over the micro-batch's
distinct prefixes once (``rpg.backends.cpu.prefix_tree``: a group's prompt once for its responses, the prompts'
common opening once for all) and applies the output head only at the tokens whose log-probs verl reads (the
responses'), returning what verl's own step returns: per token of each sequence its log-prob (and entropy) in a
jagged tensor, which the old-log-prob, reference and update passes slice to the responses as before. The numbers
are verl's within float32 rounding (tests/backends/test_cpu_prefix_tree.py). It serves the old-log-prob, reference
and update passes of every CPU run (registered for device ``cpu`` by ``rpg.backends.cpu.external_module``).

Micro-batches it does not cover go to verl's step, and the process says so once: sequence parallelism, fused
kernels, distillation, Σπ², multi-modal inputs, 3-D position ids, a padded layout, a model with a sliding window, an
attention implementation the tree is not tested exact with (``prefix_tree.TREE_ATTENTION``: sdpa and eager).
``RPG_CPU_PREFIX_TREE=0`` (forwarded to the workers) turns it off.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext

import torch
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.dataset_utils import DatasetPadMode
from verl.utils.device import get_device_id
from verl.utils.model import extract_multi_modal_inputs
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.engine.utils import detach_tree

from rpg.backends.cpu.env_overrides import PREFIX_TREE_ENV, prefix_tree_on
from rpg.backends.cpu.prefix_tree import TREE_ATTENTION, ReadPositions, build_prefix_tree, packed_values, tree_log_probs

_OFF_FLAGS = ("distillation_use_topk", "distillation_only", "calculate_sum_pi_squared", "use_fused_kernels")


def _lengths(nested: torch.Tensor) -> list[int]:
    return nested.offsets().diff().tolist()


class PrefixTreeEngine(FSDPEngineWithLMHead):
    """verl's engine; ``forward_step`` over the micro-batch's prefix tree where ``uncovered`` finds nothing."""

    _said: set[str] = set()

    def uncovered(self, micro_batch) -> str | None:
        """Why this micro-batch takes verl's step, or None."""
        if not prefix_tree_on():
            return f"{PREFIX_TREE_ENV}=0"
        if self.ulysses_sequence_parallel_size > 1:
            return "sequence parallelism"
        for flag in _OFF_FLAGS:
            if tu.get_non_tensor_data(data=micro_batch, key=flag, default=False):
                return flag
        if tu.get_non_tensor_data(data=micro_batch, key="pad_mode", default=DatasetPadMode.NO_PADDING) \
                != DatasetPadMode.NO_PADDING:
            return "a padded layout"
        if extract_multi_modal_inputs(micro_batch.get("multi_modal_inputs", [])):
            return "multi-modal inputs"
        if not micro_batch["input_ids"].is_nested or micro_batch["position_ids"].dim() != 2:
            return "3-D position ids"
        config = self.module.config.get_text_config()
        kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"} or getattr(config, "use_sliding_window", False):
            return f"a model with {sorted(kinds)} layers or a sliding window"
        implementation = config._attn_implementation
        if implementation not in TREE_ATTENTION:
            return f"attn_implementation={implementation}; the tree is exact with {', '.join(TREE_ATTENTION)}"
        return None

    def forward_step(self, micro_batch, loss_function, forward_only):
        why = self.uncovered(micro_batch)
        if why is not None:
            if why not in self._said:
                self._said.add(why)
                print(f"[rpg] the actor's prefix tree is off for these micro-batches ({why}): verl's packed forward",
                      file=sys.stderr, flush=True)
            return super().forward_step(micro_batch, loss_function, forward_only)
        micro_batch = micro_batch.to(get_device_id())
        model_output = self.tree_output(micro_batch)
        if loss_function is not None:
            loss, metrics = loss_function(model_output=model_output, data=micro_batch,
                                          dp_group=self.get_data_parallel_group())
        else:
            assert forward_only, "forward_only must be True when loss_function is None"
            loss, metrics = torch.tensor(1.0), {}
        return loss, {"model_output": detach_tree(model_output), "loss": loss.detach().item(), "metrics": metrics}

    def tree_output(self, micro_batch) -> dict[str, torch.Tensor]:
        """verl's ``model_output`` (``log_probs``, and ``entropy`` when asked) computed over the prefix tree."""
        input_ids, position_ids = micro_batch["input_ids"], micro_batch["position_ids"]
        lengths = _lengths(input_ids)
        sequences = list(input_ids.unbind())
        response = micro_batch.get("responses", None)
        if response is None or not response.is_nested:
            response = micro_batch.get("response_mask", None)
        reads = (ReadPositions.responses(lengths, _lengths(response)) if response is not None and response.is_nested
                 else ReadPositions.every(lengths))
        temperature = micro_batch["temperature"]
        temperatures = (temperature.float() if isinstance(temperature, torch.Tensor)
                        else torch.full((len(lengths),), float(temperature)))
        entropy_fn = (self.compute_entropy_from_logits
                      if tu.get_non_tensor_data(data=micro_batch, key="calculate_entropy", default=False) else None)
        tree = build_prefix_tree(sequences, list(position_ids.unbind()))
        autocast = getattr(self, "_autocast_dtype", torch.float32)
        with nullcontext() if autocast == torch.float32 else torch.autocast(device_type="cpu", dtype=autocast):
            log_probs, entropy = tree_log_probs(self.module, tree, sequences, reads, temperatures, entropy_fn)
        offsets = input_ids.offsets()
        out = {"log_probs": torch.nested.nested_tensor_from_jagged(packed_values(log_probs, lengths, reads), offsets)}
        if entropy is not None:
            out["entropy"] = torch.nested.nested_tensor_from_jagged(packed_values(entropy, lengths, reads), offsets)
        return out
