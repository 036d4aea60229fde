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


def _guarded(log_ratio: torch.Tensor, bound: float) -> torch.Tensor:
    """Straight-through clamp: value clamped to [-bound, bound], gradient of the identity."""
    return log_ratio + (log_ratio.clamp(-bound, bound) - log_ratio).detach()


def dual_clip(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, c: float) -> torch.Tensor:
    """Dual-clip PPO loss (Ye et al.; spec §4.1), verl's ``vanilla`` semantics.

    A >= 0: max(-r*A, -clip(r, 1-eps_low, 1+eps_high)*A)   (gradient iff r < 1+eps_high)
    A <  0: min(that, -c*A)                                 (gradient iff 1-eps_low < r < c)
    """
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    ppo = torch.maximum(unclipped, clipped)
    return torch.where(adv < 0, torch.minimum(ppo, -adv * c), ppo)


def _clip_regions(positive: torch.Tensor, w: torch.Tensor, cfg: RPGLossConfig):
    """Clipped regions of RPG-Style Clip / dual clip (boundaries as in Algorithm 2)."""
    upper = positive & (w >= 1.0 + cfg.clip_ratio_high)
    lower = ~positive & (w <= 1.0 - cfg.clip_ratio_low)
    dual = ~positive & (w >= cfg.clip_ratio_c)
    return upper, lower, dual


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


def _reinforce(l, w, log_w, adv, r_ref, log_r_ref, cfg: RPGLossConfig):
    """REINFORCE-style loss (everything but l is a constant). Returns (loss, W, regions)."""
    with torch.no_grad():
        if cfg.clip:
            w_kl = w.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
            log_w_kl = torch.log(w_kl)
        else:
            w_kl, log_w_kl = w, log_w
        c_kl = kl_weight(cfg.divergence, cfg.beta, w_kl, log_w_kl, r_ref, log_r_ref)
        weight = w * adv + c_kl  # W = w * A', with A' = A + C/w (division by the unclipped w, Algorithm 2)
    if not cfg.clip:
        return -weight * l, weight, None
    with torch.no_grad():
        # sign(A') = sign(w*A' ) = sign(W) as w > 0; W stays finite where C/w could overflow.
        positive = weight >= 0 if cfg.branch_on == "regularized" else adv > 0
        upper, lower, dual = _clip_regions(positive, w, cfg)
        active = ~(upper | lower | dual)
        # Algorithm 2's constant values in the clipped regions (value only, never a gradient).
        eps_hi, eps_lo, c = 1.0 + cfg.clip_ratio_high, 1.0 - cfg.clip_ratio_low, cfg.clip_ratio_c
        const = torch.where(upper, adv * eps_hi, torch.where(lower, adv * eps_lo, adv * c)) + c_kl
        w_active = torch.where(active, weight, torch.zeros_like(weight))
        w_const = torch.where(active, torch.zeros_like(weight), const)
    loss = -(w_active * l) - w_const * l.detach()
    return loss, weight, (upper, lower, dual)


def _differentiable(l, w, log_rho, adv, r_ref, log_r_ref, cfg: RPGLossConfig):
    """Fully differentiable loss. Returns (loss, W = w*A + C(w) of its unclipped gradient, regions)."""
    kappa = kl_surrogate(cfg.divergence, w, log_rho, r_ref)
    if cfg.kl_clamp is not None:
        kappa = kappa + (kappa.clamp(-cfg.kl_clamp, cfg.kl_clamp) - kappa).detach()
    with torch.no_grad():
        weight = w * adv + kl_weight(cfg.divergence, cfg.beta, w, log_rho + log_r_ref, r_ref, log_r_ref)
    if cfg.fd_clip == "algorithm1":
        a_hat = adv - cfg.beta * kl_phi(cfg.divergence, log_rho)
        if not cfg.clip:
            return -w * a_hat, weight, None
        loss = dual_clip(w, a_hat, cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c)
        return loss, weight, _clip_regions(a_hat.detach() >= 0, w.detach(), cfg)
    kl_part = cfg.beta * kappa
    if not cfg.clip:
        return -w * adv + kl_part, weight, None
    loss = dual_clip(w, adv, cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c) + kl_part
    return loss, weight, _clip_regions(adv >= 0, w.detach(), cfg)


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
    guard = cfg.log_ratio_guard

    log_w_raw = l - l_old
    log_w = _guarded(log_w_raw, guard)
    w = torch.exp(log_w)
    if ref_log_prob is None:  # anchor = sampler (iterative reference): rho = w, r_ref = 1
        r_ref, log_r_ref, log_rho = 1.0, 0.0, log_w
    else:  # three-policy weights (spec §2.7); r_ref = a / mu is data
        log_r_ref = (ref_log_prob.detach().to(dtype) - l_old).clamp(-guard, guard)
        r_ref = torch.exp(log_r_ref)
        log_rho = log_w - log_r_ref

    if cfg.form == "reinforce":
        loss, weight, regions = _reinforce(l, w, log_w, adv, r_ref, log_r_ref, cfg)
    else:
        loss, weight, regions = _differentiable(l, w, log_rho, adv, r_ref, log_r_ref, cfg)
    loss = torch.where(mask != 0, loss, torch.zeros_like(loss))
    metrics = _metrics(cfg, mask, w.detach(), log_w_raw.detach(), log_rho.detach(), r_ref, weight, regions)
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
    w = torch.exp(_guarded(l - l_old, log_ratio_guard))
    log_r_ref = (l_ref - l_old).clamp(-log_ratio_guard, log_ratio_guard)
    return kl_surrogate("urkl", w, l - l_ref, torch.exp(log_r_ref))


# --------------------------------------------------------------------------- metrics


def _metrics(cfg, mask, w, log_w_raw, log_rho, r_ref, weight, regions) -> dict[str, float]:
    """Masked statistics, gathered into one tensor and read back with a single host sync."""
    with torch.no_grad():
        valid = mask != 0
        n = mask.sum()
        n_safe = torch.where(n > 0, n, torch.ones_like(n))
        kappa = kl_surrogate(cfg.divergence, w, log_rho, r_ref)

        def mean(x):
            return (x * mask).sum() / n_safe

        def vmax(x):
            return torch.where(valid, x, torch.full_like(x, -float("inf"))).amax()

        zero = torch.zeros((), dtype=mask.dtype, device=mask.device)
        if regions is None:
            upper = lower = dual = zero
        else:
            upper, lower, dual = (mean(r.to(mask.dtype)) for r in regions)
        abs_log = log_w_raw.abs()
        # A' = W / w in float64: W is finite, but C/w can overflow float32 for w -> 0 under a large C.
        reg_adv = weight.double() / w.double()
        stats = torch.stack([s.double() for s in (
            mean(w), vmax(w), -vmax(-w), vmax(abs_log), mean(kappa), mean(reg_adv), vmax(reg_adv.abs()),
            upper + lower + dual, upper, lower, dual, 1.0 - (upper + lower + dual),
            mean((abs_log > cfg.log_ratio_guard).to(mask.dtype)),
        )])
        stats = torch.where(torch.isfinite(stats) | (n > 0), stats, torch.zeros_like(stats))
        stats = torch.where(n > 0, stats, torch.zeros_like(stats))
        values = stats.tolist()
    keys = ("ratio_mean", "ratio_max", "ratio_min", "log_ratio_abs_max", "kl_estimate", "reg_adv_mean", "reg_adv_abs_max",
            "clipfrac", "clipfrac_high", "clipfrac_low", "clipfrac_dual", "active_frac", "log_ratio_guard_frac")
    return {f"rpg/{k}": float(v) for k, v in zip(keys, values)}
