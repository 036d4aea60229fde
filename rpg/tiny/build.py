"""Build the tiny model, tokenizer and task files locally (no downloads), once, cached.

Layout of a build (``<cache_root>/<key>/``, ``key`` = hash of this package's sources, so an edit
to the builder yields a fresh build and reruns reuse the old one):

    model/        Qwen2ForCausalLM (float32 safetensors) + byte-level BPE tokenizer + chat template
    train.parquet RL prompts (verl RLHFDataset rows, data_source=math_dapo)
    val.parquet   held-out RL prompts (disjoint (a, b) pairs)
    sft.parquet   the supervised warm-up split actually used (noisy labels; see rpg.tiny.task)
    build.json    what was built and the warm-up's final loss

Steps: (1) train a byte-level BPE tokenizer with `tokenizers` on the task's own text;
(2) initialise a small Qwen2 model from a seeded config; (3) a short supervised warm-up in plain
torch (a few seconds on 2 cores) on the noisy split, loss on response tokens only; (4) save.
Everything is seeded; the build is deterministic on a given machine and torch version.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rpg.tiny.build_cache import build_once
from rpg.paths.checkout import checkout_root
from rpg.tiny import task

CACHE_ENV = "RPG_TINY_CACHE"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Model and warm-up hyper-parameters (part of the cache key through this file's hash).
MODEL_KW = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)
VOCAB_SIZE = 384
SEED = 1234
N_VAL = 30
SFT_EXAMPLES_PER_PAIR = 24
SFT_STEPS = 300
SFT_BATCH = 64
SFT_LR = 5e-3


@dataclass(frozen=True)
class TinyAssets:
    root: Path
    model_dir: Path
    train_file: Path
    val_file: Path
    sft_file: Path

    @classmethod
    def at(cls, root: Path) -> "TinyAssets":
        root = Path(root)
        return cls(root, root / "model", root / "train.parquet", root / "val.parquet", root / "sft.parquet")

    def complete(self) -> bool:
        return all(p.exists() for p in (self.model_dir / "config.json", self.train_file, self.val_file, self.root / "build.json"))


def default_cache_root() -> Path:
    """``$RPG_TINY_CACHE``, else ``<project root>/.cache/rpg-tiny``, else ``~/.cache/rpg-tiny``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    root = checkout_root()
    return (root / ".cache" / "rpg-tiny") if root else Path.home() / ".cache" / "rpg-tiny"


BUILDER_SOURCES = ("build.py", "task.py")  # what determines the assets (not overrides.py etc.)


def builder_key() -> str:
    """Content hash of the builder sources -> cache sub-directory name."""
    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent / name for name in BUILDER_SOURCES):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def build_tiny_assets(cache_root: Path | str | None = None, force: bool = False, quiet: bool = False,
                      prefix: str = "[tiny]") -> TinyAssets:
    """Return the tiny assets, building them first if this builder version has not built them yet.

    A build prints progress lines on stderr (unless ``quiet``), each starting with the caller's ``prefix``
    (the GPU smoke run's own): each stage and the warm-up's loss about every 10 % of its steps. Concurrent
    calls are safe, and a build is published only when complete (``rpg.tiny.build_cache.build_once``).
    """
    cache_root = Path(cache_root) if cache_root is not None else default_cache_root()
    assets = TinyAssets.at(cache_root / builder_key())

    def log(message: str) -> None:
        if not quiet:
            print(f"{prefix} {message}", file=sys.stderr, flush=True)

    build_once(cache_root, assets.root, assets.complete, lambda tmp: _build_into(tmp, log), log,
               "the tiny model and task", force=force)
    return assets


# ----------------------------------------------------------------------------------------------


def _train_tokenizer(corpus: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # digits are always single tokens (as in Qwen2's tokenizer), so numbers tokenize consistently
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def _prompt_ids(tok, a: int, b: int) -> list[int]:
    ids = tok.apply_chat_template(
        [{"role": "user", "content": task.question(a, b)}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def _build_into(out: Path, log=lambda message: None) -> None:
    import pandas as pd
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    rng = random.Random(SEED)
    train_pairs, val_pairs = task.split_pairs(SEED, N_VAL)

    # warm-up split: every pair, several noisy labels each
    sft = [(a, b, task.noisy_response(a, b, rng)) for (a, b) in task.all_pairs() for _ in range(SFT_EXAMPLES_PER_PAIR)]
    rng.shuffle(sft)

    corpus = [
        f"<|im_start|>user\n{task.question(a, b)}<|im_end|>\n<|im_start|>assistant\n{y}<|im_end|>\n"
        for (a, b, y) in sft[:2000]
    ] + [task.response(s) for s in range(task.MAX_SUM + 1)]
    t0 = time.time()
    tok = _train_tokenizer(corpus)
    model_dir = out / "model"
    tok.save_pretrained(model_dir)
    log(f"tokenizer trained ({len(tok)} tokens, {time.time() - t0:.1f}s)")

    torch.manual_seed(SEED)
    config = Qwen2Config(
        vocab_size=len(tok),
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
        **MODEL_KW,
    )
    model = Qwen2ForCausalLM(config)
    loss = _warm_up(model, tok, sft, log)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None
    )
    model.save_pretrained(model_dir, safe_serialization=True)

    rows = lambda pairs, split: [task.rl_row(a, b, split, i) for i, (a, b) in enumerate(pairs)]  # noqa: E731
    pd.DataFrame(rows(train_pairs, "train")).to_parquet(out / "train.parquet")
    pd.DataFrame(rows(val_pairs, "val")).to_parquet(out / "val.parquet")
    pd.DataFrame(
        [{"prompt": task.question(a, b), "response": y, "correct": y == task.response(a + b)} for a, b, y in sft]
    ).to_parquet(out / "sft.parquet")
    info = {
        "builder_key": builder_key(),
        "n_params": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tok),
        "n_train_prompts": len(train_pairs),
        "n_val_prompts": len(val_pairs),
        "n_sft_examples": len(sft),
        "sft_target_accuracy": sum(y == task.response(a + b) for a, b, y in sft) / len(sft),
        "sft_steps": SFT_STEPS,
        "sft_final_loss": loss,
        "model": MODEL_KW,
    }
    (out / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"built in {time.time() - t0:.0f}s: {info['n_params'] / 1e6:.2f} M parameters, warm-up loss {loss:.3f}")


def response_nll(model, ids, labels):
    """Mean next-token NLL over the labelled tokens (label -100 = ignored) of right-padded ``ids``.

    Equal to ``model(input_ids=ids, attention_mask=mask, labels=labels).loss`` but cheaper: with right
    padding and causal attention a real token never attends to padding, so no attention mask is
    needed (sdpa takes its fast causal path), and the vocabulary projection is applied only at the
    labelled positions (not at the ~41 prompt positions). Equality is tested.
    """
    import torch

    hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
    target = labels[:, 1:]
    keep = target != -100
    return torch.nn.functional.cross_entropy(model.lm_head(hidden[keep]).float(), target[keep])


def _warm_up(model, tok, sft: list[tuple[int, int, str]], log=lambda message: None) -> float:
    """Supervised warm-up on the noisy split: next-token loss on response tokens only."""
    import torch

    eos = tok.eos_token_id
    seqs, masks = [], []
    for a, b, y in sft:
        p = _prompt_ids(tok, a, b)
        r = tok.encode(y, add_special_tokens=False) + [eos]
        seqs.append(p + r)
        masks.append([0] * len(p) + [1] * len(r))
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)  # right padding
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, : len(s)] = torch.where(torch.tensor(m) == 1, torch.tensor(s), torch.tensor(-100))

    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / SFT_STEPS))
    model.train()
    last = []
    t0, every = time.time(), max(1, SFT_STEPS // 10)
    for step in range(SFT_STEPS):
        idx = torch.randint(0, len(seqs), (SFT_BATCH,), generator=gen)
        loss = response_nll(model, ids[idx], labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        last.append(loss.item())
        if (step + 1) % every == 0:
            recent = last[-every:]
            log(f"supervised warm-up step {step + 1}/{SFT_STEPS}: loss {sum(recent) / len(recent):.3f} "
                f"({time.time() - t0:.0f}s)")
    model.eval()
    return float(sum(last[-20:]) / 20)
