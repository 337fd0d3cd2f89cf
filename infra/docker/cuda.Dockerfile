# Worker image for NVIDIA (CUDA) nodes: the CUDA build of torch from the PyTorch base image.
ARG BASE_IMAGE=pytorch/pytorch:2.11.0-cuda13.0-cudnn9-runtime
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

# Same install as the gfx90a image: the base image's torch stays, held by a constraint.
RUN python3 -c "import torch; print(f'torch=={torch.__version__}')" > base-torch.txt \
 && python3 -m pip install --no-deps -r infra/worker-packages.txt \
 && python3 -m pip install --constraint base-torch.txt -r infra/worker-requirements.txt \
 && python3 -c "import torch, triton, kvquant, kvbench, lm_eval, prefect; print('torch', torch.__version__)"

CMD ["prefect", "worker", "start", "--pool", "cuda", "--type", "process"]
