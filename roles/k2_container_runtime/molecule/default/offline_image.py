"""Write a `docker save` archive of a one-file image, byte for byte the same on every run.

    python offline_image.py ARCHIVE TAG

The archive is what an offline site gets from `docker save`: manifest.json, the image config
and one layer, so `docker load` (or podman's) reads it like any other.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def main(archive: str, tag: str) -> None:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        # The tag is in the file, so two tags are two images (two image IDs).
        _tar_member(tar, "k2-offline.txt", f"k2provision image {tag}\n".encode())
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Cmd": ["/k2-offline.txt"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "k2provision molecule"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]
    with tarfile.open(archive, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        _tar_member(tar, "layer.tar", layer_bytes)
        _tar_member(tar, config_name, config_bytes)
        _tar_member(tar, "manifest.json", json.dumps(manifest).encode())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
