#!/usr/bin/env python
"""The shipped runs' experiment files, checked against their names: ``recipe/rpg/config/experiment/<run>.yaml``.

A run is declared by its experiment file alone (the launch composes it and never reads the name). Each paper
script's name (``recipe/rpg/{7b,4b}/<run>.sh``) also reads as a grammar (``GRAMMAR``; the readings of the authors'
names and of what the paper leaves open are marked READING below and listed in docs/launch-scripts.md), and this
script checks that each file says what its name says: every setting the name decides, with its value, its model,
data files and names, nothing the name does not decide, on the paper setup (``paper/default.yaml``), and the paper
row its first comment line names. It writes nothing; ``tests/launch/test_launch_experiments.py`` runs it.

    python scripts/experiments.py --check               # every file of the recipe's folder: one line per disagreement
    python scripts/experiments.py --check FILE.yaml ... # those files (named <run>.yaml); exit 1 on any disagreement
    python scripts/experiments.py --table               # the table of every script (docs/launch-scripts.md, section 8)
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path, PurePath

from rpg.paths.checkout import CHECKOUT, RECIPE_DIR
from rpg.config import DIVERGENCES  # the loss library's names, declared torch-free
from rpg.config.allowed_values import yaml_value
from rpg.launch.experiments import EXPERIMENT_DIR, recipe_yaml


def known_names() -> list[str]:
    """Names of the scripts shipped in recipe/rpg/{7b,4b}."""
    root = CHECKOUT / RECIPE_DIR
    return sorted(p.stem for d in ("7b", "4b") if (root / d).is_dir() for p in (root / d).glob("run_*.sh"))


GRAMMAR = """\
run_<algo>_<model>[_ctx<2k|4k|8k>][_<kl><beta> | _<beta>][_rf[_clip_ppo[_<eps_low>_<eps_high>]]][_noiterref][_schedulefree][_7binstruct]
  algo   : grpo | dapo | rfpp | rfppb | rpg
  model  : 7b (Qwen2.5-Math-7B, 2K context) | 4b (Qwen3-4B, needs _ctx2k|_ctx4k|_ctx8k)
  kl     : fkl | rkl | ufkl | urkl followed by beta, e.g. _ufkl1e-4 (rpg only; rpg without it = no-KL RPG)
  beta   : alone, e.g. _1e-4: k1 KL-loss coefficient (rfpp / rfppb, required)
  _rf                      : RPG-REINFORCE, unclipped
  _rf_clip_ppo_<lo>_<hi>   : RPG-REINFORCE with RPG-Style Clip, eps_low/eps_high (e.g. _0.2_0.28)
  _rf_clip_ppo             : authors' shorthand for eps (0.1, 0.1)
  _noiterref               : fixed initial-model reference (rpg, rfpp, rfppb)
  _schedulefree            : schedule-free AdamW;  _7binstruct: Qwen2.5-7B-Instruct (7b only)
  irregular authors' names : run_dapo_7binstruct (= run_dapo_7b_7binstruct)
examples: run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28_schedulefree_7binstruct, run_grpo_7b,
          run_rfpp_7b_1e-4, run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28, run_dapo_4b_ctx4k"""

ALGOS = ("grpo", "dapo", "rfpp", "rfppb", "rpg")
CONTEXTS = {"2k": 2048, "4k": 4096, "8k": 8192}

# READING: the authors' `7b` scripts default to Qwen2.5-Math-7B; `_7binstruct`
# switches to Qwen2.5-7B-Instruct. READING (open in the paper, Sec. 5): "Qwen3-4B" = the
# hybrid Qwen/Qwen3-4B with thinking OFF (2K/4K budgets cannot hold thinking traces; the prompt
# asks for step-by-step reasoning ending in "Answer:"); MODEL_PATH changes it (e.g. Qwen3-4B-Base).
MODELS = {"7b": "Qwen/Qwen2.5-Math-7B", "7binstruct": "Qwen/Qwen2.5-7B-Instruct", "4b": "Qwen/Qwen3-4B"}

# Evaluation sets (file stems written by `python -m rpg.data prepare-all`, one row per problem;
# mean@32 = val_kwargs.n=32). READING: Table 7 (Minerva, OlympiadBench at 4K) evaluates the same
# 4K runs as Table 5, so the 4K runs validate on all five sets; Minerva / OlympiadBench with one
# sample per problem (Table 7's k/272, k/674 grids), set by the recipe's rpg.validation.samples_per_problem.
VAL_SETS_MAIN = ("aime2024", "aime2025", "amc2023")
VAL_SETS_4K = VAL_SETS_MAIN + ("minerva", "olympiadbench")
TRAIN_SET = "dapo-math-17k-en"

_NAME_RE = re.compile(
    r"^run_(?P<algo>[a-z]+)_(?P<model>7binstruct|7b|4b)"
    r"(?:_ctx(?P<ctx>\d+k))?"
    rf"(?:_(?P<kl>{'|'.join(DIVERGENCES)})?(?P<beta>\d+(?:\.\d+)?e-\d+))?"
    r"(?:_(?P<rf>rf)(?:_(?P<clip>clip_ppo)(?:_(?P<lo>\d+(?:\.\d+)?)_(?P<hi>\d+(?:\.\d+)?))?)?)?"
    r"(?:_(?P<noiterref>noiterref))?"
    r"(?:_(?P<sf>schedulefree))?"
    r"(?:_(?P<instruct>7binstruct))?$"
)


class VariantNameError(ValueError):
    """An unknown or malformed run name (the message shows the grammar)."""


@dataclass(frozen=True)
class Variant:
    """Everything a run name decides. Paths, cluster size and loggers come from the launcher."""

    name: str
    algo: str                 # grpo | dapo | rfpp | rfppb | rpg
    model_tag: str            # 7b | 7binstruct | 4b
    model: str                # default MODEL_PATH (Hugging Face id)
    context: str              # 2k | 4k | 8k
    loss: str                 # rpg.loss.name: verl (stock actor loss) | rpg
    divergence: str | None    # rpg: fkl | rkl | ufkl | urkl; None for stock losses and no-KL RPG
    form: str                 # ppo (verl's dual-clip PPO loss) | differentiable | reinforce
    clip: bool                # rpg.loss.clip (stock PPO loss: always clipped)
    eps_low: float
    eps_high: float
    clip_c: float             # dual-clip constant c
    beta: float               # KL coefficient (0 = no KL term)
    kl_type: str | None       # verl kl_loss_type of the stock losses: low_var_kl (k3) | kl (k1) | None
    adv_estimator: str
    norm_adv_by_std: bool
    lr: float
    optimizer: str            # adamw | schedulefree
    reference: str            # sampler (iterative: pi_old of each step) | fixed (initial model) | none (no KL)
    filtering: bool           # DAPO dynamic sampling (drop groups with zero accuracy std)
    overlong: bool            # DAPO overlong reward shaping
    max_prompt_length: int
    max_response_length: int
    max_tokens_per_gpu: int   # dynamic-batching token budget (packing only, not the math)
    thinking: bool | None     # Qwen3 chat-template thinking switch; None = model has none
    val_sets: tuple[str, ...]
    irregular: str | None = None  # what an irregular authors' name means

    @property
    def overlong_buffer(self) -> int:
        """READING (not in the paper): buffer = L_max / 4 (the authors' scripts: 512 at 2K), factor 1.0."""
        return self.max_response_length // 4

    @property
    def reference_mode(self) -> str:
        """Value of rpg.reference.mode ("none" = no KL term: no reference model is built)."""
        return "fixed" if self.reference == "fixed" else "sampler"


def _fail(name: str, why: str) -> VariantNameError:
    close = difflib.get_close_matches(name, known_names(), n=3, cutoff=0.75)
    hint = f"\nclosest script names: {', '.join(close)}" if close else ""
    return VariantNameError(f"bad run name {name!r}: {why}{hint}\nrun names follow:\n{GRAMMAR}")


def _clean(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise VariantNameError(f"run name must be a non-empty string, got {name!r}\nrun names follow:\n{GRAMMAR}")
    base = PurePath(name).name
    return base[:-3] if base.endswith(".sh") else base


def parse(name: str) -> Variant:
    """Parse a run name (a script name, with or without directory and ``.sh``) into a Variant."""
    name = _clean(name)
    m = _NAME_RE.match(name)
    if m is None:
        raise _fail(name, "it does not match the grammar")
    g = m.groupdict()
    algo, model_tag = g["algo"], g["model"]
    if algo not in ALGOS:
        raise _fail(name, f"unknown algorithm {algo!r}; allowed: {', '.join(ALGOS)}")

    irregular = None
    if model_tag == "7binstruct":  # authors' irregular `run_dapo_7binstruct`
        if any(g[k] for k in ("ctx", "beta", "rf", "noiterref", "sf", "instruct")):
            raise _fail(name, "the shorthand run_<algo>_7binstruct takes no further tokens; "
                              "write run_<algo>_7b_..._7binstruct")
        irregular = f"authors' spelling of run_{algo}_7b_7binstruct (no '7b_' before '7binstruct')"
    if g["instruct"]:
        if model_tag != "7b":
            raise _fail(name, "_7binstruct is only valid with model 7b")
        model_tag = "7binstruct"

    # --- context
    if model_tag == "4b":
        if g["ctx"] not in CONTEXTS:
            raise _fail(name, f"model 4b needs _ctx2k, _ctx4k or _ctx8k (got {g['ctx'] and '_ctx' + g['ctx']!r})")
        context = g["ctx"]
    else:
        if g["ctx"]:
            raise _fail(name, "7b runs are 2K-context only (Qwen2.5-Math-7B has 4K positions); drop _ctx")
        context = "2k"
    length = CONTEXTS[context]

    # --- KL token
    kl, beta_s = g["kl"], g["beta"]
    beta = float(beta_s) if beta_s else None
    if beta is not None and not beta > 0:
        raise _fail(name, f"the KL coefficient must be > 0, got {beta_s}")
    if algo in ("grpo", "dapo") and beta_s:
        raise _fail(name, f"{algo} takes no KL token (GRPO: k3 1e-3 vs the initial model; DAPO: no KL); "
                          "change them with Hydra overrides")
    if algo in ("rfpp", "rfppb"):
        if beta is None or kl:
            raise _fail(name, f"{algo} needs its k1 KL-loss coefficient as a bare number, e.g. run_{algo}_7b_1e-4")
    if algo == "rpg" and beta_s and not kl:
        raise _fail(name, "rpg needs a divergence before the coefficient: fkl, rkl, ufkl or urkl (e.g. _ufkl1e-4)")
    if algo != "rpg" and (g["rf"] or kl):
        raise _fail(name, "_<kl><beta> and _rf/_rf_clip_ppo are rpg-only tokens")
    if g["rf"] and not kl:
        raise _fail(name, "_rf needs a divergence and coefficient first, e.g. run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28")
    if g["noiterref"] and (algo in ("grpo", "dapo") or beta is None):
        raise _fail(name, "_noiterref needs a KL term against an iterative reference (rpg with a divergence, rfpp, "
                          "rfppb)")

    # --- family settings (paper Sec. 5 and App. H; the authors' 7B scripts, recipe/rpg/7b/ in
    # github.com/complex-reasoning/RPG)
    # the recipe's YAML states the paper's clip ratios, c and lr; the name changes them below
    paper = paper_setup()
    optimizer = "schedulefree" if g["sf"] else "adamw"
    eps_low, eps_high, clip = paper["clip_ratio_low"], paper["clip_ratio_high"], True
    kl_type, divergence = None, None
    filtering = overlong = True
    lr = paper["lr"]
    tok = 4096
    if algo == "grpo":
        # READING: stock verl GRPO as in the scripts: k3 (low_var_kl) 1e-3 KL loss vs the frozen initial
        # model, clip (0.2, 0.2) (Sec. 5 + scripts; App. H's (0.1, 0.1) contradicts both),
        # no dynamic sampling, no overlong shaping.
        loss, form, adv, norm_std = "verl", "ppo", "grpo", True
        eps_high, beta, kl_type, reference = eps_low, 1e-3, "low_var_kl", "fixed"  # symmetric: (0.2, 0.2)
        filtering = overlong = False
    elif algo == "dapo":
        loss, form, adv, norm_std = "verl", "ppo", "grpo", True
        beta, reference = 0.0, "none"
    elif algo in ("rfpp", "rfppb"):
        # READING: k1 ("kl") KL loss against pi_old (the authors' iterative reference): the glue's
        # rpg.loss.name=verl + rpg.reference.mode=sampler + use_kl_loss=True feeds old_log_probs as
        # ref_log_prob (no reference model). _noiterref: against the initial model instead.
        loss, form, norm_std = "verl", "ppo", False
        adv = "reinforce_plus_plus" if algo == "rfpp" else "reinforce_plus_plus_baseline"
        kl_type, reference = "kl", ("fixed" if g["noiterref"] else "sampler")
    elif kl is None:
        # READING: run_rpg_7b_schedulefree = RPG with the KL switched off (use_kl_loss=False): the fully
        # differentiable RPG loss with beta=0 = PPO dual-clip on the group-mean advantage.
        loss, form, adv, norm_std = "rpg", "differentiable", "rpg", False
        beta, reference = 0.0, "none"
        irregular = "no KL token: RPG without KL regularisation (beta = 0; authors' run_rpg_7b_schedulefree)"
    else:
        loss, adv, norm_std, divergence = "rpg", "rpg", False, kl
        reference = "fixed" if g["noiterref"] else "sampler"
        if g["rf"]:
            # READING: 5e-7 is the authors' 7B RPG-REINFORCE scripts' value and appears
            # nowhere in the paper; the Qwen3-4B runs (no released scripts) follow App. H: "unless otherwise
            # specified ... a learning rate of 1e-6".
            form = "reinforce"
            lr = 5e-7 if model_tag in ("7b", "7binstruct") else paper["lr"]
            if g["clip"]:
                tok = 16384  # the authors' rf_clip_ppo packing limit
                if g["lo"] is None:
                    eps_low = eps_high = 0.1
                    irregular = "no eps in the name: authors' shorthand for eps (0.1, 0.1)"
                else:
                    eps_low, eps_high = float(g["lo"]), float(g["hi"])
                    if not (0 < eps_low < 1 and eps_high > 0):
                        raise _fail(name, f"clip ratios need 0 < eps_low < 1 and eps_high > 0, got {g['lo']}, "
                                          f"{g['hi']}")
            else:
                # READING: `_rf` without clip_ppo = the unclipped RPG-REINFORCE loss (paper Table 2 /
                # App. F), with beta active (the authors' in-reward 1e-4 length penalty is not reproduced).
                clip = False
                irregular = "_rf without clip_ppo: unclipped RPG-REINFORCE (rpg.loss.clip=false)"
        else:
            form = "differentiable"

    if model_tag == "4b":
        tok = 2 * (length + length)  # READING: packing budget = 2 full-length sequences per GPU micro-batch
    return Variant(
        name=name, algo=algo, model_tag=model_tag, model=MODELS[model_tag], context=context,
        loss=loss, divergence=divergence, form=form, clip=clip, eps_low=eps_low, eps_high=eps_high,
        clip_c=paper["clip_ratio_c"], beta=beta, kl_type=kl_type, adv_estimator=adv, norm_adv_by_std=norm_std, lr=lr,
        optimizer=optimizer, reference=reference, filtering=filtering, overlong=overlong,
        max_prompt_length=length, max_response_length=length, max_tokens_per_gpu=tok,
        thinking=False if model_tag == "4b" else None,
        val_sets=VAL_SETS_4K if (model_tag == "4b" and context == "4k") else VAL_SETS_MAIN,
        irregular=irregular,
    )


def _b(x: bool) -> str:
    return "True" if x else "False"


PAPER_SETUP = "+paper=default"  # recipe/rpg/config/paper/default.yaml: the setup every paper run shares


def to_overrides(v: Variant) -> list[str]:
    """Hydra overrides for the variant: the paper's shared setup (``PAPER_SETUP``), then what the name
    changes, minus any value the recipe's YAML already states (``without_defaults``).

    Paths, cluster size, loggers and names are the launch's (``rpg.launch.environment``).
    """
    return [PAPER_SETUP, *without_defaults(name_settings(v))]


def name_settings(v: Variant) -> list[str]:
    """Every setting the name decides, as Hydra overrides on the paper setup (values the recipe's YAML
    already holds included): what ``to_overrides`` reduces and ``rpg.launch.experiments`` writes out."""
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    P, L, T = v.max_prompt_length, v.max_response_length, v.max_tokens_per_gpu
    ov = [
        # context: prompt + response lengths and the token budgets that follow from them
        f"data.max_prompt_length={P}", f"data.max_response_length={L}", f"{a}.ppo_max_token_len_per_gpu={T}",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={T}", f"{r}.log_prob_max_token_len_per_gpu={T}",
        f"{r}.max_num_batched_tokens={P + L}",
        # clip ratios, c and lr of the method
        f"{a}.clip_ratio_low={v.eps_low}", f"{a}.clip_ratio_high={v.eps_high}", f"{a}.clip_ratio_c={v.clip_c}",
        f"{a}.optim.lr={v.lr}",
        # reward shaping, advantage, dynamic sampling (verl v1 refills dropped groups)
        f"reward.reward_kwargs.overlong_buffer_cfg.enable={_b(v.overlong)}",
        f"reward.reward_kwargs.overlong_buffer_cfg.len={v.overlong_buffer}",
        f"algorithm.adv_estimator={v.adv_estimator}", f"algorithm.norm_adv_by_std_in_grpo={_b(v.norm_adv_by_std)}",
        f"algorithm.filter_groups.enable={_b(v.filtering)}",
        # rpg block
        f"rpg.loss.name={v.loss}", f"rpg.reference.mode={v.reference_mode}", f"rpg.optimizer={v.optimizer}",
    ]
    if v.thinking is not None:
        ov.append(f"+data.apply_chat_template_kwargs.enable_thinking={_b(v.thinking)}")
    if v.loss == "rpg":
        ov += [
            f"rpg.loss.divergence={v.divergence or 'ufkl'}",  # beta = 0: the divergence is unused
            f"rpg.loss.form={v.form}", f"rpg.loss.beta={v.beta}", f"rpg.loss.clip={_b(v.clip)}",
            f"{a}.use_kl_loss=False",
        ]
    elif v.kl_type is None:
        ov.append(f"{a}.use_kl_loss=False")
    else:
        ov += [f"{a}.use_kl_loss=True", f"{a}.kl_loss_type={v.kl_type}", f"{a}.kl_loss_coef={v.beta}"]
    return ov + memory_overrides(v)


def without_defaults(overrides: list[str]) -> list[str]:
    """``overrides`` minus those that restate a value of the recipe's YAML (rpg_trainer.yaml and the paper
    setup): same key, same value and type (parsed by Hydra's override parser), so a script's overrides
    say only what its name changes. Keys the YAML does not hold (verl's own defaults) are kept."""
    from omegaconf import OmegaConf

    from rpg.override_lists import parse_overrides

    yaml = recipe_yaml()
    missing = object()
    kept = []
    for parsed in parse_overrides(overrides):
        current = OmegaConf.select(yaml, parsed.key, default=missing)
        if current is missing or parsed.kind != "CHANGE" or type(current) is not type(parsed.value) \
                or current != parsed.value:
            kept.append(parsed.text)
    return kept


def paper_setup() -> dict:
    """The paper's values the variant grammar starts from, as the recipe's YAML states them (one place):
    clip ratios (eps_low, eps_high), the dual-clip c and the learning rate."""
    from omegaconf import OmegaConf

    actor = recipe_yaml().actor_rollout_ref.actor
    return {"clip_ratio_low": actor.clip_ratio_low, "clip_ratio_high": actor.clip_ratio_high,
            "clip_ratio_c": actor.clip_ratio_c, "lr": OmegaConf.select(actor, "optim.lr")}


# ----------------------------------------------------------------------------- memory (launch settings only)

# vLLM's share of each GPU while it generates (verl: rollout.gpu_memory_utilization, a fraction of the
# GPU's total memory for vLLM's weights + KV cache). Memory only, never the math. verl 0.9.1 keeps the
# actor's fp32 parameter shard and AdamW states on the GPU while vLLM is awake, so the authors' 0.85
# leaves no room on 8 x 80 GB (Qwen2.5-7B: ~80 GiB of 79.6). These leave >= 10% of an 80 GB GPU free
# in every phase (a script's --describe; rpg.memory; docs/memory.md).
GPU_MEMORY_UTILIZATION = {"7b": 0.6, "7binstruct": 0.6, "4b": 0.7}


def memory_overrides(v: Variant) -> list[str]:
    """Memory-only Hydra overrides of the variant's model family (a user override still wins)."""
    return [f"actor_rollout_ref.rollout.gpu_memory_utilization={GPU_MEMORY_UTILIZATION[v.model_tag]}"]


# ----------------------------------------------------------------------------- paper map

_BASE_ROWS = {"grpo": "GRPO", "dapo": "DAPO", "rfpp": "REINFORCE++", "rfppb": "REINFORCE++-Baseline"}
_TABLES = {"8k": ("Table 3",), "4k": ("Table 5", "Table 7"), "2k": ("Table 6",)}


def paper_row(v: Variant) -> str:
    """The paper's method label (e.g. RPG-REINFORCE-UFKL); "RPG (no KL)" for the no-KL ablation."""
    if v.algo in _BASE_ROWS:
        return _BASE_ROWS[v.algo]
    if v.divergence is None:
        return "RPG (no KL)"
    return f"RPG-{'REINFORCE-' if v.form == 'reinforce' else ''}{v.divergence.upper()}"


def _standard(v: Variant) -> bool:
    """The paper's main-table settings: AdamW, beta 1e-4 (GRPO: its own), iterative reference (GRPO:
    fixed), RPG-REINFORCE with RPG-Style Clip (0.2, 0.28); no-KL RPG is not a paper row."""
    if v.optimizer != "adamw":
        return False
    if v.algo == "grpo":
        return True
    if v.algo == "dapo":
        return True
    if v.reference != "sampler" or v.beta != 1e-4:
        return False
    return v.form != "reinforce" or (v.clip and (v.eps_low, v.eps_high) == (0.2, 0.28))


def paper_refs(v: Variant) -> tuple[str, ...]:
    """Where the paper reports this run ("Table 8", "Fig. 9 (noiterref)", ...); () = not in the paper."""
    refs: list[str] = []
    std = _standard(v)
    if v.model_tag == "7binstruct" and std:
        refs.append("Table 8")
    if v.model_tag != "4b":
        return tuple(refs)
    rows = v.algo in ("grpo", "dapo") or v.divergence in ("ufkl", "urkl") or (
        v.algo in ("rfpp", "rfppb") and v.context == "4k")
    if std and rows:
        refs += _TABLES[v.context]
    rf = v.algo == "rpg" and v.form == "reinforce" and v.clip and v.optimizer == "adamw"
    eps = (v.eps_low, v.eps_high)
    if rf and v.context == "2k" and v.divergence in ("ufkl", "urkl") and v.beta == 1e-4 and v.reference == "sampler" \
            and eps in ((0.1, 0.1), (0.2, 0.28)):
        refs.append(f"Fig. 8 (clip ({v.eps_low:g}, {v.eps_high:g}))")
    if rf and v.context == "4k" and v.divergence == "ufkl" and eps == (0.2, 0.28):
        if v.reference == "fixed" and v.beta == 1e-3:  # legend (page 30): RPG-REINFORCE-UFKL-1e-3-noiterref
            refs.append("Fig. 9 (noiterref)")
        elif v.reference == "sampler" and v.beta in (1e-3, 1e-4):
            refs.append(f"Fig. 9 (beta {v.beta:g})")
    return tuple(refs)


# ----------------------------------------------------------------------------- the experiment files, checked

TRAIN_DATA = f"data/{TRAIN_SET}.parquet"  # under the checkout (the launch: DATA_DIR replaces the folder)
DEFAULTS = [{f"/{PAPER_SETUP.removeprefix('+').split('=')[0]}": PAPER_SETUP.split("=")[1]}, "_self_"]  # paper setup


def experiment_path(name: str) -> Path:
    return CHECKOUT / EXPERIMENT_DIR / f"{name}.yaml"


def experiment_settings(v: Variant) -> list[tuple[str, object]]:
    """(key, value) of every setting the run's file states, in order: model, data, the name's settings, the names."""
    from rpg.override_lists import parse_overrides

    files = [("actor_rollout_ref.model.path", v.model), ("data.train_files", TRAIN_DATA),
             ("data.val_files", [f"data/{s}.parquet" for s in v.val_sets])]
    names = [("trainer.project_name", "rpg"), ("trainer.experiment_name", v.name)]
    return [*files, *((p.key, p.value) for p in parse_overrides(name_settings(v))), *names]


def _same(a: object, b: object) -> bool:
    """Equal as YAML means them: 1 is not 1.0 or true, a list equals item for item."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def disagreements(path: Path) -> list[str]:
    """One line per way the experiment file at ``path`` disagrees with what its name (the file's stem) says: a
    setting the name decides that the file leaves out or gives another value, a setting the name does not decide,
    its defaults (the paper setup) and its first comment line (the paper row the launch header shows). [] for a
    file whose name is not a run name of the grammar: a run of the user's, whose file alone declares it."""
    from omegaconf import OmegaConf

    from rpg.launch.experiments import ExperimentError, load

    try:
        v = parse(path.stem)
    except VariantNameError:
        return []
    shown = path.relative_to(CHECKOUT) if path.is_relative_to(CHECKOUT) else path
    try:
        exp = load(path, path.stem)
        defaults = OmegaConf.to_container(OmegaConf.load(path)).get("defaults")
    except ExperimentError as e:
        return [f"{shown}: {e}"]
    said = dict(experiment_settings(v))
    lines = []
    for key, value in said.items():
        if key not in exp.settings:
            lines.append(f"{shown}: {key} is not set; its name says {yaml_value(value)}")
        elif not _same(exp.settings[key], value):
            lines.append(f"{shown}: {key}={yaml_value(exp.settings[key])}; its name says {yaml_value(value)}")
    lines += [f"{shown}: {key} is set, which its name does not decide" for key in exp.settings if key not in said]
    if defaults != DEFAULTS:
        lines.append(f"{shown}: defaults {defaults}; a paper run's are {DEFAULTS} (the paper setup)")
    row = f"{v.name}: {paper_row(v)} [{', '.join(paper_refs(v)) or 'not in the paper'}]"
    if exp.description[:1] != (row,):
        lines.append(f"{shown}: its first comment line is {(exp.description or ('',))[0]!r}; its name says {row!r}")
    return lines


def check(paths: list[Path] | None = None) -> list[str]:
    """``disagreements`` of each file of ``paths`` (default: every file of the recipe's experiment folder, and one line
    per paper script without its file)."""
    if paths is None:
        folder = CHECKOUT / EXPERIMENT_DIR
        paths = sorted(folder.glob("*.yaml"))
        missing = [f"{EXPERIMENT_DIR / n}.yaml: no such file; the paper script {n}.sh runs it" for n in known_names()
                   if not experiment_path(n).is_file()]
        return missing + [line for p in paths for line in disagreements(p)]
    return [line for p in paths for line in disagreements(p)]


def list_table() -> str:
    """Markdown table of the shipped scripts (docs/launch-scripts.md, section 8)."""
    rows = ["| script | paper row | reported in | divergence / form | clip (eps) | beta | lr | optimizer | model | "
            "reference |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in known_names():
        v = parse(name)
        form = v.form if v.divergence is None else f"{v.divergence} / {v.form}"
        clip = f"{v.eps_low:g}/{v.eps_high:g}" if v.clip else "none"
        rows.append(f"| `{name}` | {paper_row(v)} | {', '.join(paper_refs(v)) or '-'} | {form} | {clip} | {v.beta:g} | "
                    f"{v.lr:g} | {v.optimizer} | {v.model.split('/')[-1]} | {v.reference} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        lines = check([Path(a) for a in argv[1:]] or None)
        for line in lines:
            print(f"scripts/experiments.py: {line}", file=sys.stderr)
        return 1 if lines else 0
    if argv == ["--table"]:
        print(list_table())
        return 0
    print("usage: python scripts/experiments.py --check [FILE.yaml ...] | --table", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
