"""A private cluster behind a bastion with a guarded endpoint: `lab up 2 --bastion` (the hosts
accept SSH only from the bastion; the inventory reaches them with ProxyJump) and an API key and
a TLS certificate signed by a lab CA for the router; then apply, status, logs, restart --limit
and verify, each reaching the hosts through the bastion as Ansible does; status reading the
endpoint through an SSH port forward, and bench running sglang's real pinned benchmark client
in the engine image on the router's host (the stand-in image that carries that client,
`localhost/k2-standin:lab-client`, as the cluster's `k2_image`). The endpoint answers
401 without the key and 200 with it, over TLS checked against the lab CA; neither the key nor
the TLS private key is in any run record. Applied a second time, the cluster is found
converged: the look's https health gate trusts the lab CA (the registry's one certificate
policy), so nothing differs and nothing changes. A host that cannot be reached is named with
the setting that failed.

Stream `lab` (scripts/test), which has the time for the client image (about 6 GB: torch's
CUDA build, which the client imports, built when the cache does not hold it current): its own
lab instance (`side_instance`: the stream's name with a `j`, its subnet's second octet moved by
120), so the stream's other modules keep their hosts; about four minutes with the image
cached, most of it the apply.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import secrets
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import k2lab as lab_api
from k2lab.standin import CLIENT_IMAGE, build_standin_client
from tests.lab_support import side_instance
from tests.pd_lab import k2
from tests.runners import newest_record, on_host

pytestmark = [pytest.mark.lab, pytest.mark.lab_other]

API_KEY = "k2lab-" + secrets.token_hex(16)
# One prefill and one decode host: the FP8 model fits one node of 8 x B200 per pool (DeepEP,
# which pd runs, has no kernel for the INT4 model's experts) with decode CUDA graphs to batch
# 256 (the calibrated DeepEP reserve at the default 480 leaves one node no KV cache), synthetic
# weights written by the weights phase.
LAB_VARS: dict[str, lab_api.VarValue] = {
    "k2_engine": "sglang",
    "k2_layout": "pd",
    "k2_model": "moonshotai/Kimi-K2-Instruct",
    "k2_gpu": "b200",
    "k2_context_length": 32768,
    "k2_cuda_graph_max_bs_decode": 256,
    "k2_weights_source": "synthetic",
    # The stand-in with sglang's real benchmark client, so bench's default in-cluster client
    # (the engine image's own) runs for real.
    "k2_image": CLIENT_IMAGE,
}


def lab_ca_and_certificate(work: Path, address: str) -> dict[str, str]:
    """A lab CA and a certificate it signs for `address`: the k2_tls_* inventory variables."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def signed(
        subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[str, Any], ca: bool
    ) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer[0])]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))])
            builder = builder.add_extension(san, critical=False)
        return builder.sign(issuer[1], hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = signed("k2 lab CA", ca_key, ("k2 lab CA", ca_key), ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = signed(address, key, ("k2 lab CA", ca_key), ca=False)
    pem = serialization.Encoding.PEM
    files = {
        "k2_tls_ca_file": ("ca.pem", ca.public_bytes(pem)),
        "k2_tls_cert_file": ("cert.pem", cert.public_bytes(pem)),
        "k2_tls_key_file": (
            "key.pem",
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        ),
    }
    out = {}
    for var, (name, data) in files.items():
        (work / name).write_bytes(data)
        out[var] = str(work / name)
    return out


def cli(work: Path, *args: str, masters: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI on the bastion cluster, with its own fact cache and SSH control masters (other
    instances name their hosts lab1, lab2 too)."""
    return k2(
        *args,
        runs=work / "runs",
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(work / "facts"),
        ANSIBLE_SSH_CONTROL_PATH_DIR=str(masters or work / "cp"),
    )


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Any, Path, Path]]:
    """Two hosts (prefill, decode) behind a bastion, applied once: (state, inventory, work)."""
    cfg = side_instance("j", 120)
    work = tmp_path_factory.mktemp("bastion")
    inventory = work / "lab.ini"
    (work / "api_key").write_text(API_KEY + "\n")
    guard = {
        "k2_api_key_file": str(work / "api_key"),
        **lab_ca_and_certificate(work, cfg.host_ip(1)),
    }
    state = lab_api.up(
        2,
        bastion=True,
        inventory=inventory,
        groups={"prefill": 1, "decode": 1},
        all_vars={**LAB_VARS, **guard},
        cfg=cfg,
    )
    try:
        build_standin_client()
        applied = cli(work, "apply", str(inventory))
        assert applied.returncode == 0, applied.stdout[-4000:] + applied.stderr[-2000:]
        yield state, inventory, work
    finally:
        lab_api.down(cfg)


def test_the_hosts_refuse_ssh_from_the_controller_and_answer_through_the_bastion(
    cluster: tuple[Any, Path, Path],
) -> None:
    state, inventory, _ = cluster
    assert "-o ProxyJump=bastion" in inventory.read_text()
    argv = lab_api.ssh_command(state, "lab1", "hostname")
    assert argv[1:5] == ["-F", str(state.ssh_config), "-o", "ProxyJump=bastion"]
    refused = subprocess.run([argv[0], *argv[5:]], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 255
    assert "Connection refused" in refused.stderr
    assert on_host(state, "lab1", "hostname").strip() == "lab1"


def test_a_second_apply_finds_the_tls_cluster_converged(cluster: tuple[Any, Path, Path]) -> None:
    """The router's health gate is https with a certificate of the lab's private CA: the look
    asks it under the one certificate policy (the CA the launch placed on the host), so the
    second apply finds every phase converged and changes nothing."""
    _, inventory, work = cluster
    again = cli(work, "apply", str(inventory))
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    record = newest_record(work / "runs")
    looked = {}
    for path in (record / "artifacts").glob("*/job_events/*.json"):
        event = json.loads(path.read_text())
        data = event.get("event_data") or {}
        result = data.get("res") or {}
        if event.get("event") == "runner_on_ok" and "skipped_phases" in result:
            looked[str(data["host"])] = result
    assert sorted(looked) == ["lab1", "lab2"]
    for host, result in looked.items():
        assert result["differences"] == [], (host, result["differences"])
        assert "launch" in result["skipped_phases"], host
    summary = json.loads((record / "summary.json").read_text())
    assert {name: int(h.get("changed", 0)) for name, h in summary["hosts"].items()} == {
        "lab1": 0,
        "lab2": 0,
    }


def test_status_logs_restart_and_verify_reach_the_hosts_through_the_bastion(
    cluster: tuple[Any, Path, Path],
) -> None:
    _, inventory, work = cluster
    status = cli(work, "status", str(inventory))
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-2000:]
    assert "router readiness: ready (2/2 workers healthy)" in status.stdout
    logs = cli(work, "logs", str(inventory), "decode", "--tail", "3")
    assert logs.returncode == 0, logs.stdout[-2000:] + logs.stderr[-2000:]
    assert "lab2/sglang-decode | " in logs.stdout
    restarted = cli(work, "restart", str(inventory), "--limit", "lab2", "--yes")
    assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-2000:]
    verified = cli(work, "verify", str(inventory))
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-2000:]
    assert "tool call: ok" in verified.stdout
    assert "without the API key: ok HTTP 401" in verified.stdout


def test_status_reads_the_endpoint_through_a_forward_and_bench_runs_on_the_router_host(
    cluster: tuple[Any, Path, Path],
) -> None:
    state, inventory, work = cluster
    status = cli(work, "status", str(inventory), "--via-bastion")
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-2000:]
    assert "read through an SSH port forward to lab1" in " ".join(status.stderr.split())
    assert "router readiness: ready (2/2 workers healthy)" in status.stdout
    # The client runs in the engine image on lab1, reached through the bastion, with the key
    # on stdin and the lab CA: sglang's own benchmark client, against the router over TLS,
    # with the tokenizer of the model directory there (the synthetic weights carry one).
    bench = cli(
        work,
        "bench",
        str(inventory),
        "--num-prompts",
        "8",
        "--workload",
        "custom",
        "--input-len",
        "64",
        "--output-len",
        "16",
    )
    said = " ".join((bench.stdout + bench.stderr).split())
    assert bench.returncode == 0, said[-4000:]
    address = state.host("lab1").address
    assert f"in {CLIENT_IMAGE} on lab1 against https://{address}" in said
    assert "concurrency all (1/1): the client exited 0 on lab1" in said
    [record] = [p for p in (work / "runs").iterdir() if p.name.endswith("-bench")]
    doc = json.loads((record / "bench.json").read_text())
    assert doc["ok"] is True, doc["problems"]
    assert doc["client"]["kind"] == "sglang"
    assert doc["client"]["command"] == "python -m sglang.benchmark.serving"
    [point] = doc["points"]
    assert (point["completed"], point["failed"]) == (8, 0)
    assert point["input_tokens"] == 8 * 64
    assert point["output_tokens"] == 8 * 16
    # The client's own log: sglang's result table, not a stand-in's
    log = (record / "concurrency-all" / "client.log").read_text()
    assert "Serving Benchmark Result" in log


def ask(url: str, work: Path, key: str | None) -> int:
    """The HTTP status of a chat completion at `url`, checking its certificate against the lab
    CA, with `key` as the API key (None: without one)."""
    body = {"model": "kimi-k2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    context = ssl.create_default_context(cafile=str(work / "ca.pem"))
    try:
        with urllib.request.urlopen(request, timeout=60, context=context) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_the_endpoint_wants_the_key_over_tls_and_no_record_holds_a_secret(
    cluster: tuple[Any, Path, Path],
) -> None:
    state, _, work = cluster
    url = f"https://{state.host('lab1').address}:8000/v1/chat/completions"
    assert ask(url, work, None) == 401
    assert ask(url, work, "wrong") == 401
    assert ask(url, work, API_KEY) == 200
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(url, timeout=30, context=ssl.create_default_context())
    private = (work / "key.pem").read_text().splitlines()[1]  # a line of the key's base64
    records = [p for p in (work / "runs").rglob("*") if p.is_file()]
    assert len(records) > 20
    for record in records:
        text = record.read_bytes().decode(errors="replace")
        assert API_KEY not in text, record
        assert private not in text, record


def test_a_host_reached_without_the_bastion_is_named_with_the_setting_that_failed(
    cluster: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    state, inventory, work = cluster
    direct = tmp_path / "direct.ini"
    jump = f"-F {state.ssh_config} -o ProxyJump=bastion "
    direct.write_text(inventory.read_text().replace(jump, ""))
    status = cli(work, "status", str(direct), masters=tmp_path / "cp")  # no master to reuse
    assert status.returncode == 1, status.stdout[-3000:] + status.stderr[-2000:]
    address = state.host("lab1").address
    said = " ".join(status.stdout.split())
    assert (
        f"lab1: unreachable: cannot connect to ansible_host={address} ansible_port=22: "
        "Connection refused"
    ) in said
