"""Hostile strings in every string variable of the inventory contract, for every golden layout.

Each example sets one variable (cluster, tunable or per-host, `ansible_host` included) to a
string built from shell metacharacters, quotes, newlines, spaces, unicode, a leading `-` or
`~`, and a canary command `k2pwn`. Either the plan refuses it, with one-line problems, or it
plans, and then every shell the plan hands to a host (the launch scripts among its files, the
`sh -c` string of each `docker exec`, the mpirun lines inside TensorRT-LLM's scripts) must:

- parse (`bash -n` and `dash -n`);
- run to its end in a sandbox without running the canary or creating a file named after it:
  a private mount namespace whose root is an empty directory holding only bash and its
  libraries, PATH empty, so every external command lands in bash's
  `command_not_found_handle` and `exec` is a function: both record the argv and run nothing;
- hand an accepted value to the recorded commands verbatim (no tilde or glob expansion, no
  word splitting).

The role variables (roles/*/meta/argument_specs.yml) reach Ansible modules, never a shell the
product builds, so they are not drawn here. The sandbox is proven able to fail by the tests at
the end, which unquote a rendered value on purpose.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k2provision.core.records import Cluster, Plan, Tunables
from k2provision.core.variables import CLUSTER_VARS, HOST_VARS
from k2provision.errors import K2Error
from k2provision.plan.assemble import build_plan
from k2provision.plan.containers import exec_argv
from k2provision.plan.inventory import load_cluster
from tests.golden_cases import CASES, GOLDEN

CANARY = "k2pwn"
FRAGMENTS = (
    f"$({CANARY})", f"`{CANARY}`", f";{CANARY}", f"|{CANARY}", f"&{CANARY}", f">{CANARY}",
    f"<{CANARY}", f"\n{CANARY}\n", f"&&{CANARY}", "*", "?", "'", '"', " ", "\\", "$IFS", "${x}",
    "-", "--", "~", "~root", "=", "%", "^", ":", ",", "@", "+", ".", "/", "é", "\u2028", "\t",
    "kimi", "x",
)  # fmt: skip
# What the contract accepts in words and paths, yet a shell would expand or split unquoted.
SHELL_SPECIAL_SAFE = ("~", "~root", "-", "--", "=", "%", "^", ":", ",", "@", "+", "kimi", "x")


def _string_fields(model: type[Cluster] | type[Tunables]) -> list[str]:
    return [name for name, f in model.model_fields.items() if "str" in str(f.annotation)]


# Every string variable an inventory sets: where it is set ("all" or "host"), its name.
STRING_VARS: tuple[tuple[str, str], ...] = (
    *[("all", v) for v in CLUSTER_VARS if v.removeprefix("k2_") in _string_fields(Cluster)],
    *[("all", f"k2_{name}") for name in _string_fields(Tunables)],
    *[("host", v) for v in HOST_VARS],
    ("host", "ansible_host"),
)
BASH = shutil.which("bash") or "/bin/bash"
DASH = shutil.which("dash")
UNSHARE = shutil.which("unshare") or "unshare"


@dataclass
class Sandboxed:
    """What the rendered shells did in the sandbox."""

    calls: list[list[str]]
    exit_codes: dict[str, int]
    created: list[str]


def shells(plan: Plan) -> dict[str, str]:
    """Every shell text of the plan a host runs: launch scripts and `docker exec` strings."""
    found: dict[str, str] = {}
    for host in plan.hosts:
        for path, content in host.files.items():
            if path.endswith(".sh") or content.startswith("#!/bin/sh"):
                found[f"{host.name}:{path}"] = content
        for proc in host.processes:
            if proc.exec_in:
                argv = exec_argv(proc, plan.config_dir)
                found[f"{host.name}:exec:{proc.name}"] = argv[argv.index("-c") + 1]
    return found


HARNESS = """\
PATH=/nothing-runs-from-here
record() { printf '%s\\0' "$#" "$@" >> /record/calls; }
command_not_found_handle() { record "$@"; return 0; }
exec() {
  if [ "$#" -gt 0 ]; then record "$@"; fi
  for name in $(compgen -e); do record "env:$name" "${!name}"; done
  return 0
}
for script in /scripts/*; do
  ( cd /work && . "$script" )
  echo "$?" > "/record/rc-${script##*/}"
done
"""
# Directories the rendered scripts expect to exist (they create them with the stubbed mkdir).
SKELETON = ("work", "record", "scripts", "tmp", "run/sshd", "root/.ssh", "etc", "dev")
SYSTEM_DIRS = ("/usr/lib", "/usr/lib64", "/lib", "/lib64")


def sandbox(scripts: dict[str, str], where: Path) -> Sandboxed:
    """Run each shell text to its end in an empty root where nothing external can run."""
    root = where / "root"
    for d in (*SKELETON, "usr/bin"):
        (root / d).mkdir(parents=True, exist_ok=True)
    names: dict[str, str] = {}
    for i, (name, text) in enumerate(sorted(scripts.items())):
        (root / "scripts" / f"{i:03d}").write_text(text)
        names[f"{i:03d}"] = name
    (root / "harness.sh").write_text(HARNESS)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")  # so ~root expands
    (root / "usr/bin/bash").touch()
    binds = [f"mount --bind {BASH} $R/usr/bin/bash"]
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            (root / d.lstrip("/")).symlink_to(os.readlink(d))
        elif os.path.isdir(d):
            (root / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
            binds.append(f"mount --bind {d} $R{d} && mount -o remount,bind,ro $R{d}")
    setup = "set -e; R=$1; " + "; ".join(binds) + "; exec chroot $R /usr/bin/bash /harness.sh"
    done = subprocess.run(
        [UNSHARE, "--user", "--map-root-user", "--mount", "--fork", "sh", "-c", setup,
         "sh", str(root)],
        capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]},
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    raw = (
        (root / "record/calls").read_bytes().split(b"\0")
        if (root / "record/calls").exists()
        else []
    )
    calls: list[list[str]] = []
    i = 0
    while i + 1 < len(raw):
        n = int(raw[i])
        calls.append([a.decode() for a in raw[i + 1 : i + 1 + n]])
        i += 1 + n
    codes = {
        names[p.name.removeprefix("rc-")]: int(p.read_text())
        for p in (root / "record").glob("rc-*")
    }
    created = [
        str(Path(d, f).relative_to(root))
        for d, dirs, files in os.walk(root)
        if Path(d).relative_to(root).parts[:1] != ("usr",)
        for f in [*files, *dirs]
    ]
    return Sandboxed(calls, codes, created)


def parse_problems(scripts: dict[str, str]) -> list[str]:
    """`bash -n` (and `dash -n` where installed) on each shell text: the complaints."""
    problems = []
    for name, text in scripts.items():
        for shell in (BASH, DASH):
            if shell is None:
                continue
            done = subprocess.run(
                [shell, "-n"], input=text, capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                problems.append(f"{name}: {shell} -n: {done.stderr.strip()}")
    return problems


def assert_contained(scripts: dict[str, str], where: Path, value: str | None = None) -> None:
    """The checks every planned shell must pass; `value`: an accepted hostile value."""
    assert not parse_problems(scripts)
    ran = sandbox(scripts, where)
    assert set(ran.exit_codes) == set(scripts)
    assert all(code == 0 for code in ran.exit_codes.values()), ran.exit_codes
    assert not [c for c in ran.calls if CANARY in c[0]], ran.calls
    assert not [p for p in ran.created if CANARY in p or p.startswith("work/")], ran.created
    if value and any(value in text for text in scripts.values()):
        assert any(value in arg for call in ran.calls for arg in call[1:]), (value, ran.calls)


def inventory_with(case: str, where: Path, scope: str, name: str, value: str) -> Path:
    """The golden case's inventory with one variable set to `value` by a YAML vars file,
    which overrides the INI (group_vars/all over [all:vars], host_vars over host lines)."""
    inv = where / "inv"
    inv.mkdir(parents=True)
    (inv / "hosts.ini").write_text((GOLDEN / case / "inventory.ini").read_text())
    if scope == "all":
        (inv / "group_vars").mkdir()
        (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump({name: value}))
    else:
        (inv / "host_vars").mkdir()
        # From the golden expectation: loading the inventory here would leave Ansible's vars
        # plugin remembering that no host_vars existed.
        first = json.loads((GOLDEN / case / "expected.json").read_text())["plan"]["hosts"][0][
            "name"
        ]
        (inv / "host_vars" / f"{first}.yml").write_text(yaml.safe_dump({name: value}))
    return inv / "hosts.ini"


def check_example(where: Path, case: str, scope: str, name: str, value: str) -> str:
    """Plan with the hostile value; 'refused' or 'rendered' after the checks pass."""
    try:
        plan = build_plan(load_cluster(inventory_with(case, where, scope, name, value)))
    except K2Error as error:
        refused = error.problems
    else:
        assert_contained(shells(plan), where / "sandbox", value)
        return "rendered"
    assert refused
    assert all("\n" not in p and "\r" not in p for p in refused), refused
    assert any("fix" in p or "expected" in p or "must" in p for p in refused)
    return "refused"


def hostile() -> st.SearchStrategy[str]:
    return st.builds(
        lambda lead, parts: lead + "".join(parts),
        st.sampled_from(("", "/", "/etc/k2/", "-")),
        st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=4),
    )


def accepted_words() -> st.SearchStrategy[str]:
    """Values the contract accepts as words or paths that a shell would still expand."""
    return st.builds(
        lambda lead, parts: lead + "".join(parts),
        st.sampled_from(("", "/srv/", "-")),
        st.lists(st.sampled_from(SHELL_SPECIAL_SAFE), min_size=1, max_size=3),
    )


_SETTINGS = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_SETTINGS
@given(case=st.sampled_from(CASES), var=st.sampled_from(STRING_VARS), value=hostile())
def test_hostile_value_is_refused_or_contained(
    tmp_path_factory: pytest.TempPathFactory, case: str, var: tuple[str, str], value: str
) -> None:
    check_example(tmp_path_factory.mktemp("ex"), case, *var, value)


@_SETTINGS
@given(
    case=st.sampled_from(CASES),
    name=st.sampled_from(("k2_served_model_name", "k2_config_dir", "k2_model_dir")),
    value=accepted_words(),
)
def test_accepted_shell_special_words_stay_literal(
    tmp_path_factory: pytest.TempPathFactory, case: str, name: str, value: str
) -> None:
    check_example(tmp_path_factory.mktemp("ex"), case, "all", name, value)


def test_every_golden_shell_runs_to_its_end_in_the_sandbox(tmp_path: Path) -> None:
    scripts = {
        f"{case}:{name}": text
        for case in CASES
        for name, text in shells(build_plan(load_cluster(GOLDEN / case / "inventory.ini"))).items()
    }
    assert any("mpirun" in text for text in scripts.values())
    assert any(":exec:" in name for name in scripts)
    assert_contained(scripts, tmp_path)
    ran = sandbox(scripts, tmp_path / "again")
    assert any(call[0] == "mpirun" for call in ran.calls)


def test_some_hostile_values_plan_and_are_checked(tmp_path: Path) -> None:
    assert check_example(tmp_path / "a", "sglang-tp", "all", "k2_served_model_name", "~root") == (
        "rendered"
    )
    assert check_example(tmp_path / "b", "sglang-tp", "all", "k2_config_dir", "/x;k2pwn") == (
        "refused"
    )


# The sandbox can fail: a value rendered without quotes is caught, each way it can go wrong.
UNQUOTED = [
    ("substitution", f"exec echo $({CANARY})\n"),
    ("backticks", f"exec echo `{CANARY}`\n"),
    ("separator", f"exec echo a;{CANARY}\n"),
    ("redirect", f"echo a >{CANARY}\n"),
    ("tilde", "exec echo ~root\n"),
    ("syntax", "exec echo 'a\n"),
]


@pytest.mark.parametrize(("kind", "script"), UNQUOTED, ids=[u[0] for u in UNQUOTED])
def test_an_unquoted_render_is_caught(tmp_path: Path, kind: str, script: str) -> None:
    with pytest.raises(AssertionError):
        assert_contained({"bad.sh": "set -eu\n" + script}, tmp_path, "~root")


def test_an_unquoted_value_in_a_real_launch_script_is_caught(tmp_path: Path) -> None:
    plan = build_plan(load_cluster(GOLDEN / "sglang-tp" / "inventory.ini"))
    scripts = shells(plan)
    name, text = next((n, t) for n, t in scripts.items() if "kimi-k2" in t)
    assert_contained(scripts, tmp_path / "as-rendered")
    broken = {**scripts, name: text.replace("kimi-k2", f"kimi-k2$({CANARY})", 1)}
    with pytest.raises(AssertionError):
        assert_contained(broken, tmp_path / "unquoted")
