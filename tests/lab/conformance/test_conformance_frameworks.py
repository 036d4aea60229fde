"""The conformance stage (.ci/run, in the environments of lab/scripts/setup_conformance.sh: $RPG_CONFORMANCE_ENVS or
.venv-conformance): TRL, OpenRLHF, SkyRL and AReaL run again from their installed code, each row equal to the
committed CSV's (docs/conformance/conformance.csv). A missing environment fails, never skips."""

from __future__ import annotations

import pytest
import torch

from rpg_lab.conformance import environments, scoring, table
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


@pytest.mark.parametrize("name", ["TRL", "OpenRLHF", "SkyRL", "AReaL"])
def test_the_frameworks_rows_are_the_csvs(name, grid):
    envs = environments.envs_folder()
    assert envs.is_dir(), f"{envs} does not exist: {environments.SETUP} {envs}"
    fresh = table.framework_rows(name, *grid, envs=envs)
    assert all(r["status"] == table.SCORED for r in fresh), [r["status"] for r in fresh][:1]
    assert_same_rows(fresh, [r for r in table.read_csv(CSV) if r["framework"] == name])
