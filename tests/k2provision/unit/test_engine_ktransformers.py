"""KTransformers renderer: SGLang with kt-kernel on one host, the routed experts on the CPU."""

from __future__ import annotations

import pytest

from k2provision.core.records import Cluster, HostSpec, Plan, Process, Tunables
from k2provision.core.templating import launch_script
from k2provision.engines import ktransformers
from k2provision.errors import InventoryError
from k2provision.plan.assemble import build_plan
from tests.k2provision.access_support import GuardFiles


def plan(**tunables: object) -> Plan:
    host = HostSpec(name="kt-01", address="10.9.0.4", pool="nodes", local_ip="10.9.0.4")
    return build_plan(
        Cluster(
            inventory="test.ini",
            engine="ktransformers",
            layout="single",
            model="moonshotai/Kimi-K2-Instruct",
            model_dir="/models/K2",
            gpu="h200",
            gpus_per_node=8,
            context_length=30000,
            hosts=(host,),
            tunables=Tunables.model_validate(tunables),
        )
    )


def process_of(p: Plan) -> Process:
    (host,) = p.hosts
    (proc,) = host.processes
    return proc


def opt(argv: tuple[str, ...], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def test_server_is_sglang_with_the_experts_on_kt_kernel() -> None:
    argv = process_of(plan()).argv
    assert argv[:3] == ("python3", "-m", "sglang.launch_server")
    assert opt(argv, "--model-path") == "/models/K2"
    assert opt(argv, "--kt-weight-path") == "/models/K2"  # FP8 experts read as shipped
    assert opt(argv, "--kt-method") == "FP8"
    assert opt(argv, "--kt-num-gpu-experts") == "0"
    assert opt(argv, "--tp-size") == "1"
    assert opt(argv, "--max-total-tokens") == "30000"
    assert opt(argv, "--context-length") == "30000"
    assert opt(argv, "--served-model-name") == "kimi-k2"
    assert opt(argv, "--tool-call-parser") == "kimi_k2"
    assert opt(argv, "--host") == "0.0.0.0"
    assert opt(argv, "--port") == "8000"
    assert "--disable-shared-experts-fusion" in argv


def test_cpu_threads_and_pools_come_from_the_host() -> None:
    proc = process_of(plan())
    assert opt(proc.argv, "--kt-cpuinfer") == "${K2_KT_CPUINFER}"
    assert opt(proc.argv, "--kt-threadpool-count") == "${K2_NUMA_NODES}"
    values = {v.name: v for v in proc.resolve}
    # Physical cores minus the GPUs the server drives.
    assert (values["K2_KT_CPUINFER"].kind, values["K2_KT_CPUINFER"].arg) == (
        "physical-cores-minus",
        "1",
    )
    assert values["K2_NUMA_NODES"].kind == "numa-nodes"
    script = launch_script(proc, "/etc/k2provision")
    assert (
        "K2_KT_CPUINFER=$(python3 /etc/k2provision/launch/k2-host-values.py "
        "physical-cores-minus 1)" in script
    )
    assert '--kt-cpuinfer "${K2_KT_CPUINFER}"' in script


def test_cpu_threads_can_be_fixed() -> None:
    proc = process_of(plan(ktransformers_cpuinfer=96, ktransformers_gpu_experts=16))
    assert opt(proc.argv, "--kt-cpuinfer") == "96"
    assert opt(proc.argv, "--kt-num-gpu-experts") == "16"
    assert [v.name for v in proc.resolve] == ["K2_NUMA_NODES"]


def test_single_process_with_a_health_gate_and_no_socket_pinning() -> None:
    p = plan()
    proc = process_of(p)
    assert proc.container == ktransformers.CONTAINER
    assert proc.stage == 0
    assert proc.exec_in is False
    assert proc.health is not None
    assert proc.health.url == "http://10.9.0.4:8000/health"
    assert p.endpoint == "http://10.9.0.4:8000"
    assert "NCCL_SOCKET_IFNAME" not in proc.env  # one host: nothing crosses the network


def test_image_is_built_from_the_pinned_kt_kernel() -> None:
    p = plan()
    assert p.engine_version == "0.7.2"
    (image,) = p.images
    assert image.build == "ktransformers"
    assert image.ref.startswith("k2provision/ktransformers:0.7.2-")
    assert process_of(p).image == image.ref
    assert not any("image" in w for w in p.warnings)
    own = plan(image="reg/kt:1")
    assert [(i.ref, i.build) for i in own.images] == [("reg/kt:1", "")]


def test_the_api_key_comes_from_the_launch_phases_options_file(guard_files: GuardFiles) -> None:
    """sglang-kt's server takes --config like SGLang's: the key is in no argv or plan."""
    keyed = process_of(plan(api_key_file=guard_files.api_key))
    assert opt(keyed.argv, "--config") == "/etc/k2provision/secrets/api_key.yaml"
    assert "--api-key" not in keyed.argv
    assert "--config" not in process_of(plan()).argv
    assert not [
        w for w in plan(api_key_file=guard_files.api_key).warnings if "k2_api_key_file" in w
    ]


def test_tls_is_refused_since_its_sglang_has_no_certificate_option(
    guard_files: GuardFiles,
) -> None:
    with pytest.raises(InventoryError) as refused:
        plan(tls_cert_file=guard_files.cert, tls_key_file=guard_files.key)
    (problem,) = refused.value.problems
    assert problem.startswith(f"k2_tls_cert_file={guard_files.cert}: ktransformers serves no TLS")
    assert "sglang-kt 0.7.2" in problem
    assert "TLS-terminating proxy" in problem
