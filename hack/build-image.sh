#!/usr/bin/env bash
# Build the toposlice container image.
#
#   hack/build-image.sh [IMAGE]              Docker/Podman, from the multi-stage Dockerfile
#   hack/build-image.sh --oci [OUT.tar]      no daemon: an OCI image tarball (hack/build_oci.py)
#                                            named docker.io/library/toposlice:dev
#
# Dockerfile path, environment: DOCKER (docker or podman, default docker), PLATFORM (e.g.
# linux/arm64 for a GB200 / Grace node), PYTHON_IMAGE (base image, e.g. pinned by digest),
# PUSH=1 to push. Without docker/podman on PATH the OCI path is taken (said so on stderr).
# The OCI tarball loads with `ctr -n k8s.io images import OUT.tar` (containerd),
# `docker load -i OUT.tar` or `podman load -i OUT.tar`; IMAGE_NAME sets its name.
set -euo pipefail
cd "$(dirname "$0")/.."

docker=${DOCKER:-docker}
if [[ ${1:-} == --oci ]] || { [[ ${1:-} != -* ]] && ! command -v "$docker" >/dev/null 2>&1; }; then
  [[ ${1:-} == --oci ]] && shift || echo "build-image: $docker not found; building an OCI tarball without a daemon" >&2
  exec python3 hack/build_oci.py -o "${1:-toposlice-image.tar}" --name "${IMAGE_NAME:-docker.io/library/toposlice:dev}"
fi

image=${1:-${IMAGE:-toposlice:dev}}
args=(build --tag "$image" --file Dockerfile)
if [[ -n ${PLATFORM:-} ]]; then args+=(--platform "$PLATFORM"); fi
if [[ -n ${PYTHON_IMAGE:-} ]]; then args+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE"); fi

DOCKER_BUILDKIT=1 "$docker" "${args[@]}" .
if [[ ${PUSH:-0} == 1 ]]; then "$docker" push "$image"; fi
echo "build-image: built $image"
