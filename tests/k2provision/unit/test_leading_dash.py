"""A value that starts with `-` never reaches an engine's argv, where a parser would take it
for a flag: every string variable of the contract (cluster, tunable, per host) given one is
refused at plan time by a line that names the variable, for every engine's golden layout."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k2provision.core.inventory import read_inventory
from k2provision.core.records import Cluster, Tunables
from k2provision.core.variables import CLUSTER_VARS, HOST_VARS
from k2provision.errors import K2Error
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import cluster_from_groups
from tests.golden_cases import GOLDEN

# One golden inventory per engine (and PD, whose router renders its own argv).
CASES = ("sglang-tp", "sglang-pd-1p1d", "vllm-dp16-ep", "trtllm-tp16-ep8", "ktransformers")


def _string_fields(model: type[Cluster] | type[Tunables]) -> list[str]:
    return [name for name, f in model.model_fields.items() if "str" in str(f.annotation)]


STRING_VARS: tuple[tuple[str, str], ...] = (
    *[("all", v) for v in CLUSTER_VARS if v.removeprefix("k2_") in _string_fields(Cluster)],
    *[("all", f"k2_{name}") for name in _string_fields(Tunables)],
    *[("host", v) for v in HOST_VARS],
    ("host", "ansible_host"),
)
# What may follow the dash: flag-like words a parser would act on, and plain ones.
SUFFIXES = st.one_of(
    st.sampled_from(["-help", "-version", "h", "-port=1", "-model-path=/etc", "", "-"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.=/-", min_size=1, max_size=12),
)


@cache
def golden(case: str) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    return read_inventory(GOLDEN / case / "inventory.ini")


def refusal(case: str, where: str, variable: str, value: str) -> list[str]:
    """The problem lines of the golden case with `variable` set to `value` ([] if it plans)."""
    groups, host_vars = golden(case)
    changed = {host: dict(variables) for host, variables in host_vars.items()}
    targets = list(changed) if where == "all" else list(changed)[:1]
    for host in targets:
        changed[host][variable] = value
    try:
        build_plan(cluster_from_groups(case, groups, changed))
    except K2Error as refused:
        return list(refused.problems)
    return []


def test_every_string_variable_is_drawn() -> None:
    names = {name for _, name in STRING_VARS}
    assert {"k2_served_model_name", "k2_image", "k2_router_image", "k2_model_dir"} <= names
    assert {"k2_socket_ifname", "k2_config_dir", "k2_local_ip", "ansible_host"} <= names


@pytest.mark.parametrize("case", CASES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chosen=st.sampled_from(STRING_VARS), suffix=SUFFIXES)
def test_a_leading_dash_is_refused_naming_its_variable(
    case: str, chosen: tuple[str, str], suffix: str
) -> None:
    where, variable = chosen
    value = "-" + suffix
    problems = refusal(case, where, variable, value)
    assert problems, (case, variable, value)
    assert any(variable in line for line in problems), (variable, problems)
    assert all("\n" not in line for line in problems)


@pytest.mark.parametrize(
    "variable", ["k2_served_model_name", "k2_image", "k2_router_image", "k2_socket_ifname"]
)
def test_the_refusal_says_why_and_the_fix(variable: str) -> None:
    (line,) = refusal("sglang-pd-1p1d", "all", variable, "--help")
    assert f"{variable}=--help is refused" in line
    assert "not starting with - (it would be read as a flag)" in line
    assert f"fix: correct {variable}" in line


@pytest.mark.parametrize("value", ["kimi-k2-", "k-", "a--b"])
def test_a_dash_inside_a_word_still_plans(value: str) -> None:
    groups, host_vars = golden("sglang-tp")
    changed = {h: {**v, "k2_served_model_name": value} for h, v in host_vars.items()}
    plan = build_plan(cluster_from_groups("sglang-tp", groups, changed))
    argv = plan.hosts[0].processes[0].argv
    assert argv[argv.index("--served-model-name") + 1] == value
