"""TRL 1.16.0: GRPO's KL term has no function of its own; it is computed inside ``GRPOTrainer._compute_loss``
(``per_token_kl = exp(ref − l) − (ref − l) − 1``, times the importance ratio ``coef_1`` when
``use_bias_correction_kl``, the default), so the probe drives a real ``GRPOTrainer``'s loss step
(``trainer.compute_loss``, the model in eval mode) on a tiny model whose logits are the scenario's policy.

The model (``RowsLM``) is a transformers ``PreTrainedModel``: its backbone maps each input to one-hot hidden states,
one per (sequence, position), and its LM head (V + 2 outputs: the V tokens, a prompt token and end-of-sequence)
holds the policy's logits there, the two special tokens at −1e4 (probability 0 in float64). TRL's own fused LM head
computes the log-probs from them. The advantage is 0 (the policy term has no gradient), β = 1, and the sampler's
log-probs are ``old_per_token_logps`` (μ = π_old: the samples are μ's). The gradient on the head's weight is the
gradient on each sequence's logits; TRL's ``dapo`` loss (the default) divides the batch's token sum by
``num_items_in_batch`` = N·T, which the probe multiplies back.
"""

from __future__ import annotations

import functools
import tempfile

import torch

from rpg_lab.conformance.probes import protocol

SPECIAL = ("<p>", "<eos>")
SETTINGS_ARGS = {  # key -> GRPOConfig arguments besides beta
    "loss:k3": {},  # the defaults: use_bias_correction_kl=True, importance_sampling_level="token"
    "loss:k3-no-is": {"use_bias_correction_kl": False},
    "loss:k3-is-sequence": {"importance_sampling_level": "sequence"},
}


@functools.cache
def _model_classes():
    from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

    class RowsConfig(PretrainedConfig):
        model_type = "rpg_lab_rows"

        def __init__(self, vocab_size=8, rows=1, tokens=6, **kwargs):
            self.rows, self.tokens = rows, tokens
            self.auto_map = {}  # a registered class, not remote code (TRL's create_model_from_path reads it)
            super().__init__(vocab_size=vocab_size, **kwargs)

    class RowsBackbone(torch.nn.Module):
        """One-hot hidden state per (sequence, position): sequence n (its tokens read in base ``tokens``) at
        position p predicts its token p + 1 from row n·T + p; the last position has no row."""

        def __init__(self, config):
            super().__init__()
            self.config = config

        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            completion = input_ids[:, 1:]
            B, T = completion.shape
            digits = self.config.tokens ** torch.arange(T - 1, -1, -1)
            n = (completion * digits).sum(-1)
            rows = n[:, None] * T + torch.arange(T)
            hidden = torch.zeros(B, T + 1, self.config.rows, dtype=torch.float64)
            hidden[:, :T] = torch.nn.functional.one_hot(rows, self.config.rows).to(torch.float64)
            return BaseModelOutput(last_hidden_state=hidden)

    class RowsLM(PreTrainedModel, GenerationMixin):
        config_class = RowsConfig
        base_model_prefix = "backbone"
        _supports_sdpa = True

        def __init__(self, config):
            super().__init__(config)
            self.backbone = RowsBackbone(config)
            self.lm_head = torch.nn.Linear(config.rows, config.vocab_size, bias=False, dtype=torch.float64)
            self.post_init()

        def get_output_embeddings(self):
            return self.lm_head

        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            return CausalLMOutput(logits=self.lm_head(self.backbone(input_ids).last_hidden_state))

    return RowsConfig, RowsLM


def _tokenizer(tokens: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {**{f"t{i}": i for i in range(tokens)}, **{s: tokens + i for i, s in enumerate(SPECIAL)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<eos>", bos_token="<p>")


@functools.cache
def _trainer(key: str, tokens: int, rows: int, folder: str):
    """A GRPOTrainer of ``key``'s settings around a RowsLM saved in ``folder`` (the reference model TRL builds is
    loaded from there through transformers' Auto classes; the loss takes the reference's log-probs from the
    inputs)."""
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    RowsConfig, RowsLM = _model_classes()
    AutoConfig.register(RowsConfig.model_type, RowsConfig, exist_ok=True)
    AutoModelForCausalLM.register(RowsConfig, RowsLM, exist_ok=True)
    path = f"{folder}/rows-{tokens}-{rows}"
    RowsLM(RowsConfig(vocab_size=tokens + len(SPECIAL), rows=rows, tokens=tokens)).save_pretrained(path)
    tokenizer = _tokenizer(tokens)
    tokenizer.save_pretrained(path)
    args = GRPOConfig(output_dir=f"{folder}/out-{key}", beta=1.0, use_cpu=True, report_to=[], num_generations=2,
                      per_device_train_batch_size=2, max_completion_length=4, bf16=False, fp16=False,
                      **SETTINGS_ARGS[key])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
    return GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)], args=args,
                       train_dataset=Dataset.from_dict({"prompt": ["<p>"] * 2}), processing_class=tokenizer)


def _loss(batch: dict, key: str, folder: str) -> dict:
    logits, seqs = batch["logits"], batch["seqs"]
    N, T, V = logits.shape
    tokens = V
    trainer = _trainer(key, tokens, N * T, folder)
    model = trainer.model
    model.eval()
    head = torch.full((tokens + len(SPECIAL), N * T), -1e4, dtype=torch.float64)
    head[:V] = logits.reshape(N * T, V).T
    with torch.no_grad():
        model.lm_head.weight.copy_(head)
    model.lm_head.weight.grad = None
    prompt = torch.full((N, 1), tokens, dtype=torch.long)  # <p>
    inputs = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": seqs,
              "completion_mask": torch.ones_like(seqs), "advantages": torch.zeros(N, dtype=torch.float64),
              "old_per_token_logps": batch["l_mu"], "ref_per_token_logps": batch["l_ref"],
              "num_items_in_batch": torch.tensor(float(N * T))}
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    grad = model.lm_head.weight.grad[:V].T.reshape(N, T, V) * (N * T)  # dapo: Σ over the batch's tokens / (N·T)
    return {"value": torch.full((N, T), float("nan")), "slope_logits": grad.detach().clone()}


def compute(batches: list[dict]) -> list[dict]:
    """A trainer per setting and shape, built once, in a temporary folder removed at the end."""
    with tempfile.TemporaryDirectory() as folder:
        settings = {key: functools.partial(_loss, key=key, folder=folder) for key in SETTINGS_ARGS}
        out = protocol.compute(settings, batches)
        _trainer.cache_clear()
        return out


SETTINGS = SETTINGS_ARGS  # the keys; each computed by ``compute``'s trainer of that key
DISTRIBUTION = "trl"

if __name__ == "__main__":
    protocol.main(compute, DISTRIBUTION)
