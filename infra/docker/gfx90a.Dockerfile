# Worker image for the gfx90a (CDNA2) nodes. The base is the vendor's ROCm/DTK image, whose torch
# is the one that must run: nothing here installs or upgrades torch or Triton.
#   docker build -f infra/docker/gfx90a.Dockerfile --build-arg BASE_IMAGE=<vendor image> .
ARG BASE_IMAGE=rocm/pytorch:rocm6.2_ubuntu22.04_py3.10_pytorch_release_2.3.0
FROM ${BASE_IMAGE}

ENV DO_NOT_TRACK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    HF_HUB_OFFLINE=1 \
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY=30 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/kvcache-port
COPY packages/ packages/
COPY flows/ flows/
COPY pyproject.toml ./

# The packages go in with --no-deps: their own requirements name torch and triton, which a
# resolver could replace. Their remaining dependencies are listed here explicitly instead.
RUN python3 -m pip install --no-deps ./packages/adr ./packages/audit ./packages/kvquant \
 && python3 -m pip install "prefect==3.9.1" "filelock>=3.12" "GitPython>=3.1.40" "PyYAML>=6" \
      "packaging>=23" \
 && python3 -c "import torch, triton, kvquant; print('torch', torch.__version__)"

# KVCACHE_GPU_SLOT names this GPU's global concurrency limit (see infra/README.md).
CMD ["prefect", "worker", "start", "--pool", "gfx90a", "--type", "process"]
