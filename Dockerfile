# The image ddpctl runs: an official PyTorch CUDA runtime image plus the trainer (`python -m trainer`).
#
#   docker build -t ddpctl .                                   # or: ddpctl image build
#   docker run --rm ddpctl python -m torch.distributed.run --standalone --nproc-per-node 2 -m trainer --epochs 1
#   docker run --rm -v "$PWD:/workspace" ddpctl python -m torch.distributed.run --standalone my_script.py
#
# The default base carries torch 2.11 built for CUDA 12.8, with kernels (SASS) for sm_75 sm_80 sm_86 sm_90 sm_100
# sm_120 (Turing, Ampere such as the RTX 3080 (sm_86), Ada through sm_86's, Hopper, Blackwell; not V100 sm_70).
# Which hosts can run it (NVIDIA's CUDA minor-version compatibility: a 12.x build runs on any 12.x driver when it
# carries SASS for the GPU): driver >= 525.60.13 (Vast.ai offers: cuda_max_good >= 12.0) and a compute capability
# in the list; ddpctl rents only such machines, reading these labels from the image it is given
# (launcher/places/vast/image_labels.py). Tests and CI build on an offline CPU base instead:
#   docker build --build-arg BASE_IMAGE=$(bash infra/base_image.sh) -t ddpctl:test .
ARG BASE_IMAGE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}
ARG BASE_IMAGE
# The CUDA version inside BASE_IMAGE, recorded for hosts to check against their driver: set it with the base.
ARG BASE_CUDA=12.8
# The least driver for that CUDA major (minor-version compatibility), the same as a Vast.ai cuda_max_good, and the
# compute capabilities (x 10) the base's torch has kernels for (torch.cuda.get_arch_list()): set them with the base.
ARG CUDA_MIN_DRIVER=525.60.13
ARG CUDA_MIN=12.0
ARG COMPUTE_CAPS=75,80,86,90,100,120
LABEL org.ddpctl.base-image="${BASE_IMAGE}" \
      org.ddpctl.cuda="${BASE_CUDA}" \
      org.ddpctl.cuda_min_driver="${CUDA_MIN_DRIVER}" \
      org.ddpctl.cuda_min="${CUDA_MIN}" \
      org.ddpctl.compute_caps="${COMPUTE_CAPS}"

# Optional: a directory of wheels in the build context (e.g. `.whl`) for machines where pip cannot reach the
# registry; numpy and tensorboard (the trainer's event files; pyproject.toml's `train` extra) are installed from it
# when the base lacks them, and any other wheel there is installed too.
# `Dockerfile` is named only so that the COPY has a source when WHEEL_DIR does not exist.
ARG WHEEL_DIR=.whl
COPY Dockerfile ${WHEEL_DIR}* /tmp/wheels/
RUN set -eu; \
    python -c "import torch" || { echo "BASE_IMAGE must provide python with torch" >&2; exit 1; }; \
    offline=""; if ls /tmp/wheels/*.whl >/dev/null 2>&1; then offline="--no-index --find-links /tmp/wheels"; fi; \
    python -c "import numpy" 2>/dev/null || pip install --no-cache-dir $offline numpy; \
    python -c "import tensorboard" 2>/dev/null || pip install --no-cache-dir $offline tensorboard; \
    if [ -n "$offline" ]; then pip install --no-cache-dir $offline /tmp/wheels/*.whl; fi; \
    rm -rf /tmp/wheels; \
    python -c "import site; open(site.getsitepackages()[0] + '/ddpctl.pth', 'w').write('/opt/ddpctl\\n')"

# Each torchrun attempt gets a fresh store hosted by rank 0, so a restarted rank never meets the dead attempt's
# addresses (pytorch/pytorch#135712); the launcher and compose.yaml set it too, this covers a bare torchrun.
ENV PYTHONUNBUFFERED=1 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
WORKDIR /workspace

# Code last: a change to the trainer rebuilds only this small layer. /opt/ddpctl is on the path through a .pth
# file, after PYTHONPATH: a run's shipped code mounted at /workspace/code with PYTHONPATH=/workspace/code
# overrides it (the Docker runtime on SSH hosts does that).
COPY trainer/ /opt/ddpctl/trainer/

ARG DDPCTL_VERSION=unknown
ARG CODE_HASH=unknown
LABEL org.ddpctl.version="${DDPCTL_VERSION}" \
      org.ddpctl.code-hash="${CODE_HASH}" \
      org.opencontainers.image.title="ddpctl trainer"
CMD ["python", "-m", "trainer", "--help"]
