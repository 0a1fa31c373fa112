"""Container images for the lab hosts, without a registry.

The controller keeps one podman image store under ``<lab dir>/images/storage``; every lab
host mounts it read-only at ``/var/lib/k2lab-images`` and lists it in
``additionalimagestores``, so an image built or imported here is at once visible to
``docker``/``podman`` inside every host (and nothing is copied per host).

- ``ensure_base_image()`` imports the lab rootfs as ``localhost/k2host:test``
  (``tar -C rootfs -c . | podman import``); ``up`` calls it.
- ``build_image(tag, containerfile_dir)`` builds a Containerfile/Dockerfile whose
  ``FROM localhost/k2host:test`` (or another image in the store) with
  ``podman build --network host``; the lab's proxy name resolves during the build, so
  ``RUN apt-get install ...`` works while the lab is up.
- ``import_image(tag, tarball)`` and ``load_image(archive)`` add a rootfs tarball or a
  ``docker save`` archive.

Removing an image that a host's container still uses breaks that container; rebuild under
a new tag, or remove only when the hosts are down.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from k2lab.config import PROXY_NAME, LabConfig
from k2lab.errors import LabError
from k2lab.fs import write_file
from k2lab.hosts import storage_driver
from k2lab.proc import Log, quiet_log, run
from k2lab.rootfs import STATIC_FILES, recipe_hash

BASE_IMAGE = "localhost/k2host:test"
RECIPE_LABEL = "k2lab.recipe"


def podman_argv(cfg: LabConfig, *args: str) -> list[str]:
    """podman on the lab's own store (not the controller's default one)."""
    return [
        "podman",
        "--root",
        str(cfg.image_store),
        "--runroot",
        str(cfg.image_runroot),
        "--storage-driver",
        storage_driver(cfg),
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "file",
        *args,
    ]


def podman_env(cfg: LabConfig) -> dict[str, str]:
    conf = cfg.controller_containers_conf
    text = STATIC_FILES["etc/containers/containers.conf"]
    if not conf.exists() or conf.read_text() != text:
        write_file(conf, text)
    return {"CONTAINERS_CONF": str(conf)}


def podman(cfg: LabConfig, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run podman against the lab image store."""
    cfg.image_store.mkdir(parents=True, exist_ok=True)
    return run(podman_argv(cfg, *args), env=podman_env(cfg), check=check, timeout=3600)


def _image_label(cfg: LabConfig, tag: str, label: str) -> str | None:
    result = podman(
        cfg, "image", "inspect", "--format", f'{{{{index .Labels "{label}"}}}}', tag, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else None


def _import_tar_stream(
    cfg: LabConfig, tag: str, tar_argv: Sequence[str], changes: Sequence[str]
) -> None:
    cfg.image_store.mkdir(parents=True, exist_ok=True)
    argv = podman_argv(cfg, "import", *[f"--change={c}" for c in changes], "-", tag)
    env = {**os.environ, **podman_env(cfg)}
    with subprocess.Popen(list(tar_argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE) as tar:
        imp = subprocess.run(
            argv, stdin=tar.stdout, capture_output=True, text=True, env=env, check=False
        )
        assert tar.stdout is not None
        tar.stdout.close()
        tar_err = tar.stderr.read().decode(errors="replace") if tar.stderr else ""
        tar_rc = tar.wait()
    if tar_rc != 0 or imp.returncode != 0:
        detail = (imp.stderr.strip() or tar_err.strip()).splitlines()
        raise LabError(f"import of {tag} failed: {detail[-1] if detail else 'no output'}")


def ensure_base_image(cfg: LabConfig, log: Log = quiet_log) -> bool:
    """Import the lab rootfs as localhost/k2host:test unless it is there and current.

    Callers hold different locks (the lab's for `up`, the stand-in builds' own), so the check
    and the import take one of their own: processes sharing the lab dir import it once."""
    cfg.lab_dir.mkdir(parents=True, exist_ok=True)
    with (cfg.lab_dir / "base-image.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _ensure_base_image_locked(cfg, log)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _ensure_base_image_locked(cfg: LabConfig, log: Log) -> bool:
    want = recipe_hash()
    if _image_label(cfg, BASE_IMAGE, RECIPE_LABEL) == want:
        return False
    log(f"image: importing the lab rootfs as {BASE_IMAGE}")
    old = podman(cfg, "image", "inspect", "--format", "{{.Id}}", BASE_IMAGE, check=False)
    tar = [
        "tar",
        "--numeric-owner",
        "--xattrs",
        "-C",
        str(cfg.rootfs),
        "--exclude=./dev/*",
        "--exclude=./proc/*",
        "--exclude=./sys/*",
        "-c",
        ".",
    ]
    _import_tar_stream(cfg, BASE_IMAGE, tar, [f"LABEL {RECIPE_LABEL}={want}", 'CMD ["/bin/bash"]'])
    if old.returncode == 0 and old.stdout.strip():
        # The replaced import; kept only while an image built from it still needs it.
        podman(cfg, "rmi", old.stdout.strip(), check=False)
    return True


def import_image(cfg: LabConfig, tag: str, tarball: Path) -> None:
    """Import a root filesystem tarball as image `tag`, visible in every lab host."""
    _import_tar_stream(cfg, tag, ["cat", str(tarball)], ['CMD ["/bin/bash"]'])


def load_image(cfg: LabConfig, archive: Path) -> str:
    """Load a `docker save` / `podman save` archive; returns podman's report."""
    return podman(cfg, "load", "-i", str(archive)).stdout.strip()


def build_image(
    cfg: LabConfig,
    tag: str,
    containerfile_dir: Path,
    *,
    containerfile: Path | None = None,
    build_args: Mapping[str, str] | None = None,
    log: Log = quiet_log,
) -> None:
    """Build `tag` from a directory (Containerfile or Dockerfile in it, or `containerfile`)."""
    ensure_base_image(cfg, log)
    file = containerfile
    if file is None:
        candidates = [containerfile_dir / n for n in ("Containerfile", "Dockerfile")]
        file = next((c for c in candidates if c.exists()), None)
    if file is None or not file.exists():
        raise LabError(f"{containerfile_dir}: no Containerfile or Dockerfile to build {tag}")
    args = [f"--build-arg={k}={v}" for k, v in (build_args or {}).items()]
    log(f"image: building {tag} from {file}")
    podman(
        cfg,
        "build",
        "--network=host",
        "--pull=never",
        f"--add-host={PROXY_NAME}:{cfg.controller_ip}",
        "-t",
        tag,
        "-f",
        str(file),
        *args,
        str(containerfile_dir),
    )


def remove_image(cfg: LabConfig, tag: str) -> None:
    """Remove an image from the lab store (only when no host container uses it)."""
    podman(cfg, "rmi", "--force", tag, check=False)
