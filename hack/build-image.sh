#!/usr/bin/env bash
# Build the toposlice container image from the repository's multi-stage Dockerfile.
#
#   hack/build-image.sh [IMAGE]          default IMAGE: toposlice:dev
#
# Environment: DOCKER (docker or podman, default docker), PLATFORM (e.g. linux/arm64 for a
# GB200 / Grace node), PYTHON_IMAGE (base image, e.g. pinned by digest), PUSH=1 to push.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${1:-${IMAGE:-toposlice:dev}}
docker=${DOCKER:-docker}
if ! command -v "$docker" >/dev/null 2>&1; then
  echo "build-image: $docker not found (set DOCKER=podman to use podman)" >&2
  exit 1
fi

args=(build --tag "$image" --file Dockerfile)
if [[ -n ${PLATFORM:-} ]]; then args+=(--platform "$PLATFORM"); fi
if [[ -n ${PYTHON_IMAGE:-} ]]; then args+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE"); fi

DOCKER_BUILDKIT=1 "$docker" "${args[@]}" .
if [[ ${PUSH:-0} == 1 ]]; then "$docker" push "$image"; fi
echo "build-image: built $image"
