"""The GPU kit's tests never read the vLLM site a real node's parts were installed into: each test gets an empty one
of its own (``RPG_GPU_KIT_VLLM_SITE``, rpg.gpu_kit.vllm_install.SITE_ENV), which a test may set again."""

from __future__ import annotations

import pytest

from rpg.gpu_kit.vllm_install import SITE_ENV


@pytest.fixture(autouse=True)
def own_vllm_site(tmp_path_factory, monkeypatch):
    monkeypatch.setenv(SITE_ENV, str(tmp_path_factory.mktemp("no-vllm-site")))
