# Worker image for the gfx90a (CDNA2) nodes. The base is the vendor's ROCm/DTK image, whose torch
# is the one that must run: nothing here installs or upgrades torch or Triton.
#   docker build -f infra/docker/gfx90a.Dockerfile --build-arg BASE_IMAGE=<vendor image> .
# The default is a public ROCm image with Python 3.12 (the packages need 3.11 or newer).
ARG BASE_IMAGE=rocm/pytorch:rocm6.4.3_ubuntu24.04_py3.12_pytorch_release_2.6.0
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
COPY infra/worker-packages.txt infra/worker-requirements.txt infra/

# Our packages go in with --no-deps (their metadata names torch and triton, which a resolver could
# replace); their third-party dependencies come from worker-requirements.txt, resolved with the
# base image's torch held by a constraint, so pip fails rather than replace it.
RUN python3 -c "import torch; print(f'torch=={torch.__version__}')" > base-torch.txt \
 && python3 -m pip install --no-deps -r infra/worker-packages.txt \
 && python3 -m pip install --constraint base-torch.txt -r infra/worker-requirements.txt \
 && python3 -c "import torch, triton, kvquant, kvbench, lm_eval, prefect; print('torch', torch.__version__)"

# KVCACHE_GPU_SLOT names this GPU's global concurrency limit (see infra/README.md).
CMD ["prefect", "worker", "start", "--pool", "gfx90a", "--type", "process"]
