"""How the tiny model's shipped weights were made: a byte-level BPE tokenizer trained on the task's text, a small
Qwen2 model initialised from a seeded config, a short supervised warm-up on noisy targets (``rpg.tiny.task``).

The result depends on the machine: the warm-up's 300 AdamW steps amplify the last bits of every matrix product,
whose summation order follows the CPU's kernels (AVX-512, AVX2, ATen's default path) and the torch version. So
the model is made once, by ``python -m rpg.tiny.regenerate``, and its files are shipped (``rpg/tiny/weights/``);
every build copies them (``rpg.tiny.build``) and every machine trains the same bits.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from rpg.tiny import task

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
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
SFT_EXAMPLES_PER_PAIR = 24
SFT_STEPS = 300
SFT_BATCH = 64
SFT_LR = 5e-3


def warm_up_split(seed: int = SEED) -> list[tuple[int, int, str]]:
    """The supervised warm-up split: every pair, ``SFT_EXAMPLES_PER_PAIR`` noisy targets each, shuffled."""
    rng = random.Random(seed)
    sft = [(a, b, task.noisy_response(a, b, rng)) for (a, b) in task.all_pairs() for _ in range(SFT_EXAMPLES_PER_PAIR)]
    rng.shuffle(sft)
    return sft


def train_tokenizer(corpus: list[str]):
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


def prompt_ids(tok, a: int, b: int) -> list[int]:
    """Problem (a, b) as the chat template renders it for generation, as token ids."""
    ids = tok.apply_chat_template(
        [{"role": "user", "content": task.question(a, b)}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def make_model(model_dir: Path, log=lambda message: None) -> dict:
    """Train the tokenizer, initialise and warm up the model, save both into ``model_dir``; what was made."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    sft = warm_up_split()
    corpus = [
        f"<|im_start|>user\n{task.question(a, b)}<|im_end|>\n<|im_start|>assistant\n{y}<|im_end|>\n"
        for (a, b, y) in sft[:2000]
    ] + [task.response(s) for s in range(task.MAX_SUM + 1)]
    t0 = time.time()
    tok = train_tokenizer(corpus)
    tok.save_pretrained(model_dir)
    log(f"tokenizer trained ({len(tok)} tokens, {time.time() - t0:.1f}s)")

    torch.manual_seed(SEED)
    config = Qwen2Config(vocab_size=len(tok), bos_token_id=None, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, torch_dtype="float32", **MODEL_KW)
    model = Qwen2ForCausalLM(config)
    loss = warm_up(model, tok, sft, log)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               bos_token_id=None)
    model.save_pretrained(model_dir, safe_serialization=True)
    log(f"made in {time.time() - t0:.0f}s: warm-up loss {loss:.3f}")
    return {"sft_steps": SFT_STEPS, "sft_final_loss": loss, "model": MODEL_KW}


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


def warm_up(model, tok, sft: list[tuple[int, int, str]], log=lambda message: None) -> float:
    """Supervised warm-up on the noisy split: next-token loss on response tokens only."""
    import torch

    eos = tok.eos_token_id
    seqs, masks = [], []
    for a, b, y in sft:
        p = prompt_ids(tok, a, b)
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
