"""RPG policy losses: exact, off-policy-correct surrogates for KL-regularized policy gradients.

Public API (imports only torch):

    cfg = RPGLossConfig(divergence="ufkl", form="reinforce", beta=1e-4, clip=True)
    loss_mat, metrics = rpg_token_loss(log_prob, old_log_prob, advantages, response_mask, cfg)
    loss, metrics = rpg_policy_loss(log_prob, old_log_prob, advantages, response_mask, cfg)
    kl_tok = grpo_corrected_kl(log_prob, old_log_prob, ref_log_prob)

All tensors are [batch, response_len]. ``ref_log_prob=None`` makes the KL anchor the sampling
policy (the paper's iterative reference); a given ``ref_log_prob`` uses the exact three-policy
weights of spec §2.7, so a fixed or periodically reset reference stays gradient-correct.

Per-token losses (w = pi_theta/pi_old, A = advantage, C_D and kappa_D from ``rpg.divergences``):

* form="reinforce", clip=False (Table 2 / App. F):   loss_t = -SG(w*A + C_D(w)) * l_t
  gradient: -(w*A + C_D(w)) * grad l_t, whose expectation under pi_old is exactly -grad J.
* form="reinforce", clip=True (RPG-Style Clip, spec §4.3, Algorithm 2 with Remark F.2):
  w_bar = clip(w, 1-eps1, 1+eps2), C = C_D(w_bar), A' = A + C/w, W = w*A + C.
  Active iff (A' >= 0 and w < 1+eps2) or (A' < 0 and 1-eps1 < w < c):
  loss_t = -W * l_t there; elsewhere Algorithm 2's constant value (no gradient).
  Gradient-identical to dual-clip PPO with advantage SG(A') (spec §4.3, tested).
* form="differentiable", clip=False (Tables 1/4):     loss_t = -w*A + beta*kappa_D(w)
  gradient: identical to the unclipped REINFORCE one, token by token.
* form="differentiable", clip=True, fd_clip="reward" (spec §4.4 default):
  loss_t = DualClip(w, A) + beta*kappa_D(w)   (ratio clip on the reward part; KL unclipped)
* form="differentiable", fd_clip="algorithm1" (paper-literal Algorithm 1, rkl/urkl only):
  loss_t = DualClip(w, A_hat(theta)), A_hat = A - beta*phi_D(rho), gradient through both.
  Exact only in expectation (per token it adds a zero-mean +beta*w*grad l; spec T25).

Numerical guard (explicit, documented, value-only): log-ratios are clamped to
+-``log_ratio_guard`` (default 60, i.e. w in [1e-26, 1e26]) with a straight-through estimator,
so values stay finite in float32/bf16 while the gradient keeps its direction. It never acts in
sane training; ``rpg/log_ratio_guard_frac`` reports how often it did. ``kl_clamp`` (off by
default) is a value-only guard on kappa for the differentiable form; it never zeroes gradients
(unlike the authors' clamp, spec D6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rpg.divergences import DIVERGENCES, kl_phi, kl_surrogate, kl_weight

FORMS = ("reinforce", "differentiable")
BRANCH_RULES = ("regularized", "raw")
FD_CLIP_MODES = ("reward", "algorithm1")
AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _require(ok: bool, field: str, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"RPGLossConfig.{field}={value!r} is invalid: expected {allowed}")


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


@dataclass(frozen=True)
class RPGLossConfig:
    """Settings of one RPG loss. Validated on construction (ValueError names the field)."""

    divergence: str = "ufkl"
    form: str = "reinforce"
    beta: float = 1e-4
    clip: bool = True
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: float = 10.0
    loss_agg_mode: str = "token-mean"
    branch_on: str = "regularized"
    fd_clip: str = "reward"
    kl_clamp: float | None = None
    log_ratio_guard: float = 60.0

    def __post_init__(self) -> None:
        _require(self.divergence in DIVERGENCES, "divergence", self.divergence, f"one of {DIVERGENCES}")
        _require(self.form in FORMS, "form", self.form, f"one of {FORMS}")
        _require(_is_real(self.beta) and self.beta >= 0, "beta", self.beta, "a finite number >= 0")
        _require(isinstance(self.clip, bool), "clip", self.clip, "True or False")
        _require(_is_real(self.clip_ratio_low) and 0 < self.clip_ratio_low < 1, "clip_ratio_low", self.clip_ratio_low, "a number in (0, 1)")
        _require(_is_real(self.clip_ratio_high) and self.clip_ratio_high > 0, "clip_ratio_high", self.clip_ratio_high, "a number > 0")
        _require(_is_real(self.clip_ratio_c) and self.clip_ratio_c > 1, "clip_ratio_c", self.clip_ratio_c, "a number > 1 (dual-clip threshold c)")
        _require(self.loss_agg_mode in AGG_MODES, "loss_agg_mode", self.loss_agg_mode, f"one of {AGG_MODES}")
        _require(self.branch_on in BRANCH_RULES, "branch_on", self.branch_on, f"one of {BRANCH_RULES}")
        _require(self.fd_clip in FD_CLIP_MODES, "fd_clip", self.fd_clip, f"one of {FD_CLIP_MODES}")
        if self.form == "differentiable" and self.fd_clip == "algorithm1":
            _require(self.divergence in ("rkl", "urkl"), "divergence", self.divergence,
                     "'rkl' or 'urkl' with fd_clip='algorithm1' (Algorithm 1 defines A-hat only for reverse KL)")
        _require(self.kl_clamp is None or (_is_real(self.kl_clamp) and self.kl_clamp > 0), "kl_clamp", self.kl_clamp, "None or a number > 0")
        if self.kl_clamp is not None:
            _require(self.form == "differentiable", "kl_clamp", self.kl_clamp,
                     "None with form='reinforce' (the KL enters through the weight; a clamp would change the gradient)")
        _require(_is_real(self.log_ratio_guard) and self.log_ratio_guard > 0, "log_ratio_guard", self.log_ratio_guard, "a number > 0")


# --------------------------------------------------------------------------- helpers


def _check_inputs(log_prob, old_log_prob, advantages, response_mask, ref_log_prob) -> None:
    named = {"log_prob": log_prob, "old_log_prob": old_log_prob, "advantages": advantages, "response_mask": response_mask}
    if ref_log_prob is not None:
        named["ref_log_prob"] = ref_log_prob
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape [batch, response_len], got {type(t).__name__}")
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob must be 2-D [batch, response_len], got shape {tuple(log_prob.shape)}")
    for name, t in named.items():
        if t.shape != log_prob.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but log_prob has shape {tuple(log_prob.shape)}; they must match")
        if name != "response_mask" and not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


def dual_clip(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, c: float) -> torch.Tensor:
    """Dual-clip PPO loss (Ye et al.; spec §4.1), verl's ``vanilla`` semantics.

    A >= 0: max(-r*A, -clip(r, 1-eps_low, 1+eps_high)*A)   (gradient iff r < 1+eps_high)
    A <  0: min(that, -c*A)                                 (gradient iff 1-eps_low < r < c)
    """
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    ppo = torch.maximum(unclipped, clipped)
    return torch.where(adv < 0, torch.minimum(ppo, -adv * c), ppo)


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, loss_scale_factor: float | None = None) -> torch.Tensor:
    """Aggregate a per-token loss like verl's ``agg_loss`` with dp_size=1 (local batch = global batch).

    token-mean: sum(loss*m)/sum(m); token-sum: sum(loss*m); seq-mean-token-mean: mean over
    non-empty sequences of the per-sequence token mean; seq-mean-token-sum(-norm): mean over
    non-empty sequences of the per-sequence token sum (divided by loss_scale_factor, default T).
    Differences from verl, on purpose: an all-masked batch gives 0 (verl: 0/0 = NaN), and float
    masks are weights (used by the exact-enumeration tests). Inside verl, the glue calls verl's own
    ``agg_loss`` with ``global_batch_info`` instead.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"loss_agg_mode={mode!r} is invalid: expected one of {AGG_MODES}")
    mask = mask.to(loss_mat.dtype)
    masked = torch.where(mask != 0, loss_mat * mask, torch.zeros_like(loss_mat))
    if mode == "token-sum":
        return masked.sum()
    if mode == "token-mean":
        denom = mask.sum()
        return masked.sum() / torch.where(denom > 0, denom, torch.ones_like(denom))
    tokens = mask.sum(dim=-1)
    seq_ok = (tokens > 0).to(loss_mat.dtype)
    n_seq = seq_ok.sum().clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(dim=-1) / torch.where(tokens > 0, tokens, torch.ones_like(tokens))
        return (per_seq * seq_ok).sum() / n_seq
    loss = (masked.sum(dim=-1) * seq_ok).sum() / n_seq
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mat.shape[-1])
    return loss


# --------------------------------------------------------------------------- the two forms


class _StraightThroughClamp(torch.autograd.Function):
    """Value clamped to [-bound, bound]; gradient of the identity (a value-only guard)."""

    @staticmethod
    def forward(ctx, x, bound):
        return x.clamp(-bound, bound)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def value_clamp(x: torch.Tensor, bound: float) -> torch.Tensor:
    """Value-only guard: x clamped to [-bound, bound] in value, gradient of the identity."""
    return _StraightThroughClamp.apply(x, bound)


# torch.where / masked_fill on random masks are ~15x slower than a multiply on CPU (measured with
# benchmarks/bench_losses.py), so gates are applied arithmetically: lerp(a, b, g) = a + g*(b - a)
# with a 0/1 float gate g, whose gradient w.r.t. b is g (exactly "where", without NaN pitfalls).


def _clip_gate(positive: torch.Tensor, w: torch.Tensor, cfg: RPGLossConfig):
    """Dual-clip gate for a fixed branch (spec §4.1, boundaries of Algorithm 2).

    Returns (active, dual, x_clipped): the gradient flows through the ratio iff
    (positive and w < 1+eps_high) or (not positive and 1-eps_low < w < c); ``dual`` marks the
    negative-branch tokens capped at c; x_clipped is the ratio's constant value where it is
    clipped (clip(w, 1-eps_low, 1+eps_high), or c under the dual clip). Dual-clip PPO is then
    exactly -A * lerp(x_clipped, w, active).
    """
    lo, hi, c = 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high, cfg.clip_ratio_c
    below_c = w < c
    active = (positive & (w < hi)) | (~positive & (w > lo) & below_c)
    dual = ~(positive | below_c)
    w_bar = w.clamp(lo, hi)
    x_clipped = w_bar + dual.to(w.dtype) * (c - w_bar)
    return active, dual, x_clipped


def _reinforce(l, w, log_w, adv, r_ref, log_r_ref, cfg: RPGLossConfig):
    """REINFORCE-style loss: everything but l is a constant. Returns (loss, W, regions, None).

    With clipping, the value follows Algorithm 2 literally: -(A*x + C) * l with x = w where the
    token is active, x = w_bar = clip(w) where the ratio clip binds, x = c where the dual clip
    binds; the gradient flows through l only on active tokens.
    """
    with torch.no_grad():
        if cfg.clip:
            lo, hi = 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high
            w_kl = w.clamp(lo, hi)
            log_w_kl = log_w.clamp(math.log(lo), math.log(hi))  # = log(w_bar), without a log pass
        else:
            w_kl, log_w_kl = w, log_w
        c_kl = kl_weight(cfg.divergence, cfg.beta, w_kl, log_w_kl, r_ref, log_r_ref)
        weight = torch.addcmul(c_kl, w, adv)  # W = w*A + C = w*A', A' = A + C/w (unclipped w, Algorithm 2)
    if not cfg.clip:
        return l * -weight, weight, None, None
    with torch.no_grad():
        # sign(A') = sign(W) as w > 0; W stays finite where C/w could overflow.
        positive = weight >= 0 if cfg.branch_on == "regularized" else adv > 0
        active, dual, x_clipped = _clip_gate(positive, w, cfg)
        gate = active.to(w.dtype)
        neg_weight = -torch.addcmul(c_kl, torch.lerp(x_clipped, w, gate), adv)
    loss = neg_weight * torch.lerp(l.detach(), l, gate)
    return loss, weight, (positive, active, dual), None


def _differentiable(l, w, log_rho, adv, r_ref, log_r_ref, cfg: RPGLossConfig):
    """Fully differentiable loss. Returns (loss, W = w*A + C(w) of its unclipped gradient, regions, kappa)."""
    kappa = kl_surrogate(cfg.divergence, w, log_rho, r_ref)
    if cfg.kl_clamp is not None:
        kappa = _StraightThroughClamp.apply(kappa, cfg.kl_clamp)
    with torch.no_grad():
        w_const = w.detach()
        weight = torch.addcmul(kl_weight(cfg.divergence, cfg.beta, w_const, log_rho + log_r_ref, r_ref, log_r_ref), w_const, adv)
    a_hat = adv - cfg.beta * kl_phi(cfg.divergence, log_rho) if cfg.fd_clip == "algorithm1" else adv
    regions = None
    ratio = w
    if cfg.clip:  # DualClip(w, A_hat) = -A_hat * lerp(x_clipped, w, active); A_hat may carry a gradient
        positive = a_hat.detach() >= 0
        active, dual, x_clipped = _clip_gate(positive, w_const, cfg)
        ratio = torch.lerp(x_clipped, w, active.to(w.dtype))
        regions = (positive, active, dual)
    if cfg.fd_clip == "algorithm1":
        return -a_hat * ratio, weight, regions, kappa.detach()
    return torch.addcmul(cfg.beta * kappa, adv, ratio, value=-1.0), weight, regions, kappa.detach()


# --------------------------------------------------------------------------- public API


def rpg_token_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: RPGLossConfig,
    ref_log_prob: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token RPG loss matrix [batch, response_len] (0 where masked) and flat float metrics.

    Aggregate it with ``aggregate_loss`` (or verl's ``agg_loss`` inside verl). Computation runs
    in float32 or wider (bf16 inputs are upcast); the gradient flows back to ``log_prob`` only.
    """
    if not isinstance(cfg, RPGLossConfig):
        raise ValueError(f"cfg must be an RPGLossConfig, got {type(cfg).__name__}")
    _check_inputs(log_prob, old_log_prob, advantages, response_mask, ref_log_prob)
    dtype = torch.promote_types(log_prob.dtype, torch.float32)
    l = log_prob.to(dtype)
    l_old = old_log_prob.detach().to(dtype)
    adv = advantages.detach().to(dtype)
    mask = response_mask.detach().to(dtype)
    valid = mask != 0
    valid_f = valid.to(dtype)
    guard = cfg.log_ratio_guard

    if cfg.form == "reinforce":  # the ratio is a constant: plain clamp
        with torch.no_grad():
            log_w_raw = l - l_old
            log_w = log_w_raw.clamp(-guard, guard)
    else:  # the ratio carries the gradient: straight-through clamp
        log_w_raw = l - l_old
        log_w = _StraightThroughClamp.apply(log_w_raw, guard)
    w = torch.exp(log_w)
    if ref_log_prob is None:  # anchor = sampler (iterative reference): rho = w, r_ref = 1
        r_ref, log_r_ref, log_rho = 1.0, 0.0, log_w
    else:  # three-policy weights (spec §2.7); r_ref = a / mu is data
        log_r_ref = (ref_log_prob.detach().to(dtype) - l_old).clamp(-guard, guard)
        r_ref = torch.exp(log_r_ref)
        log_rho = log_w - log_r_ref

    if cfg.form == "reinforce":
        loss, weight, regions, kappa = _reinforce(l, w, log_w, adv, r_ref, log_r_ref, cfg)
    else:
        loss, weight, regions, kappa = _differentiable(l, w, log_rho, adv, r_ref, log_r_ref, cfg)
    loss = loss * valid_f  # masked positions are 0 (like verl's agg_loss, a NaN there would propagate)
    if kappa is None:  # the REINFORCE form never needs kappa itself: compute it for the KL metric
        kappa = kl_surrogate(cfg.divergence, w.detach(), log_rho.detach(), r_ref)
    metrics = _metrics(cfg, mask, valid, valid_f, w.detach(), log_w_raw.detach(), kappa, weight, regions)
    return loss, metrics


def rpg_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: RPGLossConfig,
    ref_log_prob: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar RPG loss (keeps its graph) aggregated with ``cfg.loss_agg_mode``, and metrics."""
    loss_mat, metrics = rpg_token_loss(log_prob, old_log_prob, advantages, response_mask, cfg, ref_log_prob)
    return aggregate_loss(loss_mat, response_mask, cfg.loss_agg_mode), metrics


def grpo_corrected_kl(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, log_ratio_guard: float = 60.0
) -> torch.Tensor:
    """GRPO's KL term with the paper's importance-weight correction (spec §3), per token.

    KL_corr_t = w_t * k3(pi_ref/pi_theta) = exp(l_ref - l_old) + w_t*(l_t - l_ref) - w_t,
    with w_t = exp(l_t - l_old) differentiable (do not detach it). Its gradient
    w_t*(l_t - l_ref)*grad l_t has expectation grad KL(pi_theta||pi_ref) under pi_old at every
    theta; GRPO's unweighted k3 gives the forward-KL gradient instead (tested). Unclamped; the
    log-ratios carry the same straight-through guard as ``rpg_token_loss``.
    """
    _check_inputs(log_prob, old_log_prob, log_prob, torch.ones_like(log_prob), ref_log_prob)
    dtype = torch.promote_types(log_prob.dtype, torch.float32)
    l = log_prob.to(dtype)
    l_old = old_log_prob.detach().to(dtype)
    l_ref = ref_log_prob.detach().to(dtype)
    w = torch.exp(_StraightThroughClamp.apply(l - l_old, log_ratio_guard))
    log_r_ref = (l_ref - l_old).clamp(-log_ratio_guard, log_ratio_guard)
    return kl_surrogate("urkl", w, l - l_ref, torch.exp(log_r_ref))


# --------------------------------------------------------------------------- metrics


METRIC_NAMES = ("ratio_mean", "ratio_max", "ratio_min", "log_ratio_abs_max", "kl_estimate", "reg_adv_mean",
                "reg_adv_abs_max", "clipfrac", "clipfrac_high", "clipfrac_low", "clipfrac_dual", "active_frac",
                "log_ratio_guard_frac")


def _metrics(cfg, mask, valid, valid_f, w, log_w_raw, kappa, weight, regions) -> dict[str, float]:
    """Mask-weighted means and extremes over valid tokens, read back with one host sync.

    Clip fractions count tokens with a non-zero mask (equal to the weighted ones for 0/1 masks).
    A' = W / w is saturated at +-1e30 so that its statistics stay finite for w -> 0.
    """
    with torch.no_grad():
        n_valid = valid.sum()
        n = mask.sum()
        n_safe = torch.where(n > 0, n, torch.ones_like(n))
        count_safe = n_valid.clamp(min=1)
        invalid = 1.0 - valid_f
        a_reg = (weight / w).clamp(-1e30, 1e30)
        stats = [
            n_valid,
            torch.dot(w.flatten(), mask.flatten()) / n_safe,
            torch.dot(kappa.flatten(), mask.flatten()) / n_safe,
            torch.dot(a_reg.flatten(), mask.flatten()) / n_safe,
            torch.add(log_w_raw, invalid, alpha=-1e30).amax(),
            torch.add(log_w_raw, invalid, alpha=1e30).amin(),
            torch.add(a_reg.abs(), invalid, alpha=-1e30).amax(),
        ]
        if regions is not None:
            positive, active, dual = regions
            inactive = ~active & valid
            stats += [(inactive & positive).sum() / count_safe, (inactive & ~positive & ~dual).sum() / count_safe,
                      (inactive & dual).sum() / count_safe]
        values = torch.stack([s.to(torch.float64) for s in stats]).tolist()
    names = ["ratio_mean", "kl_estimate", "reg_adv_mean", "lw_max", "lw_min", "reg_adv_abs_max", "clipfrac_high",
             "clipfrac_low", "clipfrac_dual"]
    v = dict(zip(names, values[1:] + [0.0] * (len(names) + 1 - len(values))))
    if values[0] == 0:  # nothing valid: every statistic is 0
        return {f"rpg/{k}": 0.0 for k in METRIC_NAMES}
    guard = cfg.log_ratio_guard
    lw_absmax = max(abs(v["lw_max"]), abs(v["lw_min"]))
    guard_frac = 0.0
    if lw_absmax > guard:  # rare: only then pay for the count
        guard_frac = float(((log_w_raw.abs() > guard) & valid).sum() / values[0])
    clipped = v["clipfrac_high"] + v["clipfrac_low"] + v["clipfrac_dual"]
    out = {
        "ratio_mean": v["ratio_mean"], "ratio_max": math.exp(min(v["lw_max"], guard)),
        "ratio_min": math.exp(max(v["lw_min"], -guard)), "log_ratio_abs_max": lw_absmax,
        "kl_estimate": v["kl_estimate"], "reg_adv_mean": v["reg_adv_mean"], "reg_adv_abs_max": v["reg_adv_abs_max"],
        "clipfrac": clipped, "clipfrac_high": v["clipfrac_high"], "clipfrac_low": v["clipfrac_low"],
        "clipfrac_dual": v["clipfrac_dual"], "active_frac": 1.0 - clipped, "log_ratio_guard_frac": guard_frac,
    }
    return {f"rpg/{k}": float(v) for k, v in out.items()}
