"""Which images a plan runs, and where each comes from.

An image is either pulled as published (SGLang's, vLLM's) or built here from a directory of
``containers/`` when nothing published carries what the plan runs: the router
(sglang-router, pinned apart from every engine), TensorRT-LLM with sshd for its mpirun mesh,
KTransformers. A built image's tag is derived from its build's content (every file of the
directory: the Containerfile pins its base and packages), so the same sources give the same
tag and a changed Containerfile a new one: ``k2provision/router:0.3.2-<12 hex>``. An
inventory that names its own image (``k2_image``, ``k2_router_image``) keeps it, pulled as
named. The lab profile runs the stand-in image everywhere.

Where an image travels is the role's business (k2_container_runtime: fetched once, streamed
host to host); the plan says what each host runs and which images are built from what.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from k2provision.core import catalog
from k2provision.core.records import Cluster, EngineRelease, HostPlan, ImageSource
from k2provision.errors import PlanError

CONTAINERS_DIR = Path(__file__).resolve().parents[2] / "containers"
BUILD_REPOSITORY = "k2provision"
ROUTER_BUILD = "router"
LAB_IMAGE = "localhost/k2-standin:lab"


@cache
def build_digest(build: str) -> str:
    """sha256 over the paths and contents of every file of containers/`build`."""
    root = CONTAINERS_DIR / build
    files = sorted(p for p in root.rglob("*") if p.is_file())
    if not files:
        raise PlanError(
            [
                f"{root}: no build files, expected the project's containers/{build} (the image "
                "apply builds); fix: run k2provision from its checkout (pip install -e .), or "
                "name a prebuilt image in the inventory (k2_image, k2_router_image)"
            ]
        )
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def build_tag(build: str, version: str) -> str:
    """The tag a build of containers/`build` gets: its version and its content's digest."""
    return f"{BUILD_REPOSITORY}/{build}:{version}-{build_digest(build)[:12]}"


def engine_image(cluster: Cluster, release: EngineRelease) -> str:
    """The image the engine runs in: k2_image; the stand-in in the lab; the engine's build
    when it has one; else the published image."""
    if cluster.tunables.image:
        return cluster.tunables.image
    if cluster.lab:
        return LAB_IMAGE
    return build_tag(release.build, release.version) if release.build else release.image


def router_image(cluster: Cluster, image: str) -> str:
    """The image the router runs in: k2_router_image; the engine's image in the lab (the
    stand-in serves the router's routes); else the router's build."""
    if cluster.tunables.router_image:
        return cluster.tunables.router_image
    if cluster.lab:
        return image
    return build_tag(ROUTER_BUILD, catalog.ROUTER.version)


def built_images(release: EngineRelease) -> dict[str, str]:
    """Tag -> containers/ directory of every image this project builds for `release`."""
    builds = {build_tag(ROUTER_BUILD, catalog.ROUTER.version): ROUTER_BUILD}
    if release.build:
        builds[build_tag(release.build, release.version)] = release.build
    return builds


def image_sources(hosts: Sequence[HostPlan], release: EngineRelease) -> tuple[ImageSource, ...]:
    """Every image the hosts' processes run, with the hosts that run it (inventory order) and
    the build that makes it ("" for an image pulled as named)."""
    users: dict[str, list[str]] = {}
    for host in hosts:
        for process in host.processes:
            names = users.setdefault(process.image, [])
            if host.name not in names:
                names.append(host.name)
    # Only a plan that runs a build reads containers/ (one naming its own images never does).
    ours = any(ref.startswith(f"{BUILD_REPOSITORY}/") for ref in users)
    builds = built_images(release) if ours else {}
    return tuple(
        ImageSource(ref=ref, build=builds.get(ref, ""), hosts=tuple(names))
        for ref, names in users.items()
    )
