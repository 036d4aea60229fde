"""The tiny task and the locally built assets (uses the shared, cached build)."""

import json
import random

import pandas as pd
import pytest

from rpg.tiny import build_tiny_assets, task
from rpg.tiny.build import builder_key


def test_splits_are_disjoint_and_cover_all_pairs():
    train, val = task.split_pairs(seed=3, n_val=30)
    assert len(val) == 30 and not set(train) & set(val)
    assert sorted(train + val) == task.all_pairs()
    assert task.split_pairs(seed=3, n_val=30) == (train, val)
    with pytest.raises(ValueError, match="n_val"):
        task.split_pairs(seed=3, n_val=100)


def test_warm_up_targets_mix_correct_bad_format_and_off_by_one():
    from verl.utils.reward_score import default_compute_score

    rng = random.Random(0)
    targets = [(a, b, task.noisy_response(a, b, rng)) for _ in range(100) for a, b in task.all_pairs()]
    correct = sum(y == task.response(a + b) for a, b, y in targets) / len(targets)
    bad_format = sum(y == task.bad_format(a, b) for a, b, y in targets) / len(targets)
    assert abs(correct - task.P_CORRECT) < 0.02 and abs(bad_format - task.P_BAD_FORMAT) < 0.02
    for a, b, y in targets[:300]:  # only the correct, well-formatted target earns +1 from verl's scorer
        score = default_compute_score(task.DATA_SOURCE, y, str(a + b))["score"]
        assert score == (1.0 if y == task.response(a + b) else -1.0)
        if y.startswith("Answer:"):
            assert abs(int(y.split()[-1]) - (a + b)) <= 1


def test_rows_are_scored_by_verls_dapo_math_scorer(tiny_assets):
    from verl.utils.reward_score import default_compute_score

    df = pd.read_parquet(tiny_assets.train_file)
    row = df.iloc[0]
    a, b = int(row.extra_info["a"]), int(row.extra_info["b"])
    assert row.data_source == "math_dapo"
    assert row.reward_model["ground_truth"] == str(a + b)
    assert "Answer: $Answer" in row.prompt[0]["content"]
    good = default_compute_score(row.data_source, task.response(a + b), row.reward_model["ground_truth"])
    bad = default_compute_score(row.data_source, task.response(a + b + 1), row.reward_model["ground_truth"])
    assert (good["score"], good["acc"], bad["score"], bad["acc"]) == (1.0, True, -1.0, False)


def test_train_and_val_files_hold_disjoint_problems(tiny_assets):
    key = lambda df: {(int(e["a"]), int(e["b"])) for e in df.extra_info}  # noqa: E731
    train, val = pd.read_parquet(tiny_assets.train_file), pd.read_parquet(tiny_assets.val_file)
    assert len(train) + len(val) == 100 and not key(train) & key(val)


def test_tokenizer_and_model(tiny_assets):
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_assets.model_dir)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert [tok.decode([t]) for t in tok.encode("Answer: 13", add_special_tokens=False)][-2:] == ["1", "3"]
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    cfg = AutoConfig.from_pretrained(tiny_assets.model_dir)
    assert cfg.model_type == "qwen2" and cfg.eos_token_id == tok.eos_token_id
    info = json.loads((tiny_assets.root / "build.json").read_text())
    assert 1e5 < info["n_params"] < 5e6
    assert info["builder_key"] == builder_key() == tiny_assets.root.name


def test_cached_build_is_reused(tiny_assets):
    stamp = (tiny_assets.root / "build.json").stat().st_mtime_ns
    again = build_tiny_assets(tiny_assets.root.parent)
    assert again == tiny_assets and (again.root / "build.json").stat().st_mtime_ns == stamp


def test_warm_up_loss_equals_the_masked_model_loss():
    """The build's cheaper loss (no attention mask, LM head on labelled positions only) is the same
    loss, and has the same gradient, as transformers' masked causal-LM loss on right-padded rows."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rpg.tiny.warm_up import MODEL_KW, response_nll

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=300, pad_token_id=0, **{**MODEL_KW, "hidden_size": 64}))
    lengths = torch.tensor([12, 9, 7, 12])
    mask = (torch.arange(12)[None] < lengths[:, None]).long()
    ids = torch.randint(1, 300, (4, 12)).masked_fill(mask == 0, 0)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :5] = -100  # the prompt
    ours = response_nll(model, ids, labels)
    reference = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(ours, reference, rtol=1e-6, atol=1e-6)
    g_ours = torch.autograd.grad(ours, list(model.parameters()))
    g_ref = torch.autograd.grad(reference, list(model.parameters()), allow_unused=True)
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, torch.zeros_like(a) if b is None else b, rtol=1e-5, atol=1e-7)


def test_concurrent_builds_build_once_and_never_remove_a_published_build(tmp_path, monkeypatch):
    """Two callers at once (pytest-xdist workers, two launchers): one builds under the cache's lock,
    the other waits and reuses that build. Without the lock both built (a minute of CPU each on a
    loaded machine) and the later one could delete the build the first was already using."""
    import shutil
    import threading
    import time

    from rpg.tiny import build as tiny_build

    built = []

    def fake_build(out, log=lambda message: None):  # the files `complete()` looks for, slowly
        built.append(out)
        time.sleep(1.0)
        (out / "model").mkdir()
        for name in ("model/config.json", "train.parquet", "val.parquet", "build.json"):
            (out / name).write_text("{}")
        shutil.copyfile(tiny_build.WEIGHTS_DIR / "model.safetensors", out / "model" / "model.safetensors")

    monkeypatch.setattr(tiny_build, "_build_into", fake_build)
    (tmp_path / ".rpg-build-killed_0").mkdir()  # a killed builder's temporary directory
    (tmp_path / ".build-output").mkdir()  # another tool's, in a shared cache root: kept
    (tmp_path / ".build-output" / "result.txt").write_text("someone's")
    results, errors = [], []

    def call():
        try:
            results.append(build_tiny_assets(tmp_path, quiet=True))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(results) == 3 and len(set(results)) == 1 and results[0].complete()
    assert len(built) == 1, built
    # no temporary left, and nothing else removed
    assert sorted(p.name for p in tmp_path.iterdir()) == [".build-output", ".build.lock", builder_key()]
    assert (tmp_path / ".build-output" / "result.txt").read_text() == "someone's"


# ---- the shipped weights: the same bits on every machine ----

def test_the_build_holds_the_shipped_files_byte_for_byte(tiny_assets):
    from rpg.run_record import file_sha256, weights_digest
    from rpg.tiny.build import WEIGHTS_DIR, read_manifest

    manifest = read_manifest()
    assert sorted(p.name for p in tiny_assets.model_dir.iterdir()) == sorted(manifest["files"])
    for name, digest in manifest["files"].items():
        assert file_sha256(tiny_assets.model_dir / name) == file_sha256(WEIGHTS_DIR / name) == digest, name
    info = json.loads((tiny_assets.root / "build.json").read_text())
    assert info["weights_sha256"] == weights_digest(tiny_assets.model_dir) == manifest["files"]["model.safetensors"]
    assert info["made"]["kernels"]["capability"] and info["made"]["libraries"]["torch"]  # where the bits were made


def _shipped_copy(tmp_path, monkeypatch):
    """The shipped folder and manifest copied to ``tmp_path``, the builder pointed at the copies."""
    import shutil

    from rpg.tiny import build as tiny_build

    weights, manifest = tmp_path / "weights", tmp_path / "weights.json"
    shutil.copytree(tiny_build.WEIGHTS_DIR, weights)
    shutil.copyfile(tiny_build.MANIFEST, manifest)
    monkeypatch.setattr(tiny_build, "WEIGHTS_DIR", weights)
    monkeypatch.setattr(tiny_build, "MANIFEST", manifest)
    return weights, manifest


def test_a_changed_shipped_file_is_refused_in_one_line_naming_both_digests(tmp_path, monkeypatch):
    from rpg.run_record import file_sha256
    from rpg.tiny.build import TinyBuildError, read_manifest

    weights, _ = _shipped_copy(tmp_path, monkeypatch)
    blob = bytearray((weights / "model.safetensors").read_bytes())
    blob[-1] ^= 1  # one bit of the last weight
    (weights / "model.safetensors").write_bytes(bytes(blob))
    cache = tmp_path / "cache"
    with pytest.raises(TinyBuildError) as e:
        build_tiny_assets(cache, quiet=True)
    line = str(e.value)
    assert "\n" not in line and "model.safetensors" in line
    assert file_sha256(weights / "model.safetensors")[:12] in line
    assert read_manifest()["files"]["model.safetensors"][:12] in line
    assert [p.name for p in cache.iterdir()] == [".build.lock"]  # nothing published
    (weights / "extra.bin").write_bytes(b"x")  # a file the manifest does not name
    with pytest.raises(TinyBuildError, match="extra.bin"):
        build_tiny_assets(cache, quiet=True)


def test_a_cached_build_changed_after_it_was_built_is_refused(tmp_path):
    from rpg.tiny.build import TinyBuildError

    assets = build_tiny_assets(tmp_path, quiet=True)
    blob = bytearray((assets.model_dir / "model.safetensors").read_bytes())
    blob[-1] ^= 1
    (assets.model_dir / "model.safetensors").write_bytes(bytes(blob))
    with pytest.raises(TinyBuildError, match="changed after it was built"):
        build_tiny_assets(tmp_path, quiet=True)
    assert build_tiny_assets(tmp_path, quiet=True, force=True).complete()  # built again: the shipped bits


def test_the_cache_key_covers_the_weights_manifest(tmp_path):
    import shutil

    from rpg.tiny import build as tiny_build

    for name in tiny_build.BUILDER_SOURCES:
        shutil.copyfile(tiny_build.WEIGHTS_DIR.parent / name, tmp_path / name)
    assert builder_key(tmp_path) == builder_key()
    manifest = json.loads((tmp_path / "weights.json").read_text())
    manifest["files"]["model.safetensors"] = "0" * 64  # other weights
    (tmp_path / "weights.json").write_text(json.dumps(manifest))
    assert builder_key(tmp_path) != builder_key()


def test_regenerate_replaces_only_the_manifests_files_and_logs_the_reason(tmp_path, monkeypatch):
    """``python -m rpg.tiny.regenerate`` with the warm-up replaced by one that writes two small files: the shipped
    files named in the manifest are replaced, the manifest and the reference log say what and why; the same weights
    again change nothing; a file the manifest does not name stops it before anything changes."""
    from rpg.run_record import file_sha256
    from rpg.tiny import regenerate as regen
    from rpg.tiny import warm_up

    weights, manifest = _shipped_copy(tmp_path, monkeypatch)
    monkeypatch.setattr(regen, "WEIGHTS_DIR", weights)
    monkeypatch.setattr(regen, "MANIFEST", manifest)
    monkeypatch.setattr("rpg.paths.checkout.CHECKOUT", tmp_path)
    (tmp_path / "docs").mkdir()

    def made(model_dir, log):
        (model_dir / "model.safetensors").write_bytes(b"new weights")
        (model_dir / "config.json").write_text("{}")
        return {"sft_final_loss": 0.5}

    monkeypatch.setattr(warm_up, "make_model", made)
    assert regen.main(["--reason", "a test of the regeneration"]) == 0
    assert sorted(p.name for p in weights.iterdir()) == ["config.json", "model.safetensors"]
    record = json.loads(manifest.read_text())
    assert record["files"]["model.safetensors"] == file_sha256(weights / "model.safetensors")
    assert record["made"]["sft_final_loss"] == 0.5 and record["made"]["kernels"]["capability"]
    log = (tmp_path / "docs" / "reference-log.md").read_text()
    assert "a test of the regeneration" in log and record["files"]["model.safetensors"][:12] in log
    assert regen.regenerate("again", log=lambda line: None) is False  # the same weights: nothing changed
    assert log == (tmp_path / "docs" / "reference-log.md").read_text()
    monkeypatch.setattr(warm_up, "make_model", lambda d, log: (d / "model.safetensors").write_bytes(b"other") and {})
    (weights / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="notes.txt"):
        regen.regenerate("third", log=lambda line: None)
    assert (weights / "notes.txt").read_text() == "mine" and (weights / "model.safetensors").read_bytes() == b"new weights"
    with pytest.raises(SystemExit):
        regen.main(["--reason", " "])  # no reason, no change
