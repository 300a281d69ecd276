"""Build the Docker images of the container tasks from Debian packages (no registry needed), cached by content.

An image is a Debian root file system made by ``debootstrap --variant=minbase`` with a few base packages,
then ``apt-get install`` of the image's packages inside it (with their recommended packages, as the plain
``apt install`` of upstream's Dockerfiles does), imported with ``docker import``, plus a small Dockerfile layer
(environment, working directory, flavour files) built with the legacy builder (``RUN`` cannot reach the
network). The tag carries a hash of everything that goes into the image, so a changed spec builds a new
image and an unchanged one is found in well under a second.

``agentrl-env build-images`` builds the default images; other flavours are built on first use by
:func:`ensure_image` (the ``packages`` flavour brings npm, which is large).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import docker
import docker.errors

logger = logging.getLogger(__name__)

# Bump when the build procedure itself changes in a way the spec does not show.
BUILD_VERSION = 2
LABEL_SPEC = "agentrl.image.spec"

# What upstream AgentBench's OS images hold: the `ubuntu` Docker image (whose base has procps, adduser and
# e2fsprogs beyond Debian's minbase) plus, for the `default` flavour, `apt install` of exactly these (recommends
# included: python3-pip brings build-essential and python3-dev). Nothing else, so that an item asking the agent
# to install something (sudo, bc, ...) is never solved by doing nothing.
_BASE_PACKAGES = ("procps", "adduser", "e2fsprogs")
_OS_PACKAGES = ("python3", "python3-pip", "git", "vim", "curl", "wget", "unzip", "zip", "tree")


@dataclass(frozen=True)
class ImageSpec:
    """How to build one image.

    Attributes:
        name: Repository name of the image (the tag is the content hash).
        packages: Debian packages installed with ``apt-get install`` (recommends included) on the base system.
        base_packages: Debian packages added to the minbase system by ``debootstrap --include``.
        dockerfile: File under ``env_adapters/sandbox/images/`` built ``FROM`` the imported root file system
            (it receives the rootfs image as build argument ``BASE``).
        suite: Debian release.
        default: Built by ``agentrl-env build-images`` without ``--all``.
    """

    name: str
    packages: tuple[str, ...]
    dockerfile: str
    base_packages: tuple[str, ...] = _BASE_PACKAGES
    suite: str = "bookworm"
    default: bool = True

    def dockerfile_text(self) -> str:
        return resources.files("env_adapters.sandbox").joinpath("images", self.dockerfile).read_text(encoding="utf-8")

    def content_hash(self) -> str:
        spec = {
            "version": BUILD_VERSION,
            "suite": self.suite,
            "packages": sorted(self.packages),
            "base_packages": sorted(self.base_packages),
            "dockerfile": self.dockerfile_text(),
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def tag(self) -> str:
        """``name:hash``: the reference to run containers from."""
        return f"{self.name}:{self.content_hash()}"


# Image specs by key. Task families map their flavours onto these keys (see tasks/os_interaction/task.py).
IMAGES: dict[str, ImageSpec] = {
    "os-default": ImageSpec("agentrl-os-default", _OS_PACKAGES, "os-default.Dockerfile"),
    "os-ubuntu": ImageSpec("agentrl-os-ubuntu", (), "os-ubuntu.Dockerfile", default=False),
    "os-packages": ImageSpec("agentrl-os-packages", (*_OS_PACKAGES, "npm"), "os-default.Dockerfile", default=False),
}


def image_exists(client: docker.DockerClient, spec: ImageSpec) -> bool:
    try:
        client.images.get(spec.tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def build_image(client: docker.DockerClient, spec: ImageSpec) -> str:
    """Build ``spec`` (debootstrap, import, Dockerfile layer) and return its tag. Needs root and debootstrap."""
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed; run scripts/setup.sh (apt-get install debootstrap)")
    tag, t0 = spec.tag, time.monotonic()
    rootfs_ref = f"{spec.name}-rootfs:{spec.content_hash()}"
    with tempfile.TemporaryDirectory(prefix="agentrl-image-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = ["debootstrap", "--variant=minbase"]
        if spec.base_packages:
            cmd.append("--include=" + ",".join(spec.base_packages))
        cmd += [spec.suite, str(rootfs)]
        logger.info("building %s: debootstrap %s, then %d packages with their recommends (a few minutes)", tag,
                    spec.suite, len(spec.packages))
        _run(cmd)
        if spec.packages:
            _apt_install(rootfs, spec.packages)
        # Downloaded .deb files and apt lists are a third of the tree and no use without a network.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        logger.info("building %s: importing the root file system (%.0f s so far)", tag, time.monotonic() - t0)
        tarball = Path(tmp) / "rootfs.tar"
        _run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."])
        shutil.rmtree(rootfs)
        repo, _, rootfs_tag = rootfs_ref.partition(":")
        client.api.import_image_from_file(str(tarball), repository=repo, tag=rootfs_tag)
        tarball.unlink()

        logger.info("building %s: Dockerfile layer %s", tag, spec.dockerfile)
        context = Path(tmp) / "context"
        context.mkdir()
        (context / "Dockerfile").write_text(spec.dockerfile_text(), encoding="utf-8")
        for chunk in client.api.build(path=str(context), tag=tag, buildargs={"BASE": rootfs_ref}, rm=True,
                                      forcerm=True, decode=True, labels={LABEL_SPEC: spec.content_hash()}):
            if "error" in chunk:
                raise RuntimeError(f"docker build of {tag} failed: {chunk['error'].strip()}")
            if chunk.get("stream", "").strip():
                logger.debug("%s", chunk["stream"].rstrip())
    # The rootfs image is only a build input; the final image keeps its layer.
    client.images.remove(rootfs_ref, noprune=False)
    logger.info("built %s in %.0f s", tag, time.monotonic() - t0)
    return tag


def ensure_image(client: docker.DockerClient, key: str) -> str:
    """The tag of image ``key`` (a key of :data:`IMAGES`), building it first if it does not exist."""
    try:
        spec = IMAGES[key]
    except KeyError:
        raise KeyError(f"unknown image {key!r}; known: {sorted(IMAGES)}") from None
    if not image_exists(client, spec):
        try:
            build_image(client, spec)
        except (RuntimeError, OSError, docker.errors.DockerException) as e:
            raise RuntimeError(f"image {key} ({spec.tag}) is missing and could not be built here: {e}\n"
                               f"Build it as root with `agentrl-env build-images {key}` (or scripts/setup.sh "
                               "--all), then retry.") from e
    return spec.tag


def _apt_install(rootfs: Path, packages: tuple[str, ...]) -> None:
    """``apt-get install`` ``packages`` inside ``rootfs`` (a chroot with the host's name resolution)."""
    shutil.copyfile("/etc/resolv.conf", rootfs / "etc" / "resolv.conf")
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    # No service may start inside the build (there is no init system to own it).
    policy = rootfs / "usr" / "sbin" / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n", encoding="utf-8")
    policy.chmod(0o755)
    try:
        _run(["chroot", str(rootfs), "apt-get", "update", "-q"], env=env)
        _run(["chroot", str(rootfs), "apt-get", "install", "-y", "-q", *packages], env=env)
        _run(["chroot", str(rootfs), "apt-get", "clean"], env=env)
    finally:
        policy.unlink()
        (rootfs / "etc" / "resolv.conf").write_text("", encoding="utf-8")


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise RuntimeError(f"{cmd[0]} failed with exit code {proc.returncode}:\n{tail}")


# ---- CLI: agentrl-env build-images ----------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("images", nargs="*", metavar="IMAGE",
                        help=f"images to build (default: the default ones); known: {', '.join(IMAGES)}")
    parser.add_argument("--all", action="store_true", help="build every known image")
    parser.add_argument("--list", action="store_true", help="print each image's tag and whether it exists")


def run(args: argparse.Namespace) -> int:
    unknown = [k for k in args.images if k not in IMAGES]
    if unknown:
        logger.error("unknown image(s) %s; known: %s", unknown, sorted(IMAGES))
        return 2
    keys = args.images or [k for k, s in IMAGES.items() if args.all or s.default]
    client = docker.from_env()
    for key in keys:
        spec = IMAGES[key]
        exists = image_exists(client, spec)
        if args.list:
            logger.info("%s %s %s", key, spec.tag, "present" if exists else "missing")
        elif exists:
            logger.info("%s is up to date (%s)", key, spec.tag)
        else:
            build_image(client, spec)
    return 0
