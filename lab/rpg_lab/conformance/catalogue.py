"""What the report scores: each framework (its pinned version, how it is installed, the environment its probe runs in)
and each of its KL settings (the code path called, as a loss or in the reward, the default, the identity that
explains its gradient with one token). The identities' labels are docs/math.md's (T1-T30); "the reward" means the
KL penalty subtracted from the token rewards on the sampler's log-probs, its gradient through the PPO ratio.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Framework:
    name: str
    version: str  # the released version pinned by lab/scripts/setup_conformance.sh
    probe: str  # rpg_lab.conformance.probes.<probe>
    env: str  # "recipe": this environment, in-process; else a folder of the set-up (``environments``)
    install: str  # how it is installed, one line for the CSV and the report
    precision: str  # the dtype its KL code computes in, from float64 inputs
    by_default: str  # whether a KL term is on by default, and which


@dataclass(frozen=True)
class Claim:
    """What a framework's documentation says a KL setting's term is, where it says so; the report says whether it
    is, from the rows of ``settings``."""

    framework: str
    says: str
    settings: tuple[str, ...]


@dataclass(frozen=True)
class Setting:
    framework: str
    key: str  # the probe's SETTINGS key
    label: str  # what a user sets
    form: str  # "loss" or "reward"
    call: str  # the function and the code path that calls it
    why: str  # the identity behind the one-token gradient
    default: bool = False
    target: str = "rkl"  # the divergence it is meant to regularise: the frameworks' reverse KL, RPG's own


FRAMEWORKS = {f.name: f for f in (
    Framework("RPG", "0.1.0", "rpg_kl", "recipe", "this repository (rpg-verl), the recipe's environment", "float64",
              "RPG-REINFORCE-UFKL with RPG-Style Clip, anchored at the sampler (rpg.reference.mode=sampler); scored "
              "here with a fixed reference (rpg.reference.mode=fixed), the three-policy form"),
    Framework("verl", "0.9.1", "verl_kl", "recipe", "the recipe's dependency, verl==0.9.1 from PyPI", "float64",
              "no KL term by default (actor.use_kl_loss and algorithm.use_kl_in_reward are false); "
              "kl_loss_type=low_var_kl when the loss is on, kl_penalty=kl when the reward's is"),
    Framework("TRL", "1.16.0", "trl_kl", "trl",
              "trl==1.16.0 --no-deps into a folder of its own; every requirement of it is met by the recipe's "
              "environment (checked at set-up: pip would install trl alone)", "float32",
              "no KL term by default (beta=0.0); with beta > 0 the k3 term times the importance ratio"),
    Framework("OpenRLHF", "0.11.2", "openrlhf_kl", "openrlhf",
              "openrlhf==0.11.2 and deepspeed==0.19.6 (imported at the module's top; with einops, hjson, ninja, "
              "py-cpuinfo) --no-deps into a folder of their own, over the recipe's torch 2.13.0 and transformers "
              "5.10.4 (openrlhf pins 5.15.0, ray 2.55.0 and flash-attn, which has no CPU build); "
              "openrlhf/models/utils.py executed from its file, the package's __init__ importing flash_attn",
              "float32", "k1 in the reward (--algo.kl.init_coef 0.01, no --algo.kl.use_loss)"),
    Framework("SkyRL", "0.4.0", "skyrl_kl", "py312",
              "skyrl==0.4.0 --no-deps in a Python 3.12 environment (it asks Python >= 3.12) with torch 2.10.0 and the "
              "packages its KL module imports (ray, loguru, jaxtyping, omegaconf, pyyaml, cloudpathlib, pydantic, "
              "skyrl-gym, numpy); its other requirements (transformers, datasets, peft, ...) are not imported",
              "float64", "k3 as a loss (algorithm.use_kl_loss=true, kl_loss_coef 0.001)"),
    Framework("AReaL", "1.0.4", "areal_kl", "py312",
              "areal==1.0.4 --no-deps in the Python 3.12 environment with torch 2.10.0 (it asks torch < 2.11) and the "
              "packages its KL module imports (hydra-core 1.4.0.dev1, omegaconf 2.4.0.dev2, transformers 5.3.0, "
              "torchdata, einops, numba, ... as it pins them); its agent stack (openhands, litellm, langchain, ...) "
              "is not imported", "float32", "k1 in the reward (actor.kl_ctl 0.1, actor.kl_estimator k1)"),
)}

CLAIMS = (
    Claim("verl", "core_algos.kl_penalty's docstring: a '+' suffix (kl+, low_var_kl+) applies 'a straight through "
          "trick' binding k2's gradient 'for unbiased KL gradient estimation'", ("loss:kl+", "loss:low_var_kl+")),
    Claim("verl", "actor.yaml and ppo_trainer.yaml list 'full' among the KL types", ("loss:full", "reward:full")),
    Claim("TRL", "GRPOConfig.use_bias_correction_kl (default True): the KL term times the importance ratio 'so that "
          "the KL gradient becomes the unbiased reverse-KL gradient'; 'The unbiased reverse-KL property holds for "
          "importance_sampling_level=\"token\"'", ("loss:k3",)),
    Claim("OpenRLHF", "compute_approx_kl's docstring and --algo.kl.unbiased_gradient: 'backprop the true reverse-KL "
          "gradient E_{y~π_θ_old}[w · k1 · ∇log π_θ]', 'k1/k2/k3 then share the same (correct) gradient'",
          ("loss:k1-unbiased", "loss:k2-unbiased", "loss:k3-unbiased")),
)

K1 = "E_μ[∇(l − l_ref)] = E_μ[∇l] = −∇KL(μ‖πθ): zero at μ = πθ (T18), no π_ref in it"
ABS = "E_μ[sign(l − l_ref)·∇l]: the gradient of no divergence"
K2 = ("E_μ[∇½(l − l_ref)²] = E_μ[(l − l_ref)·∇l]: the reverse KL's at μ = πθ (T18); off-policy without the "
      "weight πθ/μ (T13)")
K3 = ("E_μ[∇k3(π_ref/πθ)] = E_μ[(1 − π_ref/πθ)·∇l]: the forward KL's at μ = πθ (T18), neither off-policy (T15); "
      "verl's and SkyRL's clamp at 10 zeroes a token's gradient above it")
STRAIGHT = "k2's gradient straight through (the value is k1's or k3's): as k2"
K3_W = "E_μ[∇(w·k3(π_ref/πθ))] = E_μ[w·(l − l_ref)·∇l] = ∇KL(πθ‖π_ref) at every μ, w = πθ/μ (T13, T14)"
SG_W = ("straight through: SG(w)·k2 with w = πθ/μ clamped at 10, gradient E_μ[w·(l − l_ref)·∇l] = "
        "∇KL(πθ‖π_ref) wherever no w exceeds 10 (T14's gradient)")
REWARD_K1 = ("E_μ[w·(l_μ − l_ref)·∇l] = E_πθ[log(μ/π_ref)·∇log πθ]: the reverse KL's at μ = πθ (its score-function "
             "form, T8); off-policy the penalty is μ's log-ratio, not πθ's")
REWARD_OTHER = "E_πθ[kl(μ, π_ref)·∇log πθ] with kl ≠ log(πθ/π_ref): no divergence's gradient, on-policy or off"
RPG_WHY = "T6, T9 with three policies (T5b): the surrogate's gradient is −∇J of its divergence at every θ"

_VERL_LOSS = "verl.workers.utils.losses.ppo_loss: agg_loss(kl_penalty(log_prob, ref_log_prob, actor.kl_loss_type))"
_VERL_REWARD = "ray_trainer.apply_kl_penalty: token_level_scores − β·kl_penalty(old_log_probs, ref_log_prob, kl_penalty)"
_ORL_LOSS = "ActorPPOTrainer: compute_approx_kl(action_log_probs, base_action_log_probs, log_probs_old=old_action_log_probs"
_SKY_LOSS = "policy worker: compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator_type="


def _verl(key, label, why, default=False):
    form, estimator = key.split(":")
    where = (f"actor.use_kl_loss=True actor.kl_loss_type={estimator}; {_VERL_LOSS}" if form == "loss" else
             f"algorithm.use_kl_in_reward=True algorithm.kl_penalty={estimator}; {_VERL_REWARD}")
    return Setting("verl", key, label, form, f"core_algos.kl_penalty via {where}", why, default)


def _reward(framework, key, label, call, default=False):
    return Setting(framework, key, label, "reward", call, REWARD_K1 if key.endswith("k1") else REWARD_OTHER,
                   default)


SETTINGS = (
    *[Setting("RPG", f"{form}:{d}", f"rpg.loss.form={form} rpg.loss.divergence={d}, fixed reference", "loss",
              f"rpg.math.fused.rpg_policy_loss(..., ref_log_prob=π_ref), advantage 0, β = 1", RPG_WHY,
              target=d)
      for form in ("differentiable", "reinforce") for d in ("fkl", "ufkl", "rkl", "urkl")],
    Setting("RPG", "reinforce-clip:ufkl", "the recipe's default: rpg.loss.form=reinforce divergence=ufkl clip=true "
            "(ε 0.2/0.28, c 10), fixed reference", "loss", "rpg.math.fused.rpg_policy_loss(..., ref_log_prob=π_ref), "
            "advantage 0, β = 1", "RPG-Style Clip (Eq. (4.1)): inside the trust region (every w in (0.8, 1.28)) the "
            "unclipped loss's gradient (T21); a clipped token has none (T23)", default=True, target="ufkl"),
    Setting("RPG", "grpo_corrected", "rpg.loss.name=grpo_corrected", "loss",
            "rpg.math.fused.grpo_corrected_kl(log_prob, old_log_prob, ref_log_prob)", K3_W),
    _verl("loss:kl", "kl_loss_type=kl (k1)", K1),
    _verl("loss:abs", "kl_loss_type=abs", ABS),
    _verl("loss:mse", "kl_loss_type=mse (k2)", K2),
    _verl("loss:low_var_kl", "kl_loss_type=low_var_kl (k3)", K3, default=True),
    _verl("loss:kl+", "kl_loss_type=kl+ (k1, k2's gradient)", STRAIGHT),
    _verl("loss:low_var_kl+", "kl_loss_type=low_var_kl+ (k3, k2's gradient)", STRAIGHT),
    _verl("loss:full", "kl_loss_type=full", "—"),
    _verl("reward:kl", "kl_penalty=kl (k1)", REWARD_K1, default=True),
    _verl("reward:abs", "kl_penalty=abs", REWARD_OTHER),
    _verl("reward:mse", "kl_penalty=mse (k2)", REWARD_OTHER),
    _verl("reward:low_var_kl", "kl_penalty=low_var_kl (k3)", REWARD_OTHER),
    _verl("reward:full", "kl_penalty=full", "—"),
    Setting("TRL", "loss:k3", "beta>0 (use_bias_correction_kl=True, importance_sampling_level=token)", "loss",
            "GRPOTrainer.compute_loss -> _compute_loss: per_token_kl·coef_1, loss_type=dapo", K3_W, default=True),
    Setting("TRL", "loss:k3-no-is", "beta>0 use_bias_correction_kl=False", "loss",
            "GRPOTrainer.compute_loss -> _compute_loss: per_token_kl, loss_type=dapo", K3),
    Setting("TRL", "loss:k3-is-sequence", "beta>0 importance_sampling_level=sequence", "loss",
            "GRPOTrainer.compute_loss -> _compute_loss: per_token_kl·exp(mean_t log ratio), loss_type=dapo",
            K3_W + "; one token: the sequence ratio is the token's"),
    *[Setting("OpenRLHF", f"loss:{e}", f"--algo.kl.use_loss --algo.kl.estimator {e}", "loss",
              f"models.utils.compute_approx_kl via {_ORL_LOSS}, kl_estimator={e}, unbiased_gradient=False)", why)
      for e, why in (("k1", K1), ("k2", K2), ("k3", K3.split("; verl")[0]))],
    *[Setting("OpenRLHF", f"loss:{e}-unbiased", f"--algo.kl.use_loss --algo.kl.estimator {e} "
              "--algo.kl.unbiased_gradient", "loss",
              f"models.utils.compute_approx_kl via {_ORL_LOSS}, kl_estimator={e}, unbiased_gradient=True)", SG_W)
      for e in ("k1", "k2", "k3")],
    *[_reward("OpenRLHF", f"reward:{e}", f"--algo.kl.estimator {e}" + (" (the default: KL in the reward)" if
              e == "k1" else ""), "models.utils.compute_approx_kl(action_log_probs, base_action_log_probs, "
              f"kl_estimator={e}) in RemoteExperienceMaker, then compute_reward: r − kl_coef·kl", default=e == "k1")
      for e in ("k1", "k2", "k3")],
    *[Setting("SkyRL", f"loss:{e}", f"algorithm.use_kl_loss=true algorithm.kl_estimator_type={e}", "loss",
              f"ppo_utils.compute_approx_kl via {_SKY_LOSS}{e})", why, default=e == "k3")
      for e, why in (("k1", K1), ("abs", ABS), ("k2", K2), ("k3", K3))],
    *[_reward("SkyRL", f"reward:{e}", f"algorithm.use_kl_in_reward=true algorithm.kl_estimator_type={e}",
              "ppo_utils.compute_approx_kl(action_log_probs, base_action_log_probs, ...) in "
              "RayPPOTrainer.apply_reward_kl_penalty: rewards − kl·kl_loss_coef")
      for e in ("k1", "abs", "k2", "k3")],
    *[_reward("AReaL", f"reward:{e}", f"actor.kl_estimator={e}", "utils.data.KLEstimator(kl_estimator)(old_logp, "
              "ref_logp) in PPOActor.compute_advantages: rewards = −kl_ctl·kl, then GAE", default=e == "k1")
      for e in ("k1", "k2", "k3")],
)
