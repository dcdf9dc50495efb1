"""hack/build_oci.py writes an OCI image layout that runtimes import: a tiny root
filesystem (no apt, no pip) through the same layer and image writers the build uses."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from hack import build_oci


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    monkeypatch.setattr(build_oci, "deb_arch", lambda: "amd64")
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "usr/bin/hello").write_text("#!/bin/sh\necho hi\n")
    (rootfs / "usr/bin/hello").chmod(0o755)
    (rootfs / "usr/bin/hi").symlink_to("hello")
    build_oci.add_user(rootfs)
    layer = tmp_path / "layer.tar.gz"
    diff_id, digest, size = build_oci.write_layer(rootfs, layer, 0)
    out = tmp_path / "image.tar"
    build_oci.write_image(layer, diff_id, digest, size, build_oci.DEFAULT_NAME, out)
    with tarfile.open(out) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def test_layout_names_the_image_and_every_digest_matches(image: dict[str, bytes]) -> None:
    assert json.loads(image["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (desc,) = json.loads(image["index.json"])["manifests"]
    assert desc["annotations"]["io.containerd.image.name"] == "docker.io/library/toposlice:dev"
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == "dev"

    def blob(d: dict[str, Any]) -> bytes:
        data = image[f"blobs/sha256/{d['digest'].split(':')[1]}"]
        assert _sha(data) == d["digest"] and len(data) == d["size"]
        return data

    manifest = json.loads(blob(desc))
    config = json.loads(blob(manifest["config"]))
    (layer_desc,) = manifest["layers"]
    layer = blob(layer_desc)
    assert layer_desc["mediaType"].endswith("tar+gzip")
    assert config["rootfs"]["diff_ids"] == [_sha(gzip.decompress(layer))]
    (docker,) = json.loads(image["manifest.json"])
    assert docker["RepoTags"] == ["toposlice:dev"]


def test_config_matches_the_dockerfile(image: dict[str, bytes]) -> None:
    dockerfile = (build_oci.REPO / "Dockerfile").read_text()
    (desc,) = json.loads(image["index.json"])["manifests"]
    manifest = json.loads(image[f"blobs/sha256/{desc['digest'].split(':')[1]}"])
    config = json.loads(image[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    cfg = config["config"]
    assert f"ENTRYPOINT {json.dumps(cfg['Entrypoint'])}" in dockerfile
    assert f"CMD {json.dumps(cfg['Cmd'])}" in dockerfile
    assert f"USER {cfg['User']}" in dockerfile
    assert config["os"] == "linux" and config["architecture"] == "amd64"


def test_layer_is_root_owned_reproducible_and_keeps_links(
    image: dict[str, bytes], tmp_path: Path
) -> None:
    (desc,) = json.loads(image["index.json"])["manifests"]
    manifest = json.loads(image[f"blobs/sha256/{desc['digest'].split(':')[1]}"])
    layer = image[f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = {m.name: m for m in tar}
    assert all(m.uid == 0 and m.gid == 0 and m.mtime == 0 for m in members.values())
    assert members["usr/bin/hi"].issym() and members["usr/bin/hi"].linkname == "hello"
    assert members["usr/bin/hello"].mode & 0o111
    assert members["tmp"].mode & 0o7777 == 0o1777
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        passwd = tar.extractfile("etc/passwd").read().decode()  # type: ignore[union-attr]
    assert f"toposlice:x:{build_oci.UID}:{build_oci.GID}:" in passwd


def test_launcher_is_guarded_against_spawned_children() -> None:
    """The rediscovery helper is a spawn child that runs the main script again as
    __mp_main__: an unguarded launcher started a second driver in the pod."""
    assert 'if __name__ == "__main__":' in build_oci.LAUNCHER


def test_wheel_platforms_cover_bookworm_glibc() -> None:
    args = build_oci.wheel_platforms("amd64")
    tags = args[1::2]
    assert set(args[::2]) == {"--platform"}
    assert "manylinux_2_36_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_17_x86_64" in tags
    with pytest.raises(build_oci.BuildError):
        build_oci.wheel_platforms("s390x")


def test_same_tree_same_layer_digest(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "b").mkdir(parents=True)
    (rootfs / "b" / "f").write_text("x")
    (rootfs / "a").write_text("y")
    first = build_oci.write_layer(rootfs, tmp_path / "1.tar.gz", 0)
    (rootfs / "a").touch()  # a new mtime must not change the layer
    second = build_oci.write_layer(rootfs, tmp_path / "2.tar.gz", 0)
    assert first == second
    (rootfs / "a").write_text("z")
    assert build_oci.write_layer(rootfs, tmp_path / "3.tar.gz", 0)[0] != first[0]
