"""`eaglewire plan`: its figures checked against real artifacts made here.

Disk against the bytes of shards written by a real extraction, parameter counts
against models actually allocated, the KV-cache estimate against the cache a
real forward builds. The plan computes from the config alone; the references
below load or build the real thing.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from eaglewire.cli import app
from eaglewire.drafter import DrafterConfig, Eagle3Drafter
from eaglewire.plan.config import PlanConfig
from eaglewire.plan.estimate import disk_estimate, plan


def _plan(*args) -> dict:
    r = CliRunner().invoke(app, ["plan", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_disk_estimate_matches_real_shard_bytes(dtype, tmp_path):
    from eaglewire_testing.tinydata import build_tiny_dataset

    d = build_tiny_dataset(tmp_path, n=24, max_new_tokens=24, store_dtype=dtype)  # 3 shards of 8 samples
    man = json.loads((d / "manifest.json").read_text())
    actual = sum((d / e["file"]).stat().st_size for e in man["shards"])
    H = man["target"]["fingerprint"]["hidden_size"]
    est = disk_estimate(H, len(man["points"]["names"]), dtype, man["num_tokens"], man["num_samples"], 8)
    assert est["num_shards"] == len(man["shards"])
    assert abs(est["shard_bytes"] - actual) / actual < 0.02, (est, actual)
    # the command states the same bytes per token for this target and dtype
    per_tok = _plan("--target", "tiny:llama", "--samples", "24", "--seq-len", "64", "--store-dtype", dtype)
    assert per_tok["disk"]["bytes_per_token"] == est["bytes_per_token"]


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_param_count_from_config_equals_the_real_model(arch, tiny_targets):
    t = tiny_targets[arch]
    real = sum(p.numel() for p in t.model.parameters())
    r = _plan("--model-config", str(t.path / "config.json"), "--samples", "10", "--seq-len", "32", "--device", "cpu")
    assert r["target"]["num_parameters"] == real
    assert r["target"]["formula_parameters"] == real  # the fallback formula agrees on these archs
    assert r["device_memory"]["target_weights"] == real * 4  # fp32 on cpu
    assert _plan("--target", f"tiny:{arch}", "--samples", "10", "--seq-len", "32")["target"]["num_parameters"] == real


def _moe_configs():
    from transformers import MixtralConfig, Qwen3MoeConfig

    return {
        "mixtral": MixtralConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=5,
                                 num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
        "qwen3_moe": Qwen3MoeConfig(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                    num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    num_experts=8, num_experts_per_tok=2, mlp_only_layers=[1]),
    }


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_moe_config_param_count(name, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = _moe_configs()[name]
    cfg.to_json_file(str(tmp_path / "config.json"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)  # allocated for real (tiny): the reference
    real = sum(p.numel() for p in model.parameters())
    r = _plan("--model-config", str(tmp_path / "config.json"), "--samples", "10", "--seq-len", "32")
    t = r["target"]
    n = 4 if name == "mixtral" else 8
    assert t["num_parameters"] == real and t["num_experts"] == n and t["experts_per_token"] == 2
    # active = total minus the routed experts a token does not use: (n - k) experts of 3 H I each per MoE layer
    I_e = cfg.intermediate_size if name == "mixtral" else cfg.moe_intermediate_size
    moe_layers = 5 if name == "mixtral" else 4  # qwen3_moe: layer 1 is dense (mlp_only_layers)
    assert t["active_parameters"] == real - moe_layers * (n - 2) * 3 * 64 * I_e
    assert any("MoE" in a for a in r["assumptions"])


def test_unknown_architecture_falls_back_to_the_formula(tmp_path, tiny_targets):
    raw = json.loads((tiny_targets["llama"].path / "config.json").read_text())
    raw.update(model_type="somebody_elses_arch", architectures=["SomebodyElsesForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(raw))
    r = _plan("--model-config", str(tmp_path), "--samples", "10", "--seq-len", "32")
    assert r["target"]["method"] == "formula"
    assert r["target"]["num_parameters"] == sum(p.numel() for p in tiny_targets["llama"].model.parameters())
    assert any("hidden_size" in a and "num_key_value_heads" in a for a in r["assumptions"])


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_kv_cache_estimate_matches_a_real_cache(arch, tiny_targets):
    t = tiny_targets[arch]
    B, T = 3, 20
    with torch.no_grad():
        out = t.model(torch.randint(0, 100, (B, T)), use_cache=True)
    cache = out.past_key_values
    real = sum(x.numel() * x.element_size() for layer in cache.layers for x in (layer.keys, layer.values))
    r = plan(PlanConfig(target=f"tiny:{arch}", samples=10, seq_len=T, gen_batch_size=B, device="cpu"))
    assert r["device_memory"]["generate_kv_cache"] == real


def test_plan_reads_no_weights_and_states_its_assumptions(tiny_targets):
    r = plan(PlanConfig(target="tiny:llama", samples=1000, seq_len=512, device="cuda", gpus=2, epochs=2))
    assert r["estimate"] is True and len(r["assumptions"]) >= 6
    off, on = r["time"]["offline"], r["time"]["online"]
    # epochs=2: the online path runs the target forward twice, the offline path once
    assert on["target_forward_h"] == pytest.approx(2 * off["extract_h"])
    assert r["disk"]["online_total_bytes"] < r["disk"]["offline_total_bytes"]
    assert r["device_memory"]["online_train"] > r["device_memory"]["train_drafter"]


def test_cpu_rates_are_the_measured_figures_on_the_measured_target(default_target):
    """On the default target (where they were measured) the CPU rates are the constants themselves."""
    from eaglewire.plan.estimate import (
        CPU_EXTRACT_TOK_S,
        CPU_GEN_TOK_S,
        CPU_REF_DRAFTER_MATMUL,
        CPU_REF_PARAMS,
        CPU_TRAIN_TOK_S,
    )

    assert CPU_REF_PARAMS == sum(p.numel() for p in default_target.model.parameters())
    r = plan(PlanConfig(target="default", samples=10, seq_len=256, device="cpu", gen_batch_size=64, ttt_steps=7,
                        vocab_size=8192))
    assert r["drafter"]["matmul_parameters"] == CPU_REF_DRAFTER_MATMUL
    rates = r["time"]["rates_tokens_per_s_per_device"]
    assert rates == {"generate": CPU_GEN_TOK_S[64], "extract": CPU_EXTRACT_TOK_S, "train": CPU_TRAIN_TOK_S,
                     "prefill": CPU_EXTRACT_TOK_S}


def test_a_gguf_target_is_sized_without_converting_it(default_target, tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLEWIRE_CACHE", str(tmp_path / "cache"))  # no converted copy to read the config from
    r = plan(PlanConfig(target="default", samples=10, seq_len=64))
    assert r["target"]["num_parameters"] == sum(p.numel() for p in default_target.model.parameters())
    assert not (tmp_path / "cache" / "targets").exists()  # nothing was converted (no weights read)


def test_a_stage_that_does_not_fit_one_device_is_sharded_and_the_table_prints(tiny_targets):
    one = plan(PlanConfig(target="tiny:llama", samples=10, seq_len=64, device_memory_gib=1e-4))
    four = plan(PlanConfig(target="tiny:llama", samples=10, seq_len=64, device_memory_gib=1e-4, gpus=4))
    assert not one["fits_one_device"]["generate"]
    assert four["device_memory"]["generate"] == pytest.approx(one["device_memory"]["generate"] / 4)
    assert four["device_memory"]["train_drafter"] == one["device_memory"]["train_drafter"]  # replicated
    r = CliRunner().invoke(app, ["plan", "--target", "tiny:llama", "--samples", "10", "--seq-len", "64"])
    assert r.exit_code == 0 and "disk: feature shards" in r.output and "assumptions:" in r.output


@pytest.mark.parametrize("change,msg", [
    ({"num_hidden_layers": 10_000_000}, r"num_hidden_layers = 10000000: expected an integer in \[1, 10000\]"),
    ({"num_attention_heads": 0}, "num_attention_heads = 0"),
    ({"hidden_size": "abc"}, "hidden_size = 'abc'"),
    ({"hidden_size": float("inf")}, "hidden_size = inf"),
    ({"vocab_size": float("nan")}, "vocab_size = nan"),
    ({"num_local_experts": 4, "num_experts_per_tok": 8}, r"num_experts_per_tok = 8: expected an integer in \[1, 4\]"),
    ({"kv_lora_rank": 16, "qk_rope_head_dim": None}, "qk_rope_head_dim missing"),
])
def test_bad_config_fields_are_one_line_and_bounded(tmp_path, tiny_targets, change, msg):
    """A config with 10^7 layers used to grow memory without bound; NaN, 0 heads or text a traceback."""
    from eaglewire.infra.errors import EaglewireError
    from eaglewire.plan.shape import formula_count

    raw = json.loads((tiny_targets["llama"].path / "config.json").read_text())
    raw.update(model_type="somebody_elses_arch", **change)
    with pytest.raises(EaglewireError, match=msg):
        formula_count(raw, "config.json")


def _deepseek_v3_full(tmp_path):
    """DeepSeek-V3's published shape (671B): the target the capture-path verdict exists for."""
    cfg = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 129280,
           "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
           "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
           "num_experts_per_tok": 8, "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
           "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "n_group": 8, "topk_group": 4,
           "max_position_embeddings": 163840, "tie_word_embeddings": False}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_device_auto_is_what_every_command_picks_and_cuda_sizes_without_a_gpu(tiny_targets):
    """auto resolves as elsewhere (infra.device), and says so; cuda needs no GPU here: plan only sizes."""
    from eaglewire.infra.device import auto_device_type

    auto = plan(PlanConfig(target="tiny:llama", samples=10, seq_len=64))
    assert auto["run"]["device_type"] == auto_device_type()
    assert auto["assumptions"][0].startswith(f"--device auto: sized for {auto_device_type()}")
    cuda = plan(PlanConfig(target="tiny:llama", samples=10, seq_len=64, device="cuda"))
    assert cuda["run"]["device_type"] == "cuda" and cuda["device_memory"]["bytes_per_weight"] == 2
    assert not cuda["assumptions"][0].startswith("--device auto")


def test_capture_path_in_process_when_one_device_holds_the_target():
    r = _plan("--target", "tiny:llama", "--samples", "10", "--seq-len", "64", "--device", "cuda", "--gpus", "8")
    assert r["capture"]["path"] == "in process" and "torchrun --nproc_per_node 8" in r["capture"]["command"]


@pytest.mark.parametrize("per_node,memory,path,tp,pp,nodes", [(16, 141, "vllm", 16, 1, 1),
                                                              (8, 141, "vllm multi-node", 8, 2, 2),
                                                              (8, 80, "vllm multi-node", 8, 3, 3)])
def test_capture_path_for_a_671b_target_is_vllm_tensor_and_expert_parallel(tmp_path, per_node, memory, path, tp, pp,
                                                                           nodes):
    r = _plan("--model-config", str(_deepseek_v3_full(tmp_path)), "--samples", "1000", "--seq-len", "2048",
              "--device", "cuda", "--gpus", "32", "--gpus-per-node", str(per_node),
              "--device-memory-gib", str(memory))
    c = r["capture"]
    assert r["target"]["num_parameters"] > 600e9
    assert r["device_memory"]["extract_in_process"] > memory * 2**30  # no torchrun rank holds a whole copy
    # bf16 weights (no quantization_config here: 1,250 GiB), 90% of a device usable, MLA's latent cache
    # (64 x 2048 tokens x 61 layers x 576 x 2 B = 8.6 GiB) on every TP rank: on 141 GiB, TP 8 holds 156 GiB
    # of weights per device (no), TP 16 78 (yes), two 8-GPU nodes split by PP 2: 78 (yes); on 80 GiB (72
    # usable) PP 2 needs 78 + 4.3 + 2 (no), PP 3 52 + 2.9 + 2 (yes). TP stays inside a node, PP spans nodes.
    assert (c["path"], c["tensor_parallel_size"], c["pipeline_parallel_size"], c["nodes"]) == (path, tp, pp, nodes)
    assert c["expert_parallel_size"] == tp  # 256 experts spread over the TP group
    assert "--engine vllm" in c["command"] and "--enable-expert-parallel" in c["command"]
    assert ("--pipeline-parallel-size" in c["command"]) == (pp > 1)
    assert c["devices_needed"] * memory * 2**30 >= r["device_memory"]["target_weights"]


def _llama_8b(tmp_path):
    """Llama-3-8B's published shape: the target a first day on an 8-GPU node trains for."""
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "tie_word_embeddings": False, "max_position_embeddings": 8192}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_cpu_fits_verdict_is_against_this_machines_ram(monkeypatch, tiny_targets):
    """--device cpu runs in the host's RAM: an 80 GiB GPU figure would tell a laptop a wrong "fits"."""
    from eaglewire.plan import estimate

    stages = ("generate", "extract", "train_drafter", "online_train")
    monkeypatch.setattr(estimate, "host_ram_bytes", lambda: 1000)  # a machine with 1000 bytes of RAM
    small = plan(PlanConfig(target="tiny:llama", samples=10, seq_len=64, device="cpu"))
    assert small["run"]["device_memory_bytes"] == 1000 and small["run"]["device_memory_source"] == "host RAM"
    assert not any(small["fits_one_device"][k] for k in stages)  # a tiny target fits 80 GiB, not 1000 B
    assert any("this machine's RAM" in a for a in small["assumptions"])
    big = 2 * small["device_memory"]["online_train"]
    monkeypatch.setattr(estimate, "host_ram_bytes", lambda: big)
    r = plan(PlanConfig(target="tiny:llama", samples=10, seq_len=64, device="cpu"))
    assert r["run"]["device_memory_bytes"] == big and all(r["fits_one_device"][k] for k in stages)
    given = plan(PlanConfig(target="tiny:llama", samples=10, seq_len=64, device="cpu", device_memory_gib=1e-6))
    assert given["run"]["device_memory_bytes"] == pytest.approx(1e-6 * 2**30)  # the flag wins over the RAM
    assert given["run"]["device_memory_source"] == "--device-memory-gib"
    cuda = plan(PlanConfig(target="tiny:llama", samples=10, seq_len=64, device="cuda"))
    assert cuda["run"]["device_memory_bytes"] == 79.6 * 2**30  # a GPU is not the host: an H100's, said assumed
    assert cuda["run"]["device_assumed"] and any("ASSUMED an H100" in a for a in cuda["assumptions"])
    out = CliRunner().invoke(app, ["plan", "--target", "tiny:llama", "--samples", "10", "--seq-len", "64",
                                   "--device", "cpu"]).output
    assert "DOES NOT FIT" not in out and "this machine's RAM" in out


def test_host_ram_is_read_from_this_machine():
    import os

    from eaglewire.plan.estimate import host_ram_bytes

    assert host_ram_bytes() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_host_memory_is_per_rank_and_the_node_total_counts_every_rank(tmp_path):
    """Extraction in process loads the whole target per rank; training reads only embedding, lm_head and
    fingerprint from it (issue 57: 3.74 TiB per rank for Kimi was the whole target in fp32), so a training rank
    holds the drafter, its AdamW moments, the target's lm_head and one batch of features."""
    args = ["--model-config", str(_llama_8b(tmp_path)), "--samples", "10000", "--device", "cuda",
            "--vocab-size", "32000"]
    r = _plan(*args, "--gpus", "16", "--gpus-per-node", "8")
    hm, n = r["host_memory"], r["target"]["num_parameters"]
    assert hm["per"] == "rank" and hm["ranks_per_node"] == 8  # min(--gpus, --gpus-per-node)
    assert hm["node_train"] == 8 * hm["train"] and hm["node_extract"] == 8 * hm["extract"]
    # what train builds for Llama-3-8B (draft vocab 32,000), its weights counted on a real module
    with torch.device("meta"):
        drafter = Eagle3Drafter(DrafterConfig(
            hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            rms_norm_eps=1e-5, rope_theta=1e4, max_position_embeddings=8192, target_hidden_size=4096,
            vocab_size=128256, draft_vocab_size=32000))
    params = sum(p.numel() for p in drafter.parameters())
    trainable = params - drafter.embed_tokens.weight.numel()
    batch = 4 * 2048 * 4 * 4096 * 2  # train's --batch-size 4 x 2048 tokens x (3 points + final) x H x bf16
    assert hm["train"] == params * 4 + trainable * 8 + 128256 * 4096 * 4 + batch
    assert hm["train"] < n * 2  # less than the target's own bf16 weights: the target is never loaded
    assert hm["extract"] >= n * 2  # bf16 on the host while loading, before it moves to the device
    assert _plan(*args, "--gpus", "2")["host_memory"]["ranks_per_node"] == 2
    out = CliRunner().invoke(app, ["plan", *args, "--gpus", "8"]).output
    assert "host per rank: extract / train" in out and "host per node (8 ranks): extract / train" in out
    assert any("host memory is per rank" in a for a in r["assumptions"])


def test_plan_sizes_the_training_run_train_makes():
    """plan's training defaults are train's, and it says which --max-len training truncates to."""
    from types import SimpleNamespace

    from eaglewire.training.config import TrainConfig

    fields = TrainConfig.__dataclass_fields__
    train = SimpleNamespace(epochs=fields["epochs"].default, max_len=fields["max_len"].default)
    assert PlanConfig().epochs == train.epochs and PlanConfig().max_len == train.max_len
    r = plan(PlanConfig(target="tiny:llama", samples=10, seq_len=2048))
    assert r["run"]["epochs"] == train.epochs and r["run"]["max_len"] == train.max_len
    assert r["run"]["train_tokens_per_epoch"] == 10 * train.max_len
    assert any(f"--max-len {train.max_len}" in a and "--seq-len 2048" in a for a in r["assumptions"])


def test_mla_prefill_flops_count_the_score_and_value_dims_not_hidden_over_heads(tmp_path):
    """DeepSeek-V3 attends over qk_nope+qk_rope = 192 dims and values of 128, not hidden/heads = 56: a hand
    count of one prefill token (2 flops per active parameter, plus T/2 keys x heads x (192 + 128) x 2 flops
    per layer) is what the GPU prefill rate divides by."""
    from eaglewire.plan.estimate import MFU_PREFILL, _gpu_rates
    from eaglewire.plan.shape import target_shape

    raw = json.loads(_deepseek_v3_full(tmp_path).read_text())
    s = target_shape(raw, "config.json")
    assert (s["qk_head_dim"], s["v_head_dim"], s["head_dim"]) == (192, 128, 56)
    cfg = PlanConfig(hf_config=tmp_path / "config.json", device="cuda", gpu_tflops=989.0, gpu_bandwidth_gbs=4800.0)
    T = 2048
    hand = 2 * s["active_parameters"] + 61 * (T / 2) * 128 * (192 + 128) * 2
    got = _gpu_rates(cfg, {**s, "weight_bytes": 0, "weight_groups": {"routed_experts": {"bytes": 0}}}, T)["prefill"]
    assert got == pytest.approx(cfg.gpu_tflops * 1e12 * MFU_PREFILL / hand, rel=1e-12)
