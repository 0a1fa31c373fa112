"""One rule for every directory an inventory names: the roles create, re-own and re-mode these
directories and write into them, so each must be a directory of its own.

Refused, for every variable of the contract whose name ends in ``_dir`` (the cluster variables,
the tunables and every role's options, found by name so that a new one is covered too):
a relative path (each host, and the controller, would resolve it against another working
directory), a ``.`` or ``..`` component, a directory of the operating system itself (``/``,
``/etc``, ``/usr``, ``/var/lib`` ...), anything under the kernel's, the boot loader's and the
packages' trees (``/proc``, ``/sys``, ``/dev``, ``/boot``, ``/usr`` but ``/usr/local/<name>``,
``/lib``, Docker's ``/var/lib/docker``), a user's home directory (``/root``,
``/home/<user>``), which would be re-owned, and anything in an ``.ssh`` directory. A
directory the roles hand to another user (Prometheus' data directory, owned by uid 65534) may
also not be, or hold, a directory another variable names: that one would change owner with it.

Pure: values as Ansible resolved them per host; templated values are left for the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from k2provision.core import role_specs
from k2provision.core.records import Tunables
from k2provision.core.variables import CLUSTER_VARS, TUNABLE_VARS, field_of, shorten_hosts, show

# The operating system's own directories: re-owning or re-moding one breaks the host.
SYSTEM_DIRECTORIES = frozenset(
    {
        "/",
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/home",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/lost+found",
        "/media",
        "/mnt",
        "/opt",
        "/proc",
        "/run",
        "/sbin",
        "/snap",
        "/srv",
        "/sys",
        "/tmp",
        "/usr",
        "/var",
        *(
            f"/usr/{d}"
            for d in ("bin", "sbin", "lib", "lib32", "lib64", "libexec", "include", "share")
        ),
        "/usr/src",
        "/usr/local",
        *(f"/usr/local/{d}" for d in ("bin", "sbin", "lib", "etc", "include", "share", "src")),
        *(
            f"/var/{d}"
            for d in (
                "lib",
                "log",
                "cache",
                "tmp",
                "spool",
                "mail",
                "run",
                "lock",
                "opt",
                "local",
                "backups",
            )
        ),
        "/var/lib/docker",
        "/var/lib/containerd",
        "/etc/ssh",
        "/etc/systemd",
        "/etc/docker",
    }
)
# Trees that belong to the kernel, the boot loader or the package manager as a whole (under
# /usr only /usr/local/<name> is the administrator's).
SYSTEM_TREES = (
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr",
    "/var/lib/docker",
    "/var/lib/containerd",
)
# Directories a role hands to another user, and that user.
CHOWNED: dict[str, str] = {"k2_monitoring_data_dir": "uid 65534, as Prometheus runs"}
# Where a variable with no default of its own lands by default (for the examples in fixes).
_DEFAULTS: dict[str, str] = {"k2_model_dir": "/models/<model name>"}


def directory_variables() -> tuple[str, ...]:
    """Every directory-valued variable of the contract: cluster, tunable and role options."""
    names = (*CLUSTER_VARS, *TUNABLE_VARS, *role_specs.option_names())
    return tuple(dict.fromkeys(n for n in names if n.endswith("_dir")))


def normal_path(value: str) -> str:
    """An absolute path with repeated and trailing slashes dropped (/etc// -> /etc)."""
    return "/" + "/".join(part for part in value.split("/") if part)


def directory_problem(value: str) -> str | None:
    """Why `value` cannot be a directory the roles own (None when it can)."""
    if not value.startswith("/"):
        return (
            "is a relative path, which each host (and the controller) would resolve against "
            "its own working directory"
        )
    if {".", ".."} & set(value.split("/")):
        return "holds a '.' or '..' component, which hides the directory it names"
    path = normal_path(value)
    if path in SYSTEM_DIRECTORIES:
        return (
            f"is {path}, a directory of the operating system, which the roles would re-own, "
            "re-mode and write into"
        )
    tree = next((t for t in SYSTEM_TREES if path.startswith(f"{t}/")), None)
    if tree and not path.startswith("/usr/local/"):
        return (
            f"lies under {tree}, which belongs to the kernel, the boot loader or the "
            "system's packages"
        )
    parts = path.split("/")[1:]
    if ".ssh" in parts:
        return "lies in an .ssh directory, whose owner and modes SSH logins depend on"
    if path == "/root" or (len(parts) == 2 and parts[0] == "home"):
        return f"is {path}, a user's home directory, which the roles would re-own"
    return None


def _example(variable: str) -> str:
    """The variable's default where it is a plain path, for the expectation's example."""
    default = role_specs.default(variable)
    if isinstance(default, str) and default and not role_specs.is_template(default):
        return f", e.g. {default} (its default)"
    field = Tunables.model_fields.get(variable.removeprefix("k2_"))
    if field is not None and isinstance(field.default, str):
        return f", e.g. {field.default} (its default)"
    if variable in _DEFAULTS:
        return f", e.g. {_DEFAULTS[variable]} (its default)"
    return ""


@cache
def _field_check(variable: str) -> TypeAdapter[Any] | None:
    """The check of the Cluster or Tunables field behind a variable (None for others)."""
    field = field_of(variable)
    if field is None:
        return None
    annotation: Any = field.annotation
    if field.metadata:  # the field's own constraints (AbsolutePath's check among them)
        annotation = Annotated[(annotation, *field.metadata)]
    return TypeAdapter(annotation)


def _field_refuses(variable: str, value: Any) -> bool:
    """Whether the cluster's own field check refuses the value (then it says so itself)."""
    check = _field_check(variable)
    if check is None:
        return False
    try:
        check.validate_python(value)
    except ValidationError:
        return True
    return False


def _effective(variables: Mapping[str, Any], name: str) -> str | None:
    """A directory variable's value on one host: its own, else its declared default."""
    value = variables.get(name, role_specs.default(name))
    if value is None and name == "k2_config_dir":
        value = Tunables.model_fields["config_dir"].default
    if not isinstance(value, str) or not value or role_specs.is_template(value):
        return None
    return value


def directory_problems(host_vars: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A line per directory variable and value refused, naming the hosts that set it."""
    names = directory_variables()
    refused: dict[tuple[str, str, str], list[str]] = {}
    for host, variables in host_vars.items():
        for name in names:
            value = variables.get(name)
            if not isinstance(value, str) or role_specs.is_template(value):
                continue  # unset, another type (the spec says), or for the run to judge
            if value == "" and role_specs.default(name) == "":
                continue  # the role's "none" or "the default"
            if _field_refuses(name, value):
                continue
            if why := directory_problem(value):
                refused.setdefault((name, value, why), []).append(host)
        for name, owner in CHOWNED.items():
            own = _effective(variables, name)
            if own is None or directory_problem(own):
                continue
            root = normal_path(own)
            for other in names:
                theirs = _effective(variables, other) if other != name else None
                if theirs is None or not theirs.startswith("/"):
                    continue
                path = normal_path(theirs)
                if path == root or path.startswith(f"{root}/"):
                    where = "is" if path == root else "holds"
                    why = (
                        f"{where} {other}={show(theirs)}, which would change owner with it "
                        f"(the role hands {name} to {owner})"
                    )
                    refused.setdefault((name, own, why), []).append(host)
                    break
    return [
        f"{shorten_hosts(hosts)}: {name}={show(value)} {why}; expected a directory of its own "
        f"(absolute, not a system or home directory){_example(name)}; fix: set {name} to "
        "such a directory, or remove it to use its default"
        for (name, value, why), hosts in refused.items()
    ]
