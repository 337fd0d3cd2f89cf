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

# Same rule as the gfx90a image: the base image's torch stays; --no-deps keeps pip off it.
RUN python3 -m pip install --no-deps ./packages/adr ./packages/audit ./packages/kvquant \
 && python3 -m pip install "prefect==3.9.1" "filelock>=3.12" "GitPython>=3.1.40" "PyYAML>=6" \
      "packaging>=23" \
 && python3 -c "import torch, triton, kvquant; print('torch', torch.__version__)"

CMD ["prefect", "worker", "start", "--pool", "cuda", "--type", "process"]
