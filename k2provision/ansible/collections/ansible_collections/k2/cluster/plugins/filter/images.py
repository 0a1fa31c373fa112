"""Filters of the images phase (role k2_container_runtime): thin bridges from Ansible's data to
k2provision.core.image_moves, so the decisions are tested without a host.

- ``hosts | k2.cluster.image_moves(held, needed, builds, elsewhere)``: per image some host
  lacks, where it comes from and where it is streamed; ``elsewhere`` is the results of a looped
  ``docker image inspect`` (item: [host, image]) on hosts outside the run, which count as
  holders.
- ``move | k2.cluster.image_move_line``: that move in one line.
- ``stderr | k2.cluster.image_pull_refusal(host, image)``: a failed pull in one line, with the fix.
- ``plan | k2.cluster.image_builds``: image -> the directory of containers/ that builds it.
"""

from __future__ import annotations

from typing import Any

from k2provision.core.image_moves import image_move_line, image_moves, pull_refusal
from k2provision.core.inventory import plain_value as _plain


def _moves(
    hosts: Any, held: Any, needed: Any, builds: Any, elsewhere: Any = ()
) -> list[dict[str, Any]]:
    holdings = {str(h): dict(ids or {}) for h, ids in _plain(held).items()}
    for result in _plain(elsewhere) or ():
        if result.get("rc") == 0 and not result.get("unreachable"):
            host, image = result["item"]
            holdings.setdefault(str(host), {})[str(image)] = str(result["stdout"]).strip()
    return image_moves([str(h) for h in _plain(hosts)], holdings, _plain(needed), _plain(builds))


def _line(move: Any) -> str:
    return image_move_line(_plain(move))


def _refusal(stderr: Any, host: Any, image: Any) -> str:
    return pull_refusal(str(host), str(image), str(stderr or ""))


def _builds(plan: Any) -> dict[str, str]:
    images = _plain(plan).get("images") or []
    return {str(i["ref"]): str(i["build"]) for i in images if i.get("build")}


class FilterModule:
    """Ansible's entry point for filter plugins."""

    def filters(self) -> dict[str, Any]:
        return {
            "image_moves": _moves,
            "image_move_line": _line,
            "image_pull_refusal": _refusal,
            "image_builds": _builds,
        }
