"""The run-name grammar of scripts/experiments.py (the check of the shipped experiment files): every shipped script
parses to the hand-written expected table (launch_expected), irregular authors' names keep working, bad names fail
with the grammar; a name without an experiment file gets the closest shipped names; scripts stay thin wrappers."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch_expected import ALL_ROWS, CONTEXT_TABLES, ROWS_4B, ROWS_7B, effective
from launching import generator
from messages import names, one_line

gen = generator()
GRAMMAR, VariantNameError, known_names, parse, to_overrides = (gen.GRAMMAR, gen.VariantNameError, gen.known_names,
                                                               gen.parse, gen.to_overrides)
paper_refs, paper_row = gen.paper_refs, gen.paper_row

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipe" / "rpg"


def _ov(v) -> dict[str, str]:
    """The run's effective settings: the recipe YAML and the paper setup, then the script's overrides."""
    return effective(to_overrides(v))


def test_script_overrides_say_only_what_the_name_changes():
    """No override restates a value of the recipe YAML or the paper setup (one place per constant)."""
    PAPER_SETUP, without_defaults = gen.PAPER_SETUP, gen.without_defaults
    for name in known_names():
        ov = to_overrides(parse(name))
        assert ov[0] == PAPER_SETUP and without_defaults(ov[1:]) == ov[1:], name
        assert len(ov) <= 20, (name, len(ov))


def test_script_sets_match_the_expected_tables():
    assert len(ROWS_7B) == 60 and len({r["name"] for r in ROWS_7B}) == 60
    assert sorted(p.stem for p in (RECIPE / "7b").glob("*.sh")) == sorted(r["name"] for r in ROWS_7B)
    assert sorted(p.stem for p in (RECIPE / "4b").glob("*.sh")) == sorted(r["name"] for r in ROWS_4B)
    assert known_names() == sorted(r["name"] for r in ALL_ROWS)


@pytest.mark.parametrize("row", ALL_ROWS, ids=lambda r: r["name"])
def test_variant_matches_expected_row(row):
    v = parse(row["name"])
    got = {
        "algo": v.algo, "divergence": v.divergence, "form": v.form, "clip": v.clip, "eps_low": v.eps_low,
        "eps_high": v.eps_high, "c": v.clip_c, "beta": v.beta, "lr": v.lr, "optimizer": v.optimizer,
        "model": v.model, "reference": v.reference, "filtering": v.filtering, "overlong": v.overlong,
    }
    want = {k: row[k] for k in got}
    assert got == want
    assert v.name == row["name"]


def test_contexts_lengths_and_eval_sets():
    for r in ROWS_7B:
        v = parse(r["name"])
        assert (v.context, v.max_prompt_length, v.max_response_length, v.overlong_buffer) == ("2k", 2048, 2048, 512)
        assert v.val_sets == ("aime2024", "aime2025", "amc2023") and v.thinking is None
        # the authors' packing limits (their scripts' ppo_max_token_len_per_gpu)
        assert v.max_tokens_per_gpu == (16384 if "clip_ppo" in r["name"] else 4096)
    for r in ROWS_4B:
        v = parse(r["name"])
        k = {"2k": 2048, "4k": 4096, "8k": 8192}[v.context]
        assert f"_ctx{v.context}" in r["name"]
        assert (v.max_prompt_length, v.max_response_length, v.overlong_buffer) == (k, k, k // 4)
        assert v.thinking is False and v.model == "Qwen/Qwen3-4B"
        assert ("minerva" in v.val_sets and "olympiadbench" in v.val_sets) == (v.context == "4k")


def test_4b_paper_map():
    for r in ROWS_4B:
        v = parse(r["name"])
        refs = set(paper_refs(v))
        ablation = "noiterref" in r["name"] or "0.1_0.1" in r["name"] or "1e-3_rf" in r["name"]
        tables = {x for x in refs if x.startswith("Table")}
        assert tables == (set() if ablation else CONTEXT_TABLES[v.context]), r["name"]
    # Fig. 9's legend (page 30): RPG-REINFORCE-UFKL-1e-3-noiterref, i.e. beta 1e-3 with the fixed reference
    assert paper_refs(parse("run_rpg_4b_ctx4k_ufkl1e-3_rf_clip_ppo_0.2_0.28_noiterref")) == ("Fig. 9 (noiterref)",)
    assert paper_refs(parse("run_rpg_4b_ctx4k_ufkl1e-4_rf_clip_ppo_0.2_0.28_noiterref")) == ()  # not the paper's run
    assert "run_rpg_4b_ctx4k_ufkl1e-3_rf_clip_ppo_0.2_0.28_noiterref" in known_names()
    assert "run_rpg_4b_ctx4k_ufkl1e-4_rf_clip_ppo_0.2_0.28_noiterref" not in known_names()
    assert paper_refs(parse("run_rpg_4b_ctx4k_ufkl1e-3_rf_clip_ppo_0.2_0.28")) == ("Fig. 9 (beta 0.001)",)
    assert "Fig. 8 (clip (0.1, 0.1))" in paper_refs(parse("run_rpg_4b_ctx2k_urkl1e-4_rf_clip_ppo_0.1_0.1"))
    assert paper_row(parse("run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28")) == "RPG-REINFORCE-URKL"


def test_learning_rates_follow_appendix_h_for_4b_and_the_release_for_7b():
    """App. H: lr 1e-6 "unless otherwise specified" -> every Qwen3-4B run; the 7B RPG-REINFORCE scripts keep
    the authors' released 5e-7 (a value the paper never states)."""
    for r in ROWS_4B:
        v = parse(r["name"])
        assert v.lr == 1e-6 and float(_ov(v)["actor_rollout_ref.actor.optim.lr"]) == 1e-6, r["name"]
    rf_7b = [r["name"] for r in ROWS_7B if parse(r["name"]).form == "reinforce"]
    assert len(rf_7b) == 27 and all(parse(n).lr == 5e-7 for n in rf_7b)
    assert {parse(r["name"]).lr for r in ROWS_7B if r["name"] not in rf_7b} == {1e-6}


def test_table8_rows_are_the_adamw_instruct_scripts():
    t8 = sorted(r["name"] for r in ROWS_7B if "Table 8" in paper_refs(parse(r["name"])))
    assert t8 == sorted([
        "run_dapo_7binstruct", "run_grpo_7b_7binstruct", "run_rfpp_7b_1e-4_7binstruct", "run_rfppb_7b_1e-4_7binstruct",
        *[f"run_rpg_7b_{d}1e-4_7binstruct" for d in ("fkl", "rkl", "ufkl", "urkl")],
        *[f"run_rpg_7b_{d}1e-4_rf_clip_ppo_0.2_0.28_7binstruct" for d in ("fkl", "rkl", "ufkl", "urkl")],
    ])
    labels = {paper_row(parse(n)) for n in t8}
    assert len(labels) == 12  # the 12 rows of Table 8


def test_irregular_authors_names():
    v = parse("run_dapo_7binstruct")
    assert v.model == "Qwen/Qwen2.5-7B-Instruct" and v.irregular and "run_dapo_7b_7binstruct" in v.irregular
    assert parse("run_dapo_7b_7binstruct").model == v.model
    v = parse("run_rpg_7b_rkl1e-4_rf_clip_ppo")
    assert (v.eps_low, v.eps_high, v.model, v.form, v.clip) == (0.1, 0.1, "Qwen/Qwen2.5-Math-7B", "reinforce", True)
    v = parse("run_rpg_7b_rkl1e-4_rf")
    assert (v.form, v.clip, v.beta, v.lr) == ("reinforce", False, 1e-4, 5e-7)
    v = parse("run_rpg_7b_schedulefree")
    assert (v.beta, v.reference, v.form, v.optimizer, v.divergence) == (0.0, "none", "differentiable", "schedulefree", None)
    # paths and .sh are accepted (what users type)
    assert parse("recipe/rpg/7b/run_grpo_7b.sh").name == "run_grpo_7b"


def test_rf_clip_ppo_overrides_are_correctly_wired():
    ov = _ov(parse("run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28"))
    assert ov["rpg.loss.name"] == "rpg" and ov["rpg.loss.form"] == "reinforce" and ov["rpg.loss.clip"] == "True"
    assert float(ov["rpg.loss.beta"]) == 1e-4 and ov["rpg.loss.divergence"] == "ufkl"
    assert ov["algorithm.use_kl_in_reward"] == "False" and ov["actor_rollout_ref.actor.use_kl_loss"] == "False"
    assert float(ov["actor_rollout_ref.actor.optim.lr"]) == 5e-7 and ov["rpg.reference.mode"] == "sampler"
    assert ov["trainer.total_training_steps"] == "400"
    assert ov["actor_rollout_ref.rollout.val_kwargs.n"] == "32"


def test_baseline_overrides():
    g = _ov(parse("run_grpo_7b"))
    assert (g["rpg.loss.name"], g["algorithm.adv_estimator"], g["algorithm.norm_adv_by_std_in_grpo"]) == ("verl", "grpo", "True")
    assert (g["actor_rollout_ref.actor.use_kl_loss"], g["actor_rollout_ref.actor.kl_loss_type"]) == ("True", "low_var_kl")
    assert float(g["actor_rollout_ref.actor.kl_loss_coef"]) == 1e-3 and g["rpg.reference.mode"] == "fixed"
    assert g["algorithm.filter_groups.enable"] == "False" and g["reward.reward_kwargs.overlong_buffer_cfg.enable"] == "False"
    r = _ov(parse("run_rfppb_7b_1e-4"))
    assert (r["algorithm.adv_estimator"], r["actor_rollout_ref.actor.kl_loss_type"], r["rpg.reference.mode"]) == (
        "reinforce_plus_plus_baseline", "kl", "sampler")
    assert _ov(parse("run_rfpp_4b_ctx4k_1e-4_noiterref"))["rpg.reference.mode"] == "fixed"
    d = _ov(parse("run_dapo_7b"))
    assert d["actor_rollout_ref.actor.use_kl_loss"] == "False" and d["algorithm.filter_groups.enable"] == "True"
    assert d["algorithm.filter_groups.metric"] == "acc"


@pytest.mark.parametrize("bad, why", [
    ("run_foo_7b", "unknown algorithm"),
    ("run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2", "does not match"),
    ("run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28_7binstruct_schedulefree", "does not match"),  # suffix order
    ("run_grpo_7b_1e-4", "takes no KL token"),
    ("run_rfpp_7b", "k1 KL-loss coefficient"),
    ("run_rfpp_7b_ufkl1e-4", "k1 KL-loss coefficient"),
    ("run_rpg_7b_1e-4", "needs a divergence"),
    ("run_rpg_7b_js1e-4", "does not match"),
    ("run_rpg_4b_ufkl1e-4", "needs _ctx2k"),
    ("run_rpg_4b_ctx16k_ufkl1e-4", "needs _ctx2k"),
    ("run_rpg_7b_ctx4k_ufkl1e-4", "2K-context only"),
    ("run_rpg_4b_ctx2k_ufkl1e-4_7binstruct", "only valid with model 7b"),
    ("run_dapo_7binstruct_schedulefree", "takes no further tokens"),
    ("run_dapo_7b_noiterref", "_noiterref needs"),
    ("run_rpg_7b_ufkl0e-4", "must be > 0"),
    ("run_rpg_7b_ufkl1e-4_rf_clip_ppo_1.5_0.28", "0 < eps_low < 1"),
    ("", "non-empty"),
])
def test_bad_names_fail_with_the_grammar(bad, why):
    with pytest.raises(VariantNameError) as e:
        parse(bad)
    msg = str(e.value)
    assert why in msg
    assert GRAMMAR.splitlines()[0] in msg  # the grammar is shown


def test_typo_gets_a_suggestion():
    with pytest.raises(VariantNameError, match="closest script names: run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28"):
        parse("run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.29x")


def test_a_name_without_a_file_is_refused_naming_the_closest_shipped_name():
    """A run is its experiment file: a swap of two digits (0.82 for the shipped 0.28) names the shipped run; a name
    far from every shipped one gets difflib's closest."""
    from rpg.launch.experiments import ExperimentError, closest_shipped, edits, find, shipped_names

    assert (edits("0.28", "0.82"), edits("ab", "ba"), edits("kitten", "sitting"), edits("", "abc")) == (1, 1, 3, 3)
    swapped = "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.82"
    with pytest.raises(ExperimentError) as e:
        find(swapped)
    line = one_line(str(e.value))
    assert line.startswith(f"no run {swapped}: "), line
    # the file looked for, where, and the shipped run meant
    names(line, f"experiment/{swapped}.yaml", "recipe/rpg/config", "hydra.searchpath",
          "closest shipped: run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28")
    assert closest_shipped("run_rpg_7b_ufkl1e-3") == ["run_rpg_7b_ufkl1e-4"]
    assert closest_shipped("run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.29x")[0] == "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28"
    assert shipped_names() == known_names()  # every shipped script has its file, and no file lacks its script


def test_scripts_are_identical_thin_wrappers():
    scripts = sorted((RECIPE / "7b").glob("*.sh")) + sorted((RECIPE / "4b").glob("*.sh"))
    bodies = {p.read_text() for p in scripts}
    assert len(bodies) == 1, "every run script must be the same thin wrapper (settings: its experiment file)"
    body = bodies.pop()
    code = [ln for ln in body.splitlines() if ln.strip() and not ln.startswith("#")]
    assert code == ['exec bash "$(dirname "$0")/../launch.sh" "$(basename "$0" .sh)" "$@"']
    assert all(p.stat().st_mode & 0o111 for p in scripts), "scripts must be executable"
    # the runner: the driver with the run's experiment file, the second and last hop (a Ray cluster: opt-in)
    runner = [ln for ln in (RECIPE / "launch.sh").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert runner[-1] == 'exec "${PYTHON:-python3}" "$(dirname "$0")/main_rpg.py" "+experiment=$run" "$@"', runner
    assert [ln for ln in runner if "rpg.cluster" in ln] == [
        'if [[ -n "${RAY_ADDRESS:-}" ]]; then exec "${PYTHON:-python3}" -m rpg.cluster "$run" "$@"; fi']


def test_docs_list_every_script():
    doc = (ROOT / "docs" / "launch-scripts.md").read_text()
    missing = [r["name"] for r in ALL_ROWS if f"`{r['name']}`" not in doc]
    assert not missing, f"docs/launch-scripts.md lacks {missing}; paste `python scripts/experiments.py --table` into §8"


def test_the_launch_imports_no_heavy_packages():
    """main_rpg.py reads its command line before verl: the launch's entry imports no verl, torch, Hydra or Ray."""
    import subprocess
    import sys

    code = ("import sys, rpg.launch.entry; bad = [m for m in ('verl', 'torch', 'hydra', 'ray') if m in sys.modules]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_the_grammars_divergences_are_the_loss_librarys():
    """scripts/experiments.py reads the divergence names from their torch-free declaration (rpg.config), the one
    the loss library implements."""
    from rpg.math.formulas import DIVERGENCES

    assert gen.DIVERGENCES is DIVERGENCES
