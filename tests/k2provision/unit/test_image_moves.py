"""Where each image comes from and goes (core/image_moves.py): a peer before any registry,
one pull or build otherwise, every host that lacks it in the chain; a refusal in one line."""

from __future__ import annotations

import pytest

from k2provision.core.image_moves import image_move_line, image_moves, pull_refusal
from k2provision.run.events import _differences

HOSTS = ["n1", "n2", "n3", "r1"]
ENGINE = "lmsysorg/sglang:v0.5.23"
ROUTER = "k2provision/router:0.3.2-abc"
NEEDED = {"n1": [ENGINE], "n2": [ENGINE], "n3": [ENGINE], "r1": [ROUTER]}
BUILDS = {ROUTER: "router"}


def test_nothing_held_one_pull_on_the_first_host_and_one_build_then_chains() -> None:
    moves = image_moves(HOSTS, {}, NEEDED, BUILDS)
    assert moves == [
        {"image": ENGINE, "source": "n1", "fetch": "pull", "build": "", "id": "",
         "targets": ["n2", "n3"]},
        {"image": ROUTER, "source": "r1", "fetch": "build", "build": "router", "id": "",
         "targets": []},
    ]  # fmt: skip
    assert image_move_line(moves[0]) == f"{ENGINE}: pulled once on n1, streamed to n2, n3"
    assert image_move_line(moves[1]) == f"{ROUTER}: built on r1 from containers/router"


def test_a_host_that_lacks_it_gets_it_from_the_first_peer_that_holds_it() -> None:
    held = {"n2": {ENGINE: "sha256:e"}, "n3": {ENGINE: "sha256:e"}, "r1": {ROUTER: "sha256:r"}}
    (move,) = image_moves(HOSTS, held, NEEDED, BUILDS)
    assert (move["source"], move["fetch"], move["id"], move["targets"]) == (
        "n2",
        "peer",
        "sha256:e",
        ["n1"],
    )
    assert image_move_line(move) == f"{ENGINE}: held by n2, streamed to n1"


def test_everything_held_moves_nothing() -> None:
    held = {h: dict.fromkeys(NEEDED[h], "x") for h in HOSTS}
    assert image_moves(HOSTS, held, NEEDED, BUILDS) == []


def test_a_holder_outside_the_image_users_still_serves_as_the_peer() -> None:
    held = {"r1": {ENGINE: "sha256:e"}}
    (move, _) = image_moves(HOSTS, held, NEEDED, BUILDS)
    assert move["source"] == "r1"
    assert move["targets"] == ["n1", "n2", "n3"]


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        ("Error response from daemon: toomanyrequests: You have reached your pull rate limit",
         "pull rate limit; fix: `docker login`"),
        ("Error: unauthorized: authentication required", "refused the credentials; fix"),
        ("Error: initializing source docker://r/x:y: reading manifest y in r/x: manifest unknown",
         "no such image; fix: check the tag"),
        ("Error: pinging container registry r: dial tcp 1.2.3.4:443: connect: connection refused",
         "not reachable from that host"),
        ("something odd", "fix: run `docker pull` on that host"),
    ],
)  # fmt: skip
def test_a_refused_pull_is_one_line_with_host_image_answer_and_fix(
    stderr: str, expected: str
) -> None:
    line = pull_refusal("n1", "r/x:y", f"Trying to pull r/x:y...\n{stderr}\n")
    assert line.startswith(f"n1: docker pull r/x:y failed ({stderr[:40]}")
    assert expected in line


def test_check_mode_lines_reach_the_run_display() -> None:
    lines = ["img: pulled once on n1, streamed to n2"]
    res = {"ansible_facts": {"_k2_container_runtime_would": lines}}
    assert _differences(res) == ("image img: pulled once on n1, streamed to n2",)


def test_a_host_outside_the_run_that_holds_it_is_the_peer() -> None:
    """`apply --limit n3` (or a run where the others' prepare is converged): n3 lacks the
    image, n2, outside the run, holds it; n1 is unreachable."""
    from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter.images import (  # noqa: E501
        FilterModule,
    )

    moves = FilterModule().filters()["image_moves"]
    elsewhere = [
        {"item": ["n1", ENGINE], "unreachable": True},
        {"item": ["n2", ENGINE], "rc": 0, "stdout": "sha256:e\n"},
    ]
    (move,) = moves(["n1", "n2", "n3"], {"n3": {}}, {"n3": [ENGINE]}, {}, elsewhere)
    assert (move["source"], move["fetch"], move["id"], move["targets"]) == (
        "n2",
        "peer",
        "sha256:e",
        ["n3"],
    )
    assert moves(["n3"], {"n3": {}}, {"n3": [ENGINE]}, {})[0]["fetch"] == "pull"
