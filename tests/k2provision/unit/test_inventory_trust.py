"""Wrong inputs at the trust boundary, each refused at plan time with one line that names the
host or inventory, the value, what was expected and the fix: shell metacharacters in paths and
names, listeners and addresses that fail only on the hosts, weights settings that cannot work,
tunables of another engine, image references, unbounded input files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from k2provision.errors import InventoryError
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster

HOSTS = "[nodes]\nn1 ansible_host=10.0.0.1\nn2 ansible_host=10.0.0.2\n"
BASE = "[all:vars]\nk2_engine=sglang\nk2_layout=tp\n"
VLLM = "[all:vars]\nk2_engine=vllm\nk2_layout=tp\n"


def with_vars(*lines: str, hosts: str = HOSTS, base: str = BASE) -> str:
    return hosts + base + "".join(f"{line}\n" for line in lines)


HOSTILE = ["$(touch pwned)", "`touch pwned`", "a;touch pwned", "a|b", "a&b", "a>b", "'q'", '"q"',
           "a\\b", "a*", "a(b)", "a{b}"]  # fmt: skip

CASES: list[tuple[str, str, tuple[str, ...]]] = [
    *[
        (f"config-dir-{i}", with_vars(f"k2_config_dir=/etc/k2{v}"), ("k2_config_dir", "expected"))
        for i, v in enumerate(HOSTILE)
    ],
    *[
        (f"model-dir-{i}", with_vars(f"k2_model_dir=/models/x{v}"), ("k2_model_dir", "expected"))
        for i, v in enumerate(HOSTILE[:4])
    ],
    *[
        (
            f"served-name-{i}",
            with_vars(f"k2_served_model_name=k{v}"),
            ("k2_served_model_name", "shell metacharacters"),
        )
        for i, v in enumerate(HOSTILE[:4])
    ],
    ("socket-ifname", with_vars("k2_socket_ifname=eth0;reboot"), ("k2_socket_ifname", "expected")),
    (
        "host-name-dollar",
        HOSTS.replace("n2 ansible", "n$(id) ansible") + BASE,
        ("n$(id)", "host name", "fix: rename"),
    ),
    (
        "host-name-backtick",
        HOSTS.replace("n2 ansible", "n`id` ansible") + BASE,
        ("n`id`", "host name", "fix: rename"),
    ),
    ("address-shell", HOSTS.replace("10.0.0.2", "h;id") + BASE, ("n2", "ansible_host=h;id")),
    ("zone-id", HOSTS.replace("10.0.0.2", "fe80::1%eth0") + BASE, ("n2", "zone id", "fix:")),
    (
        "local-ip-zone",
        with_vars(
            "k2_local_ip=fe80::2%eth0",
            hosts=HOSTS.replace(
                "n2 ansible_host=10.0.0.2", "n2 ansible_host=10.0.0.2 k2_local_ip=fe80::2%eth0"
            ),
        ),
        ("zone id",),
    ),
    (
        "api-port-is-ssh",
        with_vars("k2_api_port=22", base=VLLM),
        ("n1: k2_api_port=22", "SSH port", "fix:"),
    ),
    (
        "api-port-is-custom-ssh",
        HOSTS.replace("10.0.0.1", "10.0.0.1 ansible_port=2200") + VLLM + "k2_api_port=2200\n",
        ("n1: k2_api_port=2200", "SSH port, ansible_port=2200"),
    ),
    (
        "api-port-is-the-ssh-alias",
        HOSTS.replace("10.0.0.1", "10.0.0.1 ansible_port=22 ansible_ssh_port=2222")
        + VLLM
        + "k2_api_port=2222\n",
        ("n1: k2_api_port=2222", "SSH port, ansible_ssh_port=2222"),
    ),
    (
        "exporter-port-is-ssh",
        HOSTS.replace("10.0.0.2", "10.0.0.2 ansible_ssh_port=9100") + BASE,
        ("n2: port 9100 (the node exporter", "set ansible_ssh_port to it"),
    ),
    (
        "firewall-dns-alias",
        HOSTS.replace("10.0.0.2", "10.0.0.2 ansible_ssh_host=gpu2.example")
        + with_vars("k2_firewall_enabled=true", hosts=""),
        ("n2: ansible_ssh_host=gpu2.example is a DNS name", "k2_local_ip"),
    ),
    (
        "firewall-ssh-ports",
        HOSTS.replace("10.0.0.1", "10.0.0.1 ansible_ssh_port=2222")
        + with_vars("k2_firewall_enabled=true", "k2_firewall_ssh_ports=22", hosts=""),
        ("n1: k2_firewall_ssh_ports=22 leaves out", "ansible_ssh_port=2222", "add 2222"),
    ),
    (
        "engine-port-is-ssh",
        with_vars("k2_sglang_port=22"),
        ("n1: k2_sglang_port=22", "SSH port", "fix: set k2_sglang_port"),
    ),
    ("dist-port-span", with_vars("k2_dist_port=65533"), ("k2_dist_port=65533", "at most 65529")),
    ("unspecified", HOSTS.replace("10.0.0.2", "0.0.0.0") + BASE, ("n2", "unspecified")),
    ("unspecified-v6", HOSTS.replace("10.0.0.2", "::") + BASE, ("n2", "unspecified")),
    ("broadcast", HOSTS.replace("10.0.0.2", "255.255.255.255") + BASE, ("n2", "broadcast")),
    ("multicast", HOSTS.replace("10.0.0.2", "224.0.0.1") + BASE, ("n2", "multicast")),
    (
        "loopback-multi-node",
        HOSTS.replace("10.0.0.2", "127.0.0.2") + BASE,
        ("n2", "ansible_host=127.0.0.2", "loopback", "fix:"),
    ),
    (
        "localhost-multi-node",
        HOSTS.replace("10.0.0.2", "localhost") + BASE,
        ("n2", "ansible_host=localhost", "loopback"),
    ),
    (
        "loopback-local-ip",
        HOSTS.replace("10.0.0.2", "10.0.0.2 k2_local_ip=::1") + BASE,
        ("n2", "k2_local_ip=::1", "loopback"),
    ),
    (
        "dns-case",
        "[nodes]\nn1 ansible_host=gpu1.example\nn2 ansible_host=GPU1.example\n" + BASE,
        ("n2", "GPU1.example", "spelt another way"),
    ),
    (
        "dns-dot",
        "[nodes]\nn1 ansible_host=gpu1.example\nn2 ansible_host=gpu1.example.\n" + BASE,
        ("n2", "gpu1.example.", "spelt another way"),
    ),
    (
        "seed-not-in-inventory",
        with_vars("k2_weights_source=dir", "k2_weights_source_host=zz"),
        ("k2_weights_source_host=zz", "not a host", "fix:"),
    ),
    (
        "hub-without-revision",
        with_vars("k2_weights_source=hub"),
        ("k2_weights_source=hub", "k2_weights_revision", "fix:"),
    ),
    (
        "synthetic-not-lab",
        with_vars("k2_weights_source=synthetic"),
        ("k2_weights_source=synthetic", "not a lab", "fix:"),
    ),
    (
        "trtllm-tunable-on-sglang",
        with_vars("k2_trtllm_max_batch_size=64"),
        ("k2_trtllm_max_batch_size=64", "read only by trtllm", "fix: remove"),
    ),
    ("vllm-tunable-on-sglang", with_vars("k2_vllm_max_num_seqs=64"), ("read only by vllm",)),
    ("pd-tunable-on-tp", with_vars("k2_pd_timeout_s=100"), ("k2_pd_timeout_s=100", "layout pd")),
    (
        "kt-tunable-on-vllm",
        with_vars("k2_ktransformers_cache_lens=100", base=VLLM),
        ("read only by ktransformers",),
    ),
    (
        "image-upper",
        with_vars("k2_image=LMSYS/SGLang:latest"),
        ("k2_image=LMSYS/SGLang:latest", "not an image reference", "fix:"),
    ),
    ("image-digest", with_vars("k2_image=lmsysorg/sglang@sha256:abc"), ("not an image reference",)),
    ("router-image", with_vars("k2_router_image=a//b"), ("k2_router_image=a//b",)),
]


@pytest.mark.parametrize(("text", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_with_host_value_expectation_and_fix(
    tmp_path: Path, text: str, fragments: tuple[str, ...]
) -> None:
    inv = tmp_path / "inv.ini"
    inv.write_text(text)
    with pytest.raises(InventoryError) as refused:
        build_plan(load_cluster(inv))  # the engine's own rules are the plan's
    lines = [line for line in refused.value.problems if all(f in line for f in fragments)]
    assert lines, refused.value.problems
    assert "fix:" in lines[0]


def test_at_least_forty_cases() -> None:
    assert len(CASES) >= 40


def test_fifo_inventory_is_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "inv.ini"
    os.mkfifo(fifo)
    with pytest.raises(InventoryError) as refused:
        load_cluster(fifo)
    assert "not a regular file" in refused.value.problems[0]


def test_yaml_alias_bomb_is_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    vars_dir = tmp_path / "group_vars"
    vars_dir.mkdir()
    (vars_dir / "all.yml").write_text("\n".join(lines) + "\n")
    (tmp_path / "inv.ini").write_text(HOSTS + BASE)
    with pytest.raises(InventoryError) as refused:
        load_cluster(tmp_path / "inv.ini")
    assert "aliases expand" in refused.value.problems[0]


def test_symlink_loop_in_an_inventory_directory_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "inv" / "sub").mkdir(parents=True)
    (tmp_path / "inv" / "hosts.ini").write_text(HOSTS + BASE)
    (tmp_path / "inv" / "sub" / "up").symlink_to("..")
    cluster = load_cluster(tmp_path / "inv")
    assert [h.name for h in cluster.hosts] == ["n1", "n2"]


def test_out_of_bounds_cli_argument_is_exit_2_with_the_range() -> None:
    from typer.testing import CliRunner

    from k2provision.cli import build_app

    result = CliRunner().invoke(build_app([]), ["models", "--context-length", "9" * 20])
    assert result.exit_code == 2
    assert "expected an integer from 1 to" in result.output


def test_loopback_is_allowed_in_a_one_host_cluster(tmp_path: Path) -> None:
    (tmp_path / "inv.ini").write_text("[nodes]\nn1 ansible_host=127.0.0.1\n" + BASE)
    assert load_cluster(tmp_path / "inv.ini").hosts[0].address == "127.0.0.1"


def test_a_host_reached_over_loopback_may_name_its_own_address(tmp_path: Path) -> None:
    (tmp_path / "inv.ini").write_text(
        HOSTS.replace("10.0.0.2", "127.0.0.1 ansible_port=2202 k2_local_ip=10.0.0.2") + BASE
    )
    assert load_cluster(tmp_path / "inv.ini").host("n2").local_ip == "10.0.0.2"


CONSTRUCTED = (
    "plugin: {name}\nstrict: true\ngroups:\n  nodes: gpu_pool == 'serve'\n"
    "compose:\n  k2_local_ip: fabric_ip\n"
)


@pytest.mark.parametrize("name", ["ansible.builtin.constructed", "constructed"])
def test_a_constructed_plugin_file_over_an_ini_source(tmp_path: Path, name: str) -> None:
    """The plugin, named by its collection or not, builds [nodes] and composes k2_local_ip."""
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "01-hosts.ini").write_text(
        "[gpus]\nn1 ansible_host=10.0.0.1 fabric_ip=10.1.0.1 gpu_pool=serve\n"
        "n2 ansible_host=10.0.0.2 fabric_ip=10.1.0.2 gpu_pool=serve\n"
        "spare ansible_host=10.0.0.3 gpu_pool=none\n" + BASE
    )
    (tmp_path / "inv" / "02-constructed.yml").write_text(CONSTRUCTED.format(name=name))
    cluster = load_cluster(tmp_path / "inv")
    assert [(h.name, h.local_ip) for h in cluster.hosts] == [("n1", "10.1.0.1"), ("n2", "10.1.0.2")]


@pytest.mark.parametrize("name", ["ansible.builtin.generator", "generator"])
def test_a_generator_plugin_file_alone(tmp_path: Path, name: str) -> None:
    (tmp_path / "gen.yml").write_text(
        f"plugin: {name}\nhosts:\n  name: 'gpu-{{{{ n }}}}'\n  parents:\n    - name: nodes\n"
        "layers:\n  n: ['01', '02']\n"
    )
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("k2_engine: sglang\nk2_layout: tp\n")
    assert [h.name for h in load_cluster(tmp_path / "gen.yml").hosts] == ["gpu-01", "gpu-02"]


def test_a_plugin_ansible_cannot_load_is_named(tmp_path: Path) -> None:
    (tmp_path / "inv.yml").write_text("plugin: nosuch.collection.thing\n")
    with pytest.raises(InventoryError) as refused:
        load_cluster(tmp_path / "inv.yml")
    assert "nosuch.collection.thing" in refused.value.problems[0]
    assert "fix:" in refused.value.problems[0]
