"""`eaglewire data ...` end to end on a tiny target: build, info JSON, bad input."""

import json

from eaglewire.data.pipeline import info

# in process: a subprocess per call re-imports torch (seconds each, 7 calls in the repair test)
from eaglewire_testing.cli import run_cli


def test_info_json_keys(tiny_dataset):
    r = run_cli("data", "info", str(tiny_dataset), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for k in ("points", "num_samples", "num_tokens", "target_fingerprint", "vocab"):
        assert k in d
    assert d["vocab"]["size"] == 200 and 0 < d["vocab"]["coverage"] <= 1
    assert d["points"]["names"] == ["layers.1.out", "layers.3.out", "layers.4.out"]
    assert d["points"]["sglang"] == [1, 3, 4] and d["points"]["vllm"] == [2, 4, 5]
    assert d["generation"]["temperature"] == 0.0 and d["num_samples"] == 24
    h = run_cli("data", "info", str(tiny_dataset))
    assert "layers.3.out" in h.stdout and "coverage" in h.stdout


def test_build_reports_skips_and_refuses_malformed(tmp_path):
    good = tmp_path / "p.jsonl"
    long_prompt = "word " * 400
    good.write_text("\n".join(json.dumps(x) for x in [
        {"prompt": "Hello there"}, {"prompt": "Hello there"},  # duplicate
        {"conversations": [{"from": "human", "value": "Tell me a joke"}, {"from": "gpt", "value": "No."}]},
        {"messages": [{"role": "user", "content": "What is 2+2?"}]},
        {"prompt": long_prompt},
    ]) + "\n")
    out = tmp_path / "ds"
    r = run_cli("data", "build", "--target", "tiny:qwen3", "--prompts", str(good), "--out", str(out), "--max-new-tokens", "8",
                "--max-prompt-tokens", "128", "--vocab-size", "50", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["generate"]["prompts"]["duplicates"] == 1 and res["generate"]["skipped_long"] == 1
    assert res["generate"]["responses"] == 3 and info(out)["num_samples"] == 3
    r = run_cli("data", "build", "--target", "tiny:qwen3", "--prompts", str(good), "--out", str(out), "--device", "cpu")
    assert r.returncode == 2 and "already holds" in r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": oops}\n')
    r = run_cli("data", "build", "--target", "tiny:qwen3", "--prompts", str(bad), "--out", str(tmp_path / "x"), "--device", "cpu")
    assert r.returncode == 2 and f"{bad}:2" in r.stderr and "Traceback" not in r.stderr


def _hinted_command(stderr: str) -> list[str]:
    """The `eaglewire ...` command a message tells the user to run, split into argv."""
    import re
    import shlex

    m = re.search(r"`(eaglewire [^`]+)`", stderr)
    assert m, stderr
    return shlex.split(m.group(1))[1:]


def _features(d):
    from eaglewire.data.dataset import FeatureDataset

    ds = FeatureDataset(d)
    import torch

    by_index = {}
    for k, sh in enumerate(ds.manifest.shards):
        for j, idx in enumerate(sh["indices"]):
            by_index[idx] = ds[ds._starts[k] + j]["features"].to(torch.float32)
    return by_index


def test_bad_or_missing_shards_are_re_extracted_by_following_the_hint(tiny_dataset, tmp_path):
    import shutil


    d = tmp_path / "ds"
    shutil.copytree(tiny_dataset, d)
    (d / ".eaglewire.lock").unlink(missing_ok=True)
    ref = _features(d)
    assert len(list(d.glob("shard-*.safetensors"))) >= 3
    for damage in ("delete", "flip", "truncate"):
        victim = sorted(d.glob("shard-*.safetensors"))[1]  # a repaired shard takes the next free number
        if damage == "delete":
            victim.unlink()
        else:
            data = bytearray(victim.read_bytes())
            if damage == "flip":
                data[len(data) // 2] ^= 0xFF
                victim.write_bytes(bytes(data))
            else:
                victim.write_bytes(bytes(data[: len(data) // 3]))
        r = run_cli("data", "info", str(d))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        fix = run_cli(*_hinted_command(r.stderr))  # word for word
        assert fix.returncode == 0, (damage, fix.stderr)
        assert "re-extracting the samples of 1 bad shard" in fix.stdout + fix.stderr
        got = _features(d)  # verifies every checksum on open
        assert set(got) == set(ref)
        # Re-extracted in other batches (other padding, other kernel blockings): float rounding, which a random
        # tiny model can amplify in a near-cancelling element (seen: one of 13,632 elements off by 3e-4 of its
        # slot's scale); a wrong sample, token or slot is off by the scale itself.
        for i in ref:
            scale = ref[i].abs().amax(dim=(0, 2), keepdim=True)  # [1, slots, 1]
            err = (got[i] - ref[i]).abs()  # [T, slots, H]
            assert (err <= 1e-3 * scale).all() and (err > 1e-5).float().mean() < 1e-3, (damage, i, err.max().item())
    # `data build --resume` repairs too instead of dying on the missing file
    victim = sorted(d.glob("shard-*.safetensors"))[0]
    victim.unlink()
    prompts = tmp_path / "unused.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    r = run_cli("data", "build", "--out", str(d), "--target", "tiny:llama", "--prompts", str(prompts), "--resume",
                "--device", "cpu", "--vocab-size", "200", "--json")
    assert r.returncode == 0, r.stderr
    assert set(_features(d)) == set(ref)
