"""TLS on the single server that is the endpoint, through the real parsers: the rendered
--ssl-certfile / --ssl-keyfile reach sglang 0.5.23's and vLLM 0.33.0's server arguments. The
launch phase's paths are swapped for files that exist (sglang checks they do). Needs
.venv-sglang and .venv-vllm from scripts/install-engine-parsers."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2provision.core.endpoint_guard import TLS_CERT, TLS_KEY, guard_path
from k2provision.core.records import Process
from k2provision.core.templating import with_host_values
from k2provision.plan.assemble import build_plan
from tests.k2provision.access_support import GuardFiles

from . import goldens
from .runner import check

pytestmark = pytest.mark.parsers


def _server_with_tls(
    case: str, program: tuple[str, ...], files: GuardFiles
) -> tuple[Process, str, str]:
    """The case's endpoint server rendered with TLS, and the certificate and key paths on its
    host."""
    cluster = goldens.cluster(case)
    guarded = cluster.model_copy(
        update={
            "tunables": cluster.tunables.model_copy(
                update={"tls_cert_file": files.cert, "tls_key_file": files.key}
            )
        }
    )
    plan = build_plan(guarded)
    assert plan.endpoint.startswith("https://")
    host = plan.host(plan.endpoint_host)
    proc = next(p for p in host.processes if p.argv[: len(program)] == program and p.health)
    config_dir = plan.config_dir
    return (
        with_host_values(proc, goldens.SAMPLE_HOST_VALUES),
        guard_path(config_dir, TLS_CERT),
        guard_path(config_dir, TLS_KEY),
    )


@pytest.mark.parametrize(
    ("case", "engine", "program"),
    [
        ("sglang-tp", "sglang", goldens.SGLANG_SERVER),
        ("vllm-tp8-pp2", "vllm", goldens.VLLM_SERVE),
        ("vllm-dp16-ep", "vllm", goldens.VLLM_SERVE),
    ],
)
def test_the_endpoint_server_takes_the_certificate_and_key(
    case: str, engine: str, program: tuple[str, ...], tmp_path: Path, guard_files: GuardFiles
) -> None:
    proc, cert_on_host, key_on_host = _server_with_tls(case, program, guard_files)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("certificate\n")
    key.write_text("key\n")
    swap = {cert_on_host: str(cert), key_on_host: str(key)}
    argv = [swap.get(a, a) for a in proc.argv]
    assert argv != list(proc.argv)
    result = check(engine, argv, dict(proc.env), options={})
    assert result.ok, f"{result.stage}: {result.error}"
    assert result.value("ssl_certfile") == str(cert)
    assert result.value("ssl_keyfile") == str(key)
    assert result.value("ssl_ca_certs") is None
