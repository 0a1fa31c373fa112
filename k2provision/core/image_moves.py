"""How each image reaches the hosts that run it: fetched once, then streamed host to host.

Role k2_container_runtime asks every host which images it holds (by image ID) and calls
``image_moves`` once: for each image some host lacks, the host it comes from (the first host,
in inventory order, that holds it: a peer, so a spare or a replaced host never goes to the
registry; else the first host that runs it, which builds it from containers/ or pulls it),
and the hosts it is streamed to (the weights' relay carries its ``docker save`` archive down
a chain; each host loads it and checks the image ID against the source's before any
container uses it). ``pull_refusal`` turns a failed ``docker pull`` into one line with the
fix. Pure functions of the facts they are given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# What registries answer when they refuse, in the words docker and podman print them.
_REFUSALS: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("toomanyrequests", "rate limit", "429"),
        "the registry's pull rate limit; fix: `docker login` on that host with an account "
        "whose limit is higher (docker keeps the credentials), or point the inventory's image "
        "at a mirror; the other hosts get the image from this one, never from the registry",
    ),
    (
        ("unauthorized", "authentication required", "denied", "403", "401"),
        "the registry refused the credentials; fix: `docker login REGISTRY` on that host "
        "(docker keeps the credentials in its own config, k2provision never sees them)",
    ),
    (
        ("manifest unknown", "not found", "no such", "404"),
        "the registry has no such image; fix: check the tag in k2_image / k2_router_image",
    ),
    (
        ("connection refused", "no such host", "i/o timeout", "dial tcp", "tls", "x509"),
        "the registry is not reachable from that host; fix: open its address (or a proxy) "
        "to it, or name a registry it reaches",
    ),
)


def image_moves(
    hosts: Sequence[str],
    held: Mapping[str, Mapping[str, str] | None],
    needed: Mapping[str, Sequence[str] | None],
    builds: Mapping[str, str],
) -> list[dict[str, Any]]:
    """One move per image that a host running it lacks, in the order the hosts need them.

    `hosts`: the play's hosts in inventory order; `held`: host -> {image: image ID} of what
    it holds; `needed`: host -> images its processes run; `builds`: image -> the directory of
    containers/ that builds it (an image not in it is pulled). Each move: ``image``,
    ``source`` (the host it comes from), ``fetch`` (``peer``: that host holds it; ``build``;
    ``pull``), ``build``, ``id`` (the source's image ID, "" until fetched) and ``targets``
    (the other hosts that run it and lack it, in inventory order)."""
    order: list[str] = []
    for host in hosts:
        for image in needed.get(host) or ():
            if image not in order:
                order.append(image)
    moves = []
    for image in order:
        users = [h for h in hosts if image in (needed.get(h) or ())]
        lacking = [h for h in users if image not in (held.get(h) or {})]
        if not lacking:
            continue
        holders = [h for h in hosts if image in (held.get(h) or {})]
        if holders:
            source, fetch = holders[0], "peer"
        else:
            source, fetch = lacking[0], "build" if image in builds else "pull"
        moves.append(
            {
                "image": image,
                "source": source,
                "fetch": fetch,
                "build": builds.get(image, ""),
                "id": (held.get(source) or {}).get(image, ""),
                "targets": [h for h in lacking if h != source],
            }
        )
    return moves


def image_move_line(move: Mapping[str, Any]) -> str:
    """What a move does, in one line (check mode prints it)."""
    fetch = {
        "peer": f"held by {move['source']}",
        "build": f"built on {move['source']} from containers/{move['build']}",
        "pull": f"pulled once on {move['source']}",
    }[str(move["fetch"])]
    targets = list(move.get("targets") or [])
    streamed = f", streamed to {', '.join(targets)}" if targets else ""
    return f"{move['image']}: {fetch}{streamed}"


def pull_refusal(host: str, image: str, stderr: str) -> str:
    """One line for a failed `docker pull`: host, image, what the registry said, the fix."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = lines[-1] if lines else "no output"
    low = stderr.lower()
    fix = next(
        (why for words, why in _REFUSALS if any(w in low for w in words)),
        "fix: run `docker pull` on that host to see why, then re-run",
    )
    return f"{host}: docker pull {image} failed ({said[:300]}): {fix}"
