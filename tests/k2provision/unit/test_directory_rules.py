"""Dangerous directories: one rule for every directory-valued variable of the contract (the
cluster's, the tunables', every role's), refusing relative paths, the operating system's own
directories and trees, home and .ssh directories, and a directory handed to another user that
is or holds another variable's directory; each line names the hosts, the variable, the value,
what is expected and the fix."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k2provision.core.directory_rules import (
    SYSTEM_DIRECTORIES,
    directory_problem,
    directory_variables,
)
from k2provision.core.variables import known_names
from k2provision.errors import InventoryError
from k2provision.plan.inventory import cluster_from_groups

BASE = {"k2_engine": "vllm", "k2_layout": "tp"}
ADDRESSES = {"a": "10.0.0.1", "b": "10.0.0.2"}


def problems(**variables: Any) -> list[str]:
    """Refusal lines of a two-host inventory with `variables` on every host ([] if accepted)."""
    host_vars = {h: {**BASE, "ansible_host": ip, **variables} for h, ip in ADDRESSES.items()}
    try:
        cluster_from_groups("inv.ini", {"nodes": list(ADDRESSES)}, host_vars)
    except InventoryError as refused:
        return list(refused.problems)
    return []


def test_every_directory_variable_of_the_contract_is_covered() -> None:
    covered = set(directory_variables())
    assert {n for n in known_names() if n.endswith("_dir")} <= covered
    assert {"k2_model_dir", "k2_config_dir", "k2_monitoring_data_dir"} <= covered


DANGEROUS = (
    "/",
    "/etc",
    "/etc/",
    "//usr",
    "/usr/local",
    "/usr/lib/x86_64-linux-gnu",
    "/var/lib",
    "/var/lib/docker/volumes",
    "/tmp",
    "/proc/self",
    "/home",
    "/home/alice",
    "/root",
    "/home/alice/.ssh/k2",
    "/srv/k2/../..",
    "relative/dir",
)


@pytest.mark.parametrize("variable", directory_variables())
@pytest.mark.parametrize("value", DANGEROUS)
def test_dangerous_directories_are_refused_for_every_variable(variable: str, value: str) -> None:
    found = problems(**{variable: value})
    lines = [line for line in found if variable in line]
    assert lines, found
    line = lines[0]
    assert "a, b:" in line or "inv.ini:" in line  # the hosts, or the cluster's inventory
    assert value.strip() in line
    assert "expected" in line
    assert "fix:" in line


@pytest.mark.parametrize("variable", directory_variables())
@pytest.mark.parametrize(
    "value", ["/srv/k2/data", "/var/lib/k2provision/x", "/usr/local/k2/cache", "/data/alice"]
)
def test_directories_of_their_own_are_accepted(variable: str, value: str) -> None:
    assert not problems(**{variable: value})


@pytest.mark.parametrize(
    ("variables", "fragment"),
    [
        (
            {"k2_monitoring_data_dir": "/etc/k2provision"},
            "k2_monitoring_data_dir=/etc/k2provision is k2_config_dir=/etc/k2provision",
        ),
        (
            {"k2_monitoring_data_dir": "/srv/k2", "k2_model_dir": "/srv/k2/model"},
            "k2_monitoring_data_dir=/srv/k2 holds k2_model_dir=/srv/k2/model",
        ),
        (
            {"k2_monitoring_data_dir": "/var/lib/k2provision"},
            "holds k2_container_runtime_stream_dir=/var/lib/k2provision/images",
        ),
        (
            {"k2_monitoring_data_dir": "/srv/p", "k2_monitoring_config_dir": "/srv/p/"},
            "k2_monitoring_data_dir=/srv/p is k2_monitoring_config_dir=/srv/p/",
        ),
    ],
)
def test_a_directory_handed_to_another_user_holds_no_other(
    variables: dict[str, str], fragment: str
) -> None:
    found = problems(**variables)
    lines = [line for line in found if fragment in line]
    assert len(lines) == 1, found
    assert "uid 65534" in lines[0]
    assert "fix:" in lines[0]


def test_templated_and_role_default_values_are_left_alone() -> None:
    assert not problems(k2_weights_controller_dir="{{ playbook_dir }}/cache")
    assert not problems(k2_weights_source_dir="", k2_weights_record_dir="")


CRITICAL = (
    "/etc/ssh/sshd_config",
    "/etc/passwd",
    "/usr/bin/python3",
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/var/lib/docker/overlay2",
    "/boot/grub/grub.cfg",
    "/var/log/syslog",
    "/lib/modules",
    "/proc/1/environ",
    "/root/.ssh/authorized_keys",
    "/home/alice/.ssh/authorized_keys",
)
PARTS = ("", ".", "..", "etc", "usr", "lib", "var", "home", "alice", "root", ".ssh", "k2", "bin")


@settings(max_examples=400, deadline=None)
@given(st.booleans(), st.lists(st.sampled_from(PARTS), max_size=5), st.booleans())
def test_an_accepted_directory_never_holds_a_system_file(
    absolute: bool, parts: list[str], trailing: bool
) -> None:
    value = ("/" if absolute else "") + "/".join(parts) + ("/" if trailing else "")
    if directory_problem(value) is not None:
        return
    path = "/" + "/".join(p for p in value.split("/") if p)
    assert value.startswith("/")
    assert path not in SYSTEM_DIRECTORIES
    for system_file in CRITICAL:
        assert not (system_file + "/").startswith(path.rstrip("/") + "/"), (value, system_file)
