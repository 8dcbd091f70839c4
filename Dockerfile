# syntax=docker/dockerfile:1
#
# One image for every alma process: the daemon (`alma run`, the default command), the producer
# (`alma replay`) and the model server (`alma serve`: TorchServe, or KServe's model server with
# --kind kserve). Either server imports alma_daemon to rebuild a learner from spec.json, so it needs
# this package and the very torch the trainer used; one image guarantees both
# (deploy/docker-compose.yml, deploy/docker-compose.kserve.yml, docs/deploy.md).
#
#   docker build -t alma-daemon .                                     # CPU
#   docker build -t alma-daemon:cuda \
#       --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .   # CUDA (docs/deploy.md)

# bookworm, not the floating slim tag: Debian 13 no longer packages a Java 17 runtime, and
# TorchServe 0.12 is tested against Java 17.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# The wheel index torch comes from. The CPU index keeps the image free of ~3 GB of CUDA libraries;
# a CUDA index (or PyPI, whose Linux x86_64 wheels are CUDA builds) gives the GPU variant.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first and alone, from its index: the package's pin (torch==2.13.0 in pyproject.toml, keep
# the two equal) is then already satisfied, so the second install cannot pull another torch from
# PyPI. A local version label (2.13.0+cpu) satisfies ==2.13.0.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==2.13.0"
COPY pyproject.toml README.md /src/
COPY alma_daemon /src/alma_daemon
COPY policies /src/policies
COPY serving /src/serving
# A regular (non-editable) install: the runtime stage copies the virtual environment only. Both
# servers' extras (serving: TorchServe; kserve: KServe's model server): one image for either
# serving.kind.
RUN pip install "/src[serving,kserve]"


FROM ${PYTHON_IMAGE}
# The man1 folder: the JRE's post-install script links its man pages there, and slim images
# delete that folder, which can make the install fail. tini: see ENTRYPOINT.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
    && rm -rf /var/lib/apt/lists/*

# A fixed uid, so that volumes and Kubernetes' runAsUser/fsGroup (deploy/k8s/) can name it. The
# mount points exist in the image, owned by alma, because Docker gives a new named volume the
# owner of the folder it is mounted on (root for a folder it has to create).
RUN groupadd --system --gid 10001 alma \
    && useradd --system --uid 10001 --gid alma --home-dir /var/lib/alma --shell /usr/sbin/nologin alma \
    && mkdir -p /data /var/lib/alma/state /var/lib/alma/model_store /etc/alma \
    && chown -R alma:alma /data /var/lib/alma

COPY --from=build /opt/venv /opt/venv
# The default config is the container one (exporter on 0.0.0.0:9464, state under /var/lib/alma,
# services named kafka, redis, torchserve); compose and Kubernetes mount their own over it.
COPY deploy/config.compose.yaml /etc/alma/config.yaml
COPY examples /etc/alma/examples

# ALMA_DATA_DIR: where datasets are read (README, Data); mount them there read-only.
# /var/lib/alma is writable by alma (HOME for caches, relative paths such as a config's runs/);
# what must outlive the container goes to the state/ and model_store/ volumes below it.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    ALMA_DATA_DIR=/data \
    HOME=/var/lib/alma
WORKDIR /var/lib/alma
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001

# 9464: the daemon's exporter (metrics.port); 8080/8081/8082: TorchServe inference, management,
# metrics when the image runs `alma serve`; 8080 alone with `alma serve --kind kserve` (KServe's
# inference, model repository and metrics on one port).
EXPOSE 9464 8080 8081 8082

# Liveness of `alma run` (the default command): its exporter answers /healthz while the process
# serves. Python rather than curl, which the slim image lacks. `alma serve` and `alma replay` do not
# serve this port: compose overrides or disables the check for them, and Kubernetes ignores it in
# favour of the probes in deploy/k8s/.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=4)"]

# tini as PID 1: the kernel gives PID 1 no default signal actions, so a bare Python there ignores
# SIGTERM until alma installs its handlers (during a restore, while `alma serve` starts its server)
# and a stop waits out the grace period; tini forwards signals and reaps the workers TorchServe
# forks, in compose and in Kubernetes alike (both pass only arguments: deploy/; a KServe
# InferenceService, which replaces the command, names tini itself: deploy/k8s/kserve/).
ENTRYPOINT ["tini", "--", "alma"]
CMD ["run", "--config", "/etc/alma/config.yaml"]
