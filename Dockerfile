# syntax=docker/dockerfile:1
# The toposlice image: `toposlice run` (node plugin DaemonSet) and `toposlice scorer serve`.
# Build with hack/build-image.sh. The base is pinned to an exact release; override with
# --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest> to pin the digest
# your registry mirror serves.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# -- stage 1: the project's wheel and the wheels of its dependencies --------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# .dockerignore lets in only pyproject.toml, README.md and the Python packages.
COPY . .
RUN python -m pip wheel --wheel-dir /wheels .

# -- stage 2: runtime, no compiler, no sources -------------------------------------------
FROM ${PYTHON_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
# libudev1: pyudev's PCI names and hot-plug monitor (discovery works without it).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libudev1 \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels toposlice \
    && toposlice machines >/dev/null
# Non-root by default (the scorer runs as is). The node plugin's DaemonSet runs it as
# root only because the kubelet plugin and CDI directories on the host are root-owned.
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin toposlice
USER 10001:10001
ENTRYPOINT ["toposlice"]
CMD ["run"]
