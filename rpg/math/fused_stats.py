"""The fused path's ``rpg/*`` statistics of an RPG loss, over the valid tokens (mask m_t != 0) of one batch.

    ratio_{mean,max,min}        w                     log_ratio_{mean,abs_max}  log w before the guard
    kl_estimate                 mean κ_D (estimates D) reg_adv_{mean,abs_max}   A' = W/w, saturated at ±1e30
    clipfrac, active_frac       inactive, active       clipfrac_{high,low,dual}  per clip region
    log_ratio_guard_frac        |log w| > guard        ref_old_logp_absdiff_max  max |l_ref − l_old| (reference anchor)

Means are m-weighted, fractions count tokens, extremes are maxima. ``LossStatistics`` takes each one on the device
as soon as ``rpg.math.fused_terms`` has its tensor and packs them into one float64 vector; ``loss_metrics`` turns
that vector, read back with one host sync, into the metrics.
"""

from __future__ import annotations

import math

import torch

# the vector's layout: sums, then extremes (the last only with a reference anchor), then counts (the last three
# only with a clip)
WEIGHTED_SUMS = ("n", "ratio", "kl", "reg_adv", "log_ratio")  # sum_t m_t * quantity_t
EXTREMES = ("log_ratio", "neg_log_ratio", "reg_adv_abs", "ref_log_ratio_abs")  # max over valid tokens
VALID_COUNTS = ("valid", "guarded", "active", "clip_high", "clip_low")  # tokens with m_t != 0
METRIC_NAMES = ("ratio_mean", "ratio_max", "ratio_min", "log_ratio_mean", "log_ratio_abs_max", "kl_estimate",
                "reg_adv_mean", "reg_adv_abs_max", "clipfrac", "clipfrac_high", "clipfrac_low", "clipfrac_dual",
                "active_frac", "log_ratio_guard_frac")


class LossStatistics:
    """The statistics of one loss evaluation, on the device (no host sync; traceable by torch.compile)."""

    def __init__(self, mask: torch.Tensor, valid: torch.Tensor):
        self.m, self.valid = mask.reshape(-1), valid
        self.sums = {"n": mask.sum()}
        self.extremes: dict[str, torch.Tensor] = {}
        self.counts = {"valid": torch.count_nonzero(valid)}

    def _dot(self, t: torch.Tensor) -> torch.Tensor:  # sum_t m_t * t_t
        return torch.dot(t.reshape(-1), self.m)

    def _count(self, flags: torch.Tensor) -> torch.Tensor:  # valid tokens where flags holds
        return torch.count_nonzero(flags & self.valid)

    def log_ratio(self, log_w: torch.Tensor, guard: float) -> None:
        """log w before the guard, 0 where masked."""
        self.sums["log_ratio"] = self._dot(log_w)
        pad = torch.where(self.valid, 0.0, -math.inf)  # max_t (x_t + pad_t): the max over valid tokens
        self.extremes["log_ratio"], self.extremes["neg_log_ratio"] = (log_w + pad).amax(), (pad - log_w).amax()
        self.counts["guarded"] = self._count(log_w.abs() > guard)

    def reference(self, log_r_ref: torch.Tensor) -> None:
        """log r_ref = l_ref − l_old before the guard, 0 where masked."""
        self.extremes["ref_log_ratio_abs"] = log_r_ref.abs().amax()

    def kl(self, kappa: torch.Tensor) -> None:
        self.sums["kl"] = self._dot(kappa)

    def loss(self, w: torch.Tensor, weight: torch.Tensor, regions: tuple | None) -> None:
        """w, the REINFORCE weight W (A' = W/w) and the clip's (active, high, low) flags, if any."""
        self.sums["ratio"] = self._dot(w)
        reg_adv = (weight / w).clamp_(-1e30, 1e30)  # W stays finite where C/w overflows (w -> 0)
        self.sums["reg_adv"] = self._dot(reg_adv)
        self.extremes["reg_adv_abs"] = torch.where(self.valid, reg_adv, 0.0).abs_().amax()
        for name, flags in zip(("active", "clip_high", "clip_low"), regions or ()):
            self.counts[name] = self._count(flags)

    def vector(self) -> torch.Tensor:
        """Sums and extremes as float64, then the counts, in the order of the tuples above."""
        floats = [self.sums[k] for k in WEIGHTED_SUMS] + [self.extremes[k] for k in EXTREMES if k in self.extremes]
        return torch.cat((torch.stack(floats).double(), torch.stack([self.counts[k] for k in VALID_COUNTS
                                                                      if k in self.counts])))


def loss_metrics(stats: list[float], guard: float, with_ref: bool) -> dict[str, float]:
    """``LossStatistics.vector()`` read back to the host, as ``rpg/<name>`` floats (every one 0 without a valid
    token). ratio_max/min are exp of the guarded log w's extremes."""
    n_sums, n_extremes = len(WEIGHTED_SUMS), 4 if with_ref else 3
    s = dict(zip(WEIGHTED_SUMS, stats[:n_sums]))
    e = dict(zip(EXTREMES, stats[n_sums:n_sums + n_extremes]))
    c = dict(zip(VALID_COUNTS, stats[n_sums + n_extremes:]))
    names = METRIC_NAMES + (("ref_old_logp_absdiff_max",) if with_ref else ())
    n_valid = c["valid"]
    if n_valid == 0:
        return {f"rpg/{k}": 0.0 for k in names}
    n = s["n"] if s["n"] != 0 else 1.0
    lw_max, lw_min = e["log_ratio"], -e["neg_log_ratio"]
    active = c.get("active", n_valid)
    high, low = c.get("clip_high", 0.0), c.get("clip_low", 0.0)
    out = {
        "ratio_mean": s["ratio"] / n, "ratio_max": math.exp(min(lw_max, guard)),
        "ratio_min": math.exp(max(lw_min, -guard)), "log_ratio_mean": s["log_ratio"] / n,
        "log_ratio_abs_max": max(abs(lw_max), abs(lw_min)), "kl_estimate": s["kl"] / n,
        "reg_adv_mean": s["reg_adv"] / n, "reg_adv_abs_max": e["reg_adv_abs"],
        "clipfrac": (n_valid - active) / n_valid, "clipfrac_high": high / n_valid, "clipfrac_low": low / n_valid,
        "clipfrac_dual": (n_valid - active - high - low) / n_valid, "active_frac": active / n_valid,
        "log_ratio_guard_frac": c["guarded"] / n_valid,
    }
    if with_ref:
        out["ref_old_logp_absdiff_max"] = e["ref_log_ratio_abs"]
    return {f"rpg/{k}": float(v) for k, v in out.items()}
