"""The fused losses (``rpg.math.fused``) equal the paper's formulas in plain autograd (``rpg.math.formulas``).

Value and gradient in ``log_prob``, float64, for every divergence x form x clip setting (both branch rules, both
readings of the clipped differentiable loss, two sets of clip widths), both anchors and every aggregation mode,
on masked batches whose tokens fill every clip region on both sides (asserted, not assumed). The statement itself
is checked against the objective: its expected gradient is -grad J by exact enumeration.
"""

import ast
import dataclasses
import math
from pathlib import Path

import pytest
import torch
from exact_enumeration import DT, Bandit, assert_close, dual_clip_ppo

from rpg.math import formulas
from rpg.math.behavior import behavior_weights
from rpg.math.fused import AGG_MODES, DIVERGENCES, RPGLossConfig, grpo_corrected_kl, rpg_policy_loss

BETA = 0.5  # large, so that every KL term moves values, gradients and branches well above rounding
WIDTHS = (dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0),  # the paper's scripts
          dict(clip_ratio_low=0.1, clip_ratio_high=0.1, clip_ratio_c=2.0))
REVERSE = ("rkl", "urkl")  # Algorithm 1 defines A-hat for these only


def _settings():
    for d in DIVERGENCES:
        yield dict(divergence=d, form="reinforce", clip=False)
        yield dict(divergence=d, form="reinforce", clip=True, branch_on="regularized")
        yield dict(divergence=d, form="reinforce", clip=True, branch_on="raw")
        yield dict(divergence=d, form="differentiable", clip=False)
        yield dict(divergence=d, form="differentiable", clip=True, fd_clip="reward")
        if d in REVERSE:
            yield dict(divergence=d, form="differentiable", clip=False, fd_clip="algorithm1")
            yield dict(divergence=d, form="differentiable", clip=True, fd_clip="algorithm1")


SETTINGS = list(_settings())


def _id(s):
    return "-".join(str(v) if not isinstance(v, bool) else ("clip" if v else "noclip") for v in s.values())


def make_batch(widths, seed=0, rows=8, width=40):
    """A masked batch: each token's ratio w drawn in one of four bands (below 1-eps_low, inside the trust region,
    between 1+eps_high and c, above c), away from the boundaries; advantages of both signs, tiny and zero ones
    (where A and A' = A + C/w differ in sign); one row without a valid token; finite junk in the padding."""
    g = torch.Generator().manual_seed(seed)
    lo, hi, c = 1 - widths["clip_ratio_low"], 1 + widths["clip_ratio_high"], widths["clip_ratio_c"]
    bands = torch.tensor([[0.3 * lo, 0.95 * lo], [1.02 * lo, 0.98 * hi], [1.05 * hi, 0.9 * c], [1.1 * c, 3 * c]],
                         dtype=DT)
    pick = bands[torch.randint(0, 4, (rows, width), generator=g)]
    w = pick[..., 0] + (pick[..., 1] - pick[..., 0]) * torch.rand(rows, width, generator=g, dtype=DT)
    l_old = -torch.rand(rows, width, generator=g, dtype=DT) * 4 - 0.05 - w.log().clamp(min=0)
    l = l_old + w.log()
    l_ref = l_old + 0.5 * torch.randn(rows, width, generator=g, dtype=DT)
    adv = torch.randn(rows, 1, generator=g, dtype=DT).expand(rows, width).clone()  # one advantage per response
    adv[:, ::3] *= 0.02  # tiny |A| against |C/w| ~ beta (a token-level spread, to reach every branch)
    adv[:, 1::7] = 0.0
    mask = (torch.rand(rows, width, generator=g) < 0.8).to(DT)
    mask[0] = 0.0  # an empty row
    junk = torch.rand(rows, width, generator=g, dtype=DT) * 3 - 9  # finite values where masked
    l, l_old, l_ref = (torch.where(mask > 0, t, junk) for t in (l, l_old, l_ref))
    return l, l_old, adv, mask, l_ref


def branch(cfg, l, l_old, adv, l_ref):
    """Which branch of the dual clip each token takes (docs/math.md#rpg-style-clip), from the statement's pieces."""
    w = (l - l_old).exp()
    r_ref = (l_ref - l_old).exp()
    lo, hi = 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high
    if cfg.form == "reinforce":
        a_reg = adv + formulas.kl_weight(cfg.divergence, cfg.beta, w.clamp(lo, hi), r_ref) / w
        return a_reg >= 0 if cfg.branch_on == "regularized" else adv > 0
    if cfg.fd_clip == "algorithm1":
        return adv - cfg.beta * formulas.phi(cfg.divergence, (w / r_ref).log()) >= 0
    return adv >= 0


def assert_every_region_hit(cfg, l, l_old, adv, mask, l_ref):
    up, w, valid = branch(cfg, l, l_old, adv, l_ref), (l - l_old).exp(), mask > 0
    lo, hi, c = 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high, cfg.clip_ratio_c
    regions = {
        "positive, active below 1-eps_low": up & (w < lo), "positive, active inside": up & (w > lo) & (w < hi),
        "positive, clipped above 1+eps_high": up & (w > hi),
        "negative, clipped below 1-eps_low": ~up & (w < lo), "negative, active inside": ~up & (w > lo) & (w < hi),
        "negative, active between 1+eps_high and c": ~up & (w > hi) & (w < c), "negative, dual-clipped": ~up & (w > c),
    }
    empty = [name for name, r in regions.items() if not (r & valid).any()]
    assert not empty, f"{cfg}: no valid token in {empty}"


def fused(cfg, l, l_old, adv, mask, l_ref, aggregate):
    lp = l.clone().requires_grad_(True)
    out, metrics = rpg_policy_loss(log_prob=lp, old_log_prob=l_old, advantages=adv, response_mask=mask, config=cfg,
                                   ref_log_prob=l_ref, aggregate=aggregate)
    return out, lp, metrics


def stated(cfg, l, l_old, adv, mask, l_ref, aggregate):
    lp = l.clone().requires_grad_(True)
    out = formulas.loss(cfg, lp, l_old, adv, mask, l_ref) if aggregate else \
        formulas.per_token_loss(cfg, lp, l_old, adv, l_ref) * mask
    return out, lp


def value_and_grad(out, lp, cotangent):
    (g,) = torch.autograd.grad((out * cotangent).sum(), lp)
    return out.detach(), g


@pytest.mark.parametrize("settings", SETTINGS, ids=_id)
def test_fused_loss_equals_the_paper_statement_in_value_and_gradient(settings):
    for k, widths in enumerate(WIDTHS):
        l, l_old, adv, mask, ref = make_batch(widths, seed=k)
        cotangent = torch.randn(l.shape, generator=torch.Generator().manual_seed(k), dtype=DT)
        for l_ref in (None, ref):
            base = RPGLossConfig(**settings, **widths, beta=BETA)
            if base.clip:
                assert_every_region_hit(base, l, l_old, adv, mask, l_old if l_ref is None else l_ref)
            runs = [(dataclasses.replace(base, loss_agg_mode=m), True) for m in AGG_MODES] + [(base, False)]
            for cfg, aggregate in runs:
                what = f"{cfg.divergence} {cfg.form} clip={cfg.clip} {cfg.branch_on}/{cfg.fd_clip} " \
                       f"{'ref' if l_ref is not None else 'sampler'} {cfg.loss_agg_mode if aggregate else 'per token'}"
                out, lp, metrics = fused(cfg, l, l_old, adv, mask, l_ref, aggregate)
                co = torch.ones(()) if aggregate else cotangent
                v, g = value_and_grad(out, lp, co)
                v_ref, g_ref = value_and_grad(*stated(cfg, l, l_old, adv, mask, l_ref, aggregate), co)
                assert_close(v, v_ref, rtol=1e-10, atol=1e-12, what=f"value, {what}")
                assert_close(g, g_ref, rtol=1e-10, atol=1e-12, what=f"gradient, {what}")
                assert g.abs().max() > 0 and (g[mask == 0] == 0).all(), what
                if cfg.clip:  # the fused loss saw the regions too
                    assert 0 < metrics["rpg/active_frac"] < 1 and metrics["rpg/clipfrac_high"] > 0, what
                    assert metrics["rpg/clipfrac_low"] > 0 and metrics["rpg/clipfrac_dual"] > 0, what


def boundary_batch(widths, per_value=6):
    """Tokens whose ratio w = exp(l - l_old) is exactly 1-eps_low, 1+eps_high or c in float64 (Algorithm 2 counts
    them as clipped), with advantages of both signs. c = 10 is not a float64 exp of any log-ratio: left out."""
    lo, hi, c = 1 - widths["clip_ratio_low"], 1 + widths["clip_ratio_high"], widths["clip_ratio_c"]
    values, rows = [], []
    for v in (lo, hi, c):  # l_old on a grid, l = l_old + log v, kept where exp(l - l_old) is v itself
        l_old = -(0.7 + 0.0005 * torch.arange(1000, dtype=DT))  # small |l_old|: l - l_old rounds little
        l_old = l_old[((l_old + math.log(v)) - l_old).exp() == v][:per_value]
        if len(l_old) == per_value:
            values.append(v)
            rows.append(l_old)
    l_old = torch.stack(rows)
    l = l_old + torch.tensor(values, dtype=DT).log()[:, None]
    adv = torch.tensor([1.0, -1.0, 0.7, -0.4, 2.0, -3.0], dtype=DT)[:per_value].expand_as(l).clone()
    return values, l, l_old, adv, torch.ones_like(l)


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("branch_on", ["regularized", "raw"])
def test_rpg_style_clip_at_the_clip_boundaries_equals_the_paper_statement(divergence, branch_on):
    """w = 1-eps_low, 1+eps_high, c exactly: clipped (no gradient), as in Algorithm 2, except a positive token at
    1-eps_low (no lower cut). Not for the differentiable forms: their dual clip is App. G.1's max/min, whose gradient
    at a tie is a convention."""
    hit = []
    for widths in WIDTHS:
        values, l, l_old, adv, mask = boundary_batch(widths)
        hit += values
        cfg = RPGLossConfig(divergence=divergence, clip=True, beta=BETA, branch_on=branch_on, **widths)
        out, lp, _ = fused(cfg, l, l_old, adv, mask, None, False)
        v, g = value_and_grad(out, lp, torch.ones_like(l))
        v_ref, g_ref = value_and_grad(*stated(cfg, l, l_old, adv, mask, None, False), torch.ones_like(l))
        assert_close(v, v_ref, rtol=1e-10, atol=1e-12, what=f"boundary value, {divergence} {branch_on}")
        assert_close(g, g_ref, rtol=1e-10, atol=1e-12, what=f"boundary gradient, {divergence} {branch_on}")
        up, w = branch(cfg, l, l_old, adv, l_old), (l - l_old).exp()
        lo = w == 1 - cfg.clip_ratio_low
        hi, c = 1 + cfg.clip_ratio_high, cfg.clip_ratio_c
        clipped = torch.where(up, w >= hi, (w <= 1 - cfg.clip_ratio_low) | (w >= c))
        assert (g[clipped] == 0).all() and (g[~clipped] != 0).all() and (up & lo).any() and (~up & lo).any()
    assert hit == [0.8, 1.28, 0.9, 1.1, 2.0], hit  # every boundary but c = 10


def test_the_branch_rules_differ_on_these_batches():
    """branch_on=raw and =regularized take different branches on some valid tokens, so both are tested."""
    for widths in WIDTHS:
        l, l_old, adv, mask, _ = make_batch(widths)
        for d in DIVERGENCES:
            cfgs = [RPGLossConfig(divergence=d, clip=True, beta=BETA, branch_on=b, **widths)
                    for b in ("regularized", "raw")]
            ups = [branch(cfg, l, l_old, adv, l_old) for cfg in cfgs]
            assert ((ups[0] != ups[1]) & (mask > 0)).any(), d


def stated_aggregate(loss, mask, mode, scale):
    """verl's ``loss_agg_mode`` written out mode by mode; S = rows with a valid token, T = width (``scale``)."""
    total, tokens = loss * mask, mask.sum(-1)
    rows = (tokens > 0).sum().clamp(min=1)
    if mode == "token-mean":
        return total.sum() / mask.sum().clamp(min=1)
    if mode == "token-sum":
        return total.sum()
    if mode == "seq-mean-token-mean":
        return (total.sum(-1) / tokens.clamp(min=1)).sum() / rows
    if mode == "seq-mean-token-sum":
        return total.sum() / rows
    return total.sum() / (rows * scale)  # seq-mean-token-sum-norm


def test_aggregation_with_a_scale_equals_the_modes_written_out():
    l, _, _, mask, _ = make_batch(WIDTHS[0])
    for mode in AGG_MODES:
        assert_close(formulas.aggregate(l, mask, mode, 7.0), stated_aggregate(l, mask, mode, 7.0),
                     rtol=1e-12, atol=0.0, what=mode)
    empty = torch.zeros_like(mask)
    for m in AGG_MODES:  # an all-masked batch gives 0, not 0/0
        assert float(formulas.aggregate(l, empty, m)) == 0.0 == float(stated_aggregate(l, empty, m, 7.0)), m
    with pytest.raises(ValueError, match="loss_agg_mode='seq-mean' is invalid: expected one of"):
        formulas.aggregate(l, mask, "seq-mean")


def test_grpo_corrected_kl_equals_the_paper_statement():
    l, l_old, _, mask, l_ref = make_batch(WIDTHS[0])
    cotangent = torch.randn(l.shape, generator=torch.Generator().manual_seed(3), dtype=DT)
    lp = l.clone().requires_grad_(True)
    v, g = value_and_grad(grpo_corrected_kl(log_prob=lp, old_log_prob=l_old, ref_log_prob=l_ref), lp, cotangent)
    lp2 = l.clone().requires_grad_(True)
    v_ref, g_ref = value_and_grad(formulas.grpo_corrected_kl(lp2, l_old, l_ref), lp2, cotangent)
    assert_close(v, v_ref, rtol=1e-10, atol=1e-12, what="grpo_corrected_kl value")
    assert_close(g, g_ref, rtol=1e-10, atol=1e-12, what="grpo_corrected_kl gradient")


def test_dual_clip_equals_the_paper_statement():
    """``formulas.dual_clip``'s −Â·x on the branch of Â's sign is App. G.1's max/min, in value and gradient."""
    l, l_old, adv, _, _ = make_batch(WIDTHS[1])
    for a in (adv, adv - 0.3):
        lp, lp2 = l.clone().requires_grad_(True), l.clone().requires_grad_(True)
        v, g = value_and_grad(-a * formulas.dual_clip((lp - l_old).exp(), a >= 0, 0.9, 1.1, 3.0)[0], lp, 1.0)
        v_ref, g_ref = value_and_grad(dual_clip_ppo((lp2 - l_old).exp(), a, 0.9, 1.1, 3.0), lp2, 1.0)
        assert_close(v, v_ref, rtol=1e-12, atol=0.0, what="dual clip value")
        assert_close(g, g_ref, rtol=1e-12, atol=0.0, what="dual clip gradient")


@pytest.mark.parametrize("level, cap", [("token", None), ("token", 1.5), ("sequence", None), ("sequence", 1.5),
                                        ("none", None)])  # RPGLossConfig refuses a cap without a weight
def test_behaviour_weights_equal_the_paper_statement(level, cap):
    """rpg_policy_loss takes no behaviour weight; the glue multiplies the per-token loss by rpg.math.behavior's."""
    l, l_old, _, mask, _ = make_batch(WIDTHS[0], rows=6, width=5)
    l_mu = l_old + 0.2 * torch.randn(l.shape, generator=torch.Generator().manual_seed(5), dtype=DT)
    b = behavior_weights(l_old, l_mu, mask, level, cap)
    assert_close(b, formulas.behavior_weight(l_old, l_mu, mask, level, cap), rtol=1e-12, atol=0.0, what=level)
    if cap is not None:
        assert (b[mask > 0] == cap).any() and (b[mask > 0] < cap).any(), "the cap must bind on some tokens only"


# ----------------------------------------------------------------- the oracle against the objective


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("form", ["reinforce", "differentiable"])
@pytest.mark.parametrize("three_policy", [False, True])
def test_the_paper_statement_gradient_is_minus_grad_objective(divergence, form, three_policy):
    """E_pi_old[grad loss_t] = -grad J at theta != theta_old (unclipped), by exact enumeration."""
    bandit = Bandit.make(seed=7)
    log_prob, old, adv, mu, ref = bandit.rows(three_policy=three_policy)
    cfg = RPGLossConfig(divergence=divergence, form=form, beta=BETA, clip=False)
    expected_loss = (mu * formulas.per_token_loss(cfg, log_prob, old, adv, ref)).sum()
    anchor = bandit.pi_ref if three_policy else bandit.mu
    assert_close(bandit.grad(expected_loss), -bandit.grad(bandit.objective(divergence, BETA, anchor)),
                 what=f"{form} {divergence}")
    assert bandit.grad(bandit.objective(divergence, BETA, anchor)).abs().max() > 1e-3
    assert not math.isclose(float(bandit.pi[0].detach()), float(bandit.mu[0]))  # theta != theta_old


# ----------------------------------------------------------------- each piece written once

PIECES = ("k3", "phi", "kappa", "kl_weight", "dual_clip", "agg_weights", "aggregate")


def test_each_piece_is_defined_once_in_the_package():
    """The fused path, the trainer and the behaviour metrics import these from ``rpg.math.formulas``: no module of
    ``rpg/`` defines a function of the same name (or the fused path could drift from the formulas the tests check)."""
    root = Path(__file__).parents[2]
    where = {name: [] for name in PIECES}
    for path in sorted((root / "rpg").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in where:
                where[node.name].append(path.relative_to(root).as_posix())
    assert where == {name: ["rpg/math/formulas.py"] for name in PIECES}
