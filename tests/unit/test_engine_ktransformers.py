"""KTransformers renderer: one server on one host, options of the 0.3 server's ArgumentParser."""

from __future__ import annotations

from k2provision.engines import ktransformers
from k2provision.engines.common import tool_parser
from k2provision.models import Cluster, HostSpec, Plan, Tunables
from k2provision.plan import build_plan

AMX_RULES = (
    "/opt/ktransformers/ktransformers/optimize/optimize_rules/"
    "DeepSeek-V3-Chat-fp8-linear-ggml-experts-serve-amx.yaml"
)


def plan(**tunables: object) -> Plan:
    host = HostSpec(name="kt-01", address="10.9.0.4", pool="nodes", local_ip="10.9.0.4")
    return build_plan(
        Cluster(
            inventory="test.ini", engine="ktransformers", layout="single",
            model="moonshotai/Kimi-K2-Instruct", model_dir="/models/K2-GGUF", gpu="h200",
            gpus_per_node=8, context_length=30000, hosts=(host,),
            tunables=Tunables.model_validate(tunables),
        )
    )


def argv_of(p: Plan) -> tuple[str, ...]:
    (host,) = p.hosts
    (proc,) = host.processes
    return proc.argv


def opt(argv: tuple[str, ...], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def test_server_command() -> None:
    argv = argv_of(plan())
    assert argv[:3] == ("python3", "-m", "ktransformers.server.main")
    assert opt(argv, "--model_path") == "/models/K2-GGUF"
    assert opt(argv, "--gguf_path") == "/models/K2-GGUF"
    assert opt(argv, "--cache_lens") == "30000"
    assert opt(argv, "--host") == "0.0.0.0"
    assert opt(argv, "--port") == "8000"
    assert opt(argv, "--model_name") == "kimi-k2"


def test_every_option_is_one_the_server_parses() -> None:
    argv = argv_of(plan(ktransformers_optimize_config=AMX_RULES))
    options = [a for a in argv[3:] if a.startswith("--")]
    assert set(options) <= ktransformers.SERVER_OPTIONS
    assert len(argv[3:]) == 2 * len(options)  # every option takes exactly one value


def test_optimize_rules_only_when_asked() -> None:
    assert "--optimize_config_path" not in argv_of(plan())
    argv = argv_of(plan(ktransformers_optimize_config=AMX_RULES))
    assert opt(argv, "--optimize_config_path") == AMX_RULES


def test_no_tool_parser_flag_because_the_server_has_none() -> None:
    assert tool_parser("ktransformers") is None
    argv = argv_of(plan())
    assert not any("tool" in a for a in argv)


def test_single_process_with_a_models_health_gate() -> None:
    p = plan()
    (host,) = p.hosts
    (proc,) = host.processes
    assert proc.container == ktransformers.CONTAINER
    assert proc.stage == 0
    assert proc.exec_in is False
    assert proc.health is not None
    assert proc.health.url == "http://10.9.0.4:8000/v1/models"
    assert p.endpoint == "http://10.9.0.4:8000"
