#!/usr/bin/env bash
# Every GPU check and benchmark in one command, for the GPU machine (time there is scarce: nothing to prepare).
#
#   bash bench/gpu_check.sh OUT [tests|bench|all]      (from the repository root; default: all)
#
# Writes into OUT: machine.txt (GPU, driver, versions), gpu-tests.txt (the `gpu` tests and the trainer's unit tests,
# which include the torchvision ones), bench-*.txt (reference loop vs our trainer, side by side), and status.txt
# (each step's exit code). Where to read what:
#   bench-both.txt       mnist-cnn (MNIST-shaped, batch 32) then resnet18 (CIFAR-shaped, batch 32), fp32:
#                        "speed-up" (goals: >= 10x for mnist-cnn, >= 3x for resnet18) at an accuracy difference
#                        within +-0.5 points
#   bench-mnist60k.txt   a 60,000-sample epoch: ours, fastest epoch (goal <= 0.5 s, about 267 us/step)
#   bench-resnet-bf16.txt resnet18 with our trainer in --precision bf16 (the reference stays fp32)
# A step that fails does not stop the others; status.txt says which failed.
set -u
OUT=${1:?usage: bash bench/gpu_check.sh OUT [tests|bench|all]}
PART=${2:-all}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

step() {  # step NAME LIMIT_SECONDS COMMAND...: run it, its output to OUT/NAME.txt and to the terminal
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*" | tee "$OUT/$name.txt"
    timeout "$limit" "$@" 2>&1 | tee -a "$OUT/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "$name $rc" >>"$OUT/status.txt"
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
    $PY -c 'import platform, torch; print("python", platform.python_version(), "torch", torch.__version__,
"cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
    $PY -c 'import torchvision; print("torchvision", torchvision.__version__)' 2>&1 | tail -1
    command -v docker >/dev/null && docker info --format 'docker {{.ServerVersion}} runtimes {{.Runtimes}}' \
        || echo "docker: not on this machine"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

if [ "$PART" = all ] || [ "$PART" = bench ]; then
    step bench-both 150 $PY bench/bench_trainer.py --device cuda --model both
fi
if [ "$PART" = all ] || [ "$PART" = tests ]; then
    # --noconftest: the SSH test bed's fixtures import paramiko, which the GPU machine lacks; these tests need none.
    step gpu-tests 400 $PY -m pytest -q -rs --noconftest -p no:cacheprovider tests/test_gpu.py \
        tests/test_trainer_units.py
    step strategy-gpu-tests 300 $PY -m pytest -q -rs --noconftest -p no:cacheprovider tests/test_strategies_gpu.py
fi
if [ "$PART" = all ] || [ "$PART" = bench ]; then
    step bench-mnist60k 70 $PY bench/bench_trainer.py --device cuda --train-size 60000 --test-size 10000 --epochs 2
    step bench-resnet-bf16 80 $PY bench/bench_trainer.py --device cuda --model resnet18 --precision bf16
fi
cat "$OUT/status.txt"
