"""Planner: parallel sizes, ranks, memory fit and refusals that name the smallest fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2provision.core import catalog
from k2provision.core.records import AccessFiles, Cluster, FleetSettings
from k2provision.errors import K2Error, PlanError
from k2provision.plan.assemble import build_plan, plan_digest
from k2provision.plan.inventory import load_cluster
from tests.k2provision.access_support import write_guard_files

ROOT = Path(__file__).resolve().parents[3]


def nodes_inventory(tmp_path: Path, n: int, engine: str, layout: str, extra: str = "") -> Path:
    hosts = "".join(f"n{i} ansible_host=10.9.0.{i}\n" for i in range(1, n + 1))
    path = tmp_path / "inv.ini"
    path.write_text(f"[nodes]\n{hosts}[all:vars]\nk2_engine={engine}\nk2_layout={layout}\n{extra}")
    return path


def test_model_numbers_match_kimi_k2() -> None:
    spec = catalog.model("moonshotai/Kimi-K2-Instruct")
    assert 1.02e12 < catalog.total_params(spec) < 1.035e12
    total_gib = catalog.weights(spec).total / catalog.GIB
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
    with pytest.raises(PlanError, match=r"\[nodes\] \(1 node x 8 h100\)") as info:
        build_plan(load_cluster(inv))
    (line,) = info.value.problems
    assert "1 node x 8 h100" in line
    assert "GiB of weights" in line
    # TP 32 would cut each FP8 expert into 64-wide slices: no tp size fits an H100 fleet.
    assert "(tp 32;" not in line
    assert "sglang tp fits" not in line
    # PD's DeepEP decode reserve (calibrated to a published measurement) leaves no KV cache on
    # an 80 GB GPU at the default decode batch either: no SGLang layout fits H100s.
    assert "no change near this sglang layout fits h100 GPUs" in line
    assert line.endswith("fix: choose larger GPUs or another engine")
    # The weights and reserve alone exceed an H100: a shorter context cannot help.
    assert "k2_context_length" not in line


def test_one_h200_node_holds_128k_for_vllm_only_with_decode_context_parallelism(
    tmp_path: Path,
) -> None:
    inv = nodes_inventory(tmp_path, 1, "vllm", "tp", "k2_vllm_decode_context_parallel_size=1\n")
    with pytest.raises(PlanError, match="vllm tp fits on 2 nodes") as info:
        build_plan(load_cluster(inv))
    assert "vllm tp fits on 2 nodes x 8 h200 (tp 16; 16 GPUs)" in info.value.problems[0]
    # With DCP 8 (the plan's default for the family) each GPU keeps an eighth of the tokens.
    plan = build_plan(load_cluster(nodes_inventory(tmp_path, 1, "vllm", "tp")))
    (fit,) = plan.fit
    assert plan.pools[0].parallel.dcp == 8
    assert fit.kv_tokens_per_replica == 8 * fit.kv_tokens_per_gpu >= 131072


def test_tp_that_does_not_divide_heads_is_refused(tmp_path: Path) -> None:
    inv = nodes_inventory(tmp_path, 3, "sglang", "tp")
    with pytest.raises(PlanError, match="does not divide the model's 64 attention heads") as info:
        build_plan(load_cluster(inv))
    assert any(
        "24 does not divide the model's 64 attention heads" in p for p in info.value.problems
    )


def test_experts_that_do_not_divide_are_refused(tmp_path: Path) -> None:
    inv = nodes_inventory(tmp_path, 5, "vllm", "dp_ep")
    with pytest.raises(PlanError, match="expert parallel size 40 does not divide") as info:
        build_plan(load_cluster(inv))
    assert any(
        "expert parallel size 40 does not divide 384 experts" in p for p in info.value.problems
    )


def test_fp8_needs_hopper_or_newer(tmp_path: Path) -> None:
    inv = nodes_inventory(tmp_path, 2, "vllm", "tp", "k2_gpu=a100\n")
    with pytest.raises(PlanError, match="cannot run natively"):
        build_plan(load_cluster(inv))


def test_sglang_tp8_on_one_h200_node_plans_fp8_kimi_k2_at_32k(tmp_path: Path) -> None:
    # Upstream runs it so: sgl-project/ome srt/moonshotai/kimi-k2-instruct-rt.yaml (TP8,
    # --mem-fraction-static 0.9 on 140 GB GPUs) at a reduced context.
    inv = nodes_inventory(tmp_path, 1, "sglang", "tp", "k2_context_length=32768\n")
    plan = build_plan(load_cluster(inv))
    (fit,) = plan.fit
    assert fit.fits
    assert fit.mem_fraction == plan.pools[0].mem_fraction
    assert 0.88 <= fit.mem_fraction <= 0.92
    # The reserve outside SGLang's static pool holds graphs, buffers and activations.
    reserve = fit.reserve
    assert reserve.cuda_graphs > 0
    assert reserve.comm_buffers > 0
    assert reserve.activations > 0
    left = (1 - fit.mem_fraction) * (fit.usable_gib - reserve.runtime)
    assert left >= reserve.total - reserve.runtime - 0.01
    # The full 128k does not fit one node; the refusal offers the context that does.
    full = nodes_inventory(tmp_path, 1, "sglang", "tp")
    with pytest.raises(PlanError, match="sglang tp fits on 2 nodes") as info:
        build_plan(load_cluster(full))
    (line,) = info.value.problems
    assert f"k2_context_length={fit.kv_tokens_per_replica} or less" in line
    assert "sglang tp fits on 2 nodes x 8 h200 (tp 16; 16 GPUs)" in line


def test_tight_fit_warns(tmp_path: Path) -> None:
    inv = nodes_inventory(tmp_path, 1, "sglang", "tp", "k2_context_length=32768\n")
    plan = build_plan(load_cluster(inv))
    assert any("KV tokens per attention group" in w for w in plan.warnings)


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
    c = build_plan(load_cluster(nodes_inventory(tmp_path, 2, "sglang", "tp", "k2_gpu=b200\n")))
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
    name (it defaults to ansible_host, which may be one), nothing can be derived and the plan
    says so, for every engine."""
    for engine, layout in (("vllm", "tp"), ("sglang", "tp"), ("trtllm", "tp_ep")):
        plan = build_plan(load_cluster(nodes_inventory(tmp_path, 2, engine, layout)))
        assert not any("k2_socket_ifname" in w for w in plan.warnings)
        assert all(p.resolve for h in plan.hosts for p in h.processes if p.name != "sshd")
        named = (
            nodes_inventory(tmp_path, 2, engine, layout)
            .read_text()
            .replace("ansible_host=10.9.0.2", "ansible_host=n2.cluster")
        )
        (tmp_path / "named.ini").write_text(named)
        plan = build_plan(load_cluster(tmp_path / "named.ini"))
        assert any(
            "k2_socket_ifname is unset and k2_local_ip of n2 is a name" in w for w in plan.warnings
        ), (engine, plan.warnings)
        pinned = build_plan(
            load_cluster(nodes_inventory(tmp_path, 2, engine, layout, "k2_socket_ifname=bond0\n"))
        )
        assert not any("k2_socket_ifname" in w for w in pinned.warnings)


def test_a_local_config_json_overrides_the_catalog(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        '{"num_hidden_layers": 31, "n_routed_experts": 192, "max_position_embeddings": 65536,'
        ' "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}'
    )
    inv = nodes_inventory(tmp_path, 2, "vllm", "tp", f"k2_model_config_json={config}\n")
    plan = build_plan(load_cluster(inv))
    base = build_plan(load_cluster(nodes_inventory(tmp_path, 2, "vllm", "tp")))
    assert plan.fit[0].weights_gib < base.fit[0].weights_gib / 1.9
    assert plan.fit[0].context_length == 65536
    missing = nodes_inventory(tmp_path, 2, "vllm", "tp", "k2_model_config_json=/nope/config.json\n")
    with pytest.raises(K2Error, match=r"k2_model_config_json=/nope/config\.json"):
        build_plan(load_cluster(missing))


def test_the_plan_carries_the_fleet_settings_defaulted_by_the_cluster(tmp_path: Path) -> None:
    plain = build_plan(load_cluster(nodes_inventory(tmp_path, 2, "sglang", "tp")))
    defaults = Cluster.model_fields
    assert plain.fleet == FleetSettings(
        max_unavailable=defaults["max_unavailable"].default,
        drain_timeout=defaults["drain_timeout"].default,
    )
    extra = "k2_instances=2\nk2_max_unavailable=2\nk2_drain_timeout=45\n"
    set_ = build_plan(load_cluster(nodes_inventory(tmp_path, 4, "sglang", "tp", extra)))
    assert set_.fleet == FleetSettings(max_unavailable=2, drain_timeout=45)


def test_the_plan_names_the_endpoints_access_files_never_their_contents(tmp_path: Path) -> None:
    files = write_guard_files(tmp_path / "guard")
    extra = (
        f"k2_api_key_file={files.api_key}\nk2_tls_cert_file={files.cert}\n"
        f"k2_tls_key_file={files.key}\nk2_tls_ca_file={files.ca}\n"
    )
    plan = build_plan(load_cluster(nodes_inventory(tmp_path, 2, "sglang", "tp", extra)))
    assert plan.access == AccessFiles(
        api_key_file=files.api_key,
        tls_cert_file=files.cert,
        tls_key_file=files.key,
        tls_ca_file=files.ca,
        host_ca_file="/etc/k2provision/tls/ca.pem",
    )
    dumped = plan.model_dump_json()
    contents = [Path(path).read_text().strip() for path in (files.api_key, files.key)]
    assert not [text for text in contents if text in dumped]
    assert "PRIVATE KEY" not in dumped
    bare = build_plan(load_cluster(nodes_inventory(tmp_path, 2, "sglang", "tp")))
    assert set(bare.access.model_dump().values()) == {None}


def test_the_mesh_is_served_where_an_engine_binds_the_mesh_port() -> None:
    """The ssh_mesh role checks all pairs where the plan says the containers serve the mesh:
    the engine that renders a listener on k2_ssh_port (TensorRT-LLM's sshd) and no other."""
    for case, served in (("trtllm-tp16-ep8", True), ("sglang-tp", False), ("vllm-tp16", False)):
        plan = build_plan(load_cluster(ROOT / "tests" / "golden" / case / "inventory.ini"))
        assert plan.mesh_served is served, case
        bound = {b.setting for h in plan.hosts for b in h.ports}
        assert ("k2_ssh_port" in bound) is served, case
