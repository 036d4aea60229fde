"""A lost node does not stop an elastic run in ``colocate_async`` and ``separate_async`` (the replay buffer resumed at
each restart and at the grow; ``separate_async`` on three nodes, one kept for its rollout pool): the loopback run of
tests/e2e/test_elastic.py (its helpers, the same checks) on a loopback cluster of this file's own, so that the
distributed stage's two workers run this file and that one side by side.

Distributed stage (``pytest -m distributed --distributed``): a few minutes of trainer launches.
"""

from __future__ import annotations

import pytest
from test_elastic import lost_node_restart_and_grow

from multinode import loopback_cluster, loopback_marks

pytestmark = loopback_marks(pytest.mark)


@pytest.fixture(scope="module")
def cluster():
    with loopback_cluster("rpgea", port=47479, dashboard_port=49365) as c:
        yield c


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_a_lost_node_restarts_the_async_run_on_the_node_left_and_it_grows_back(cluster, tmp_path, mode):
    lost_node_restart_and_grow(cluster, tmp_path, mode)
