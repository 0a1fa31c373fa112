"""Build the stand-in engine image for the lab: a test double for the engines' GPU kernels.

`build_standin()` builds ``k2lab/standin_image`` as ``localhost/k2-standin:lab`` (the image the
plan uses instead of every engine image when the inventory sets ``k2_lab=true``) into the lab's
image store, so every lab host can run it at once. It rebuilds only when the content of
``k2lab/standin_image`` or the base image changed: the image carries a key (a digest of both)
in the label ``io.k2provision.standin.key``. Root is required, as for every lab operation.

`build_standin_client()` builds ``k2lab/standin_client`` on top of it as
``localhost/k2-standin:lab-client``: the same stand-in, plus SGLang's real benchmark client at
the pinned versions (about 6 GB, mostly torch's CUDA build), for a lab cluster that runs
`k2provision bench` with its default in-cluster client (the inventory's ``k2_image``). Its key
covers ``k2lab/standin_client`` and the stand-in image it was built on.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from k2lab.config import LabConfig
from k2lab.errors import LabError
from k2lab.images import BASE_IMAGE, build_image, ensure_base_image, podman
from k2lab.proc import Log, quiet_log, require_root
from k2provision.plan.images import LAB_IMAGE

STANDIN_IMAGE = LAB_IMAGE
CLIENT_IMAGE = "localhost/k2-standin:lab-client"
KEY_LABEL = "io.k2provision.standin.key"
KEY_BUILD_ARG = "K2_STANDIN_KEY"
_SKIP_PARTS = frozenset({"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"})


def standin_dir() -> Path:
    """The image's build context, shipped inside this package (k2lab/standin_image)."""
    return Path(__file__).resolve().parent / "standin_image"


def client_dir() -> Path:
    """The client image's Containerfile and pinned requirements (k2lab/standin_client)."""
    return Path(__file__).resolve().parent / "standin_client"


def content_hash(directory: Path | None = None) -> str:
    """A digest of every file under `directory` (paths, modes and contents)."""
    root = directory or standin_dir()
    if not (root / "Containerfile").is_file():
        raise LabError(f"{root}: no Containerfile; the stand-in sources are missing")
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if _SKIP_PARTS.intersection(rel.parts) or path.suffix == ".pyc":
            continue
        digest.update(str(rel).encode() + b"\0")
        digest.update(b"x" if path.stat().st_mode & 0o111 else b"-")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _inspect(cfg: LabConfig, tag: str, template: str) -> str | None:
    result = podman(cfg, "image", "inspect", "--format", template, tag, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def image_key(cfg: LabConfig, tag: str = STANDIN_IMAGE) -> str | None:
    """The key label of a built stand-in image, None when there is none."""
    return _inspect(cfg, tag, f'{{{{index .Labels "{KEY_LABEL}"}}}}')


def wanted_key(cfg: LabConfig) -> str:
    """The key of the current sources on the current base image."""
    base_id = _inspect(cfg, BASE_IMAGE, "{{.Id}}")
    if not base_id:
        raise LabError(f"{BASE_IMAGE} is missing from the lab image store")
    return hashlib.sha256(f"{content_hash()}\n{base_id}".encode()).hexdigest()[:32]


def build_standin(
    cfg: LabConfig | None = None, *, force: bool = False, log: Log = quiet_log
) -> str:
    """Build the stand-in image unless it is current; returns its tag."""
    require_root()
    config = cfg or LabConfig.default()
    config.lab_dir.mkdir(parents=True, exist_ok=True)
    with (config.lab_dir / "standin.lock").open("a") as lock:
        # One build at a time; a second caller finds the image current afterwards.
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            ensure_base_image(config, log)
            key = wanted_key(config)
            if not force and image_key(config) == key:
                log(f"image: {STANDIN_IMAGE} is current")
                return STANDIN_IMAGE
            build_image(
                config, STANDIN_IMAGE, standin_dir(), build_args={KEY_BUILD_ARG: key}, log=log
            )
            if image_key(config) != key:
                raise LabError(f"{STANDIN_IMAGE} was built but does not carry key {key}")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return STANDIN_IMAGE


# Wheels for the image's interpreter whatever the controller runs: Debian 12's CPython 3.11 on
# glibc 2.36, x86_64 (the lab rootfs, k2lab/rootfs.py).
_WHEEL_TARGET = (
    "--only-binary=:all:",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--abi",
    "cp311",
    "--abi",
    "abi3",
    "--abi",
    "none",
    *(a for v in range(36, 4, -1) for a in ("--platform", f"manylinux_2_{v}_x86_64")),
    "--platform",
    "manylinux2014_x86_64",
    "--platform",
    "manylinux2010_x86_64",
    "--platform",
    "manylinux1_x86_64",
)


def _client_site(into: Path, log: Log) -> None:
    """The pinned client's distributions, unpacked into `into` by this Python's pip."""
    log(f"image: fetching sglang's benchmark client ({client_dir() / 'requirements.txt'})")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-compile",
            "--disable-pip-version-check",
            "--target",
            str(into),
            *_WHEEL_TARGET,
            "-r",
            str(client_dir() / "requirements.txt"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise LabError(f"pip could not fetch the benchmark client's distributions:\n{tail}")


def build_standin_client(
    cfg: LabConfig | None = None, *, force: bool = False, log: Log = quiet_log
) -> str:
    """Build the stand-in image with SGLang's real benchmark client unless it is current (the
    plain stand-in first); returns its tag."""
    config = cfg or LabConfig.default()
    build_standin(config, log=log)
    # A lock of its own: the plain stand-in's users need not wait for this long build.
    with (config.lab_dir / "standin-client.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            base_id = _inspect(config, STANDIN_IMAGE, "{{.Id}}")
            key = hashlib.sha256(f"{content_hash(client_dir())}\n{base_id}".encode()).hexdigest()
            key = key[:32]
            if not force and image_key(config, CLIENT_IMAGE) == key:
                log(f"image: {CLIENT_IMAGE} is current")
                return CLIENT_IMAGE
            context = Path(tempfile.mkdtemp(prefix="standin-client.", dir=config.lab_dir))
            try:
                shutil.copy2(client_dir() / "Containerfile", context / "Containerfile")
                _client_site(context / "site", log)
                build_image(
                    config,
                    CLIENT_IMAGE,
                    context,
                    build_args={KEY_BUILD_ARG: key, "K2_STANDIN_BASE": STANDIN_IMAGE},
                    log=log,
                )
            finally:
                shutil.rmtree(context, ignore_errors=True)
            if image_key(config, CLIENT_IMAGE) != key:
                raise LabError(f"{CLIENT_IMAGE} was built but does not carry key {key}")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return CLIENT_IMAGE
