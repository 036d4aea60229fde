"""The conformance stage (.ci/run): every framework's rows computed again, each equal to the committed CSV's
(docs/conformance/conformance.csv): RPG and verl in this environment, TRL, OpenRLHF, SkyRL and AReaL from their
installed code in the environments of lab/scripts/setup_conformance.sh ($RPG_CONFORMANCE_ENVS or
.venv-conformance). A missing environment fails, never skips."""

from __future__ import annotations

import pytest
import torch

from rpg_lab.conformance import catalogue, environments, scoring, table
from rpg_lab.conformance.scenarios import scenarios
from test_conformance_report import CSV, assert_same_rows

pytestmark = pytest.mark.conformance


@pytest.fixture(scope="module")
def grid():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    scns = scenarios()
    yield scns, [scoring.target_gradients(s) for s in scns]
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", list(catalogue.FRAMEWORKS))
def test_the_frameworks_rows_are_the_csvs(name, grid):
    envs = environments.envs_folder()
    assert catalogue.FRAMEWORKS[name].env == "recipe" or envs.is_dir(), \
        f"{envs} does not exist: {environments.SETUP} {envs}"
    fresh = table.framework_rows(name, *grid, envs=envs)
    refused = {"loss:full", "reward:full"}  # verl raises NotImplementedError for them: their rows say so
    assert all(r["status"] == table.SCORED for r in fresh if r["setting"] not in refused), \
        [r["status"] for r in fresh][:1]
    assert_same_rows(fresh, [r for r in table.read_csv(CSV) if r["framework"] == name])
