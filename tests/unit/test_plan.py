"""Planner: parallel sizes, ranks, memory fit and refusals that name the smallest fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2provision import catalog
from k2provision.errors import K2Error, PlanError
from k2provision.inventory import load_cluster
from k2provision.plan import build_plan, plan_digest

ROOT = Path(__file__).resolve().parents[2]


def nodes_inventory(tmp_path: Path, n: int, engine: str, layout: str, extra: str = "") -> Path:
    hosts = "".join(f"n{i} ansible_host=10.9.0.{i}\n" for i in range(1, n + 1))
    path = tmp_path / "inv.ini"
    path.write_text(f"[nodes]\n{hosts}[all:vars]\nk2_engine={engine}\nk2_layout={layout}\n{extra}")
    return path


def test_model_numbers_match_kimi_k2() -> None:
    spec = catalog.model("moonshotai/Kimi-K2-Instruct")
    assert 1.02e12 < catalog.total_params(spec) < 1.035e12
    total_gib = (catalog.routed_expert_bytes(spec) + catalog.dense_bytes(spec)) / catalog.GIB
    assert abs(total_gib - spec.checkpoint_gib) / spec.checkpoint_gib < 0.01
    # MLA: 512 latent + 64 rope values per token per layer, BF16.
    assert catalog.kv_bytes_per_token_per_layer(spec) * spec.num_hidden_layers == 70272


def test_prod_plan_is_the_seed_4p12d_layout() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    prefill, decode = plan.pools
    assert (prefill.parallel.tp, prefill.parallel.dp, prefill.parallel.ep) == (32, 32, 32)
    assert (decode.parallel.tp, decode.parallel.dp, decode.parallel.ep) == (96, 96, 96)
    assert decode.parallel.redundant_experts == 96
    assert prefill.parallel.dp_attention
    assert decode.parallel.dp_attention
    assert [h.node_rank for h in plan.hosts if h.pool == "decode"] == list(range(12))
    assert all(r.fits for r in plan.fit)
    assert plan.endpoint_host == "gpu-p01"


def test_one_h100_node_is_refused_with_the_smallest_fit(tmp_path: Path) -> None:
    inv = nodes_inventory(tmp_path, 1, "sglang", "tp", "k2_gpu=h100\n")
    with pytest.raises(PlanError) as info:
        build_plan(load_cluster(inv))
    (line,) = info.value.problems
    assert "1 node x 8 h100" in line
    assert "GiB of weights" in line
    assert "smallest sglang tp [nodes] that fits is 4 nodes x 8 h100 (tp 32)" in line


def test_one_h200_node_does_not_hold_128k_context(tmp_path: Path) -> None:
    inv = nodes_inventory(tmp_path, 1, "vllm", "tp")
    with pytest.raises(PlanError) as info:
        build_plan(load_cluster(inv))
    assert "2 nodes x 8 h200 (tp 16)" in info.value.problems[0]


def test_tp_that_does_not_divide_heads_is_refused(tmp_path: Path) -> None:
    inv = nodes_inventory(tmp_path, 3, "sglang", "tp")
    with pytest.raises(PlanError) as info:
        build_plan(load_cluster(inv))
    assert any(
        "24 does not divide the model's 64 attention heads" in p for p in info.value.problems
    )


def test_experts_that_do_not_divide_are_refused(tmp_path: Path) -> None:
    inv = nodes_inventory(tmp_path, 5, "vllm", "dp_ep")
    with pytest.raises(PlanError) as info:
        build_plan(load_cluster(inv))
    assert any(
        "expert parallel size 40 does not divide 384 experts" in p for p in info.value.problems
    )


def test_fp8_needs_hopper_or_newer(tmp_path: Path) -> None:
    inv = nodes_inventory(tmp_path, 2, "vllm", "tp", "k2_gpu=a100\n")
    with pytest.raises(PlanError, match="cannot run natively"):
        build_plan(load_cluster(inv))


def test_one_h200_node_cannot_hold_the_weights_at_any_context(tmp_path: Path) -> None:
    inv = nodes_inventory(tmp_path, 1, "sglang", "tp", "k2_context_length=8192\nk2_reserve_gib=2\n")
    with pytest.raises(PlanError):
        # 0.85 x 140.4 GiB cannot hold 120 GiB of weights per GPU, whatever the context.
        build_plan(load_cluster(inv))


def test_tight_fit_warns(tmp_path: Path) -> None:
    inv = nodes_inventory(
        tmp_path, 2, "vllm", "tp", "k2_context_length=131072\nk2_reserve_gib=50\n"
    )
    plan = build_plan(load_cluster(inv))
    assert plan.warnings
    assert "KV tokens per attention group" in plan.warnings[0]


def test_lab_plan_swaps_image_and_container_profile(tmp_path: Path) -> None:
    inv = nodes_inventory(tmp_path, 2, "sglang", "tp", "k2_lab=true\n")
    plan = build_plan(load_cluster(inv))
    assert plan.lab
    assert all(p.image == "localhost/k2-standin:lab" for h in plan.hosts for p in h.processes)
    assert plan.container.gpus is None
    assert not any(u.startswith("memlock") for u in plan.container.ulimits)
    prod = build_plan(load_cluster(nodes_inventory(tmp_path, 2, "sglang", "tp")))
    assert "memlock=-1:-1" in prod.container.ulimits
    assert prod.container.gpus == "all"


def test_digest_is_stable_and_content_sensitive(tmp_path: Path) -> None:
    a = build_plan(load_cluster(nodes_inventory(tmp_path, 2, "sglang", "tp")))
    b = build_plan(load_cluster(nodes_inventory(tmp_path, 2, "sglang", "tp")))
    c = build_plan(load_cluster(nodes_inventory(tmp_path, 4, "sglang", "tp")))
    assert plan_digest(a) == plan_digest(b) != plan_digest(c)


def test_every_process_gets_a_launch_script(tmp_path: Path) -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    for host in plan.hosts:
        for proc in host.processes:
            script = host.files[f"/etc/k2provision/launch/{proc.name}.sh"]
            assert script.startswith("#!/bin/sh\n")
            assert proc.argv[0] in script


def test_multi_node_socket_interface_is_derived_or_warned(tmp_path: Path) -> None:
    """Each host's interface is found from its k2_local_ip at launch; where k2_local_ip is a
    name, nothing can be derived and the plan says so, for every engine."""
    for engine, layout in (("vllm", "tp"), ("sglang", "tp"), ("trtllm", "tp_ep")):
        plan = build_plan(load_cluster(nodes_inventory(tmp_path, 2, engine, layout)))
        assert not any("k2_socket_ifname" in w for w in plan.warnings)
        assert all(p.resolve for h in plan.hosts for p in h.processes if p.name != "sshd")
        named = nodes_inventory(tmp_path, 2, engine, layout).read_text().replace(
            "ansible_host=10.9.0.2", "ansible_host=10.9.0.2 k2_local_ip=n2.cluster"
        )
        (tmp_path / "named.ini").write_text(named)
        plan = build_plan(load_cluster(tmp_path / "named.ini"))
        assert any("k2_socket_ifname is unset and k2_local_ip of n2 is a name" in w
                   for w in plan.warnings), (engine, plan.warnings)
        pinned = build_plan(
            load_cluster(nodes_inventory(tmp_path, 2, engine, layout, "k2_socket_ifname=bond0\n"))
        )
        assert not any("k2_socket_ifname" in w for w in pinned.warnings)


def test_a_local_config_json_overrides_the_catalog(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        '{"num_hidden_layers": 31, "n_routed_experts": 192, "max_position_embeddings": 65536}'
    )
    inv = nodes_inventory(tmp_path, 2, "vllm", "tp", f"k2_model_config_json={config}\n")
    plan = build_plan(load_cluster(inv))
    base = build_plan(load_cluster(nodes_inventory(tmp_path, 2, "vllm", "tp")))
    assert plan.fit[0].weights_gib < base.fit[0].weights_gib / 1.9
    assert plan.fit[0].context_length == 65536
    missing = nodes_inventory(tmp_path, 2, "vllm", "tp", "k2_model_config_json=/nope/config.json\n")
    with pytest.raises(K2Error, match=r"k2_model_config_json=/nope/config\.json"):
        build_plan(load_cluster(missing))
