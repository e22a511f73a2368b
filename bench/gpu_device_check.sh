#!/bin/bash
# The GPU checks, as one script for a lent GPU machine (the workplace's `device` tool runs it in a copy of the
# working tree, without .git; results go to $OUT). Needs python3 with CUDA torch and transformers; optuna and
# lightgbm (and their needs) come as wheels in .whl/ (ignored) when that python lacks them, fetched here with:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl optuna lightgbm alembic sqlalchemy colorlog mako greenlet
#   1. bench/gpu_check.py: every plan, compressor and sync mode on CUDA, NCCL (one rank per GPU) and gloo+cuda
#      (2 ranks sharing the GPU), lossless ones against plain DDP; the profiler on CUDA.
#   2. `autosync tune --in-job` under torchrun: 2 ranks on the one GPU over gloo (NCCL refuses two ranks on one
#      GPU), gpt2-tiny, 3 measured; rows stored under |real|gloo|cuda.
#   3. `autosync profile --in-job` under torchrun, 1 rank, NCCL.
#     AUTOSYNC_SOURCE_COMMIT=$(git rev-parse --short HEAD)  (pass it in the command: the copy has no .git)
# Writes its own result file, $OUT/gpu_device_check.md: the command, commit and date first, then everything it
# prints (copy it to bench/results/ as it is; a summary written by hand goes under it, never instead of it).
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
COMMIT=${AUTOSYNC_SOURCE_COMMIT:-unknown}
{ echo "Command: \`AUTOSYNC_SOURCE_COMMIT=$COMMIT bash bench/gpu_device_check.sh\`  "; echo "Commit: \`$COMMIT\`  "
  echo "Date: $(date -u '+%Y-%m-%d %H:%M UTC')"; echo; echo "# GPU checks (bench/gpu_device_check.sh), as printed"
  echo; echo '```'; } > "$OUT/gpu_device_check.md"
exec > >(tee -a "$OUT/gpu_device_check.md") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
echo "== 1. gpu_check"; time timeout 300 python3 bench/gpu_check.py --out "$OUT/gpu_check.md" > "$OUT/gpu_check.log" 2>&1
echo "rc $?"; tail -40 "$OUT/gpu_check.log"
D=$(mktemp -d)
echo "== 2. tune --in-job, 2 ranks on cuda:0 over gloo"
time timeout 240 torchrun --nproc-per-node 2 --max-restarts 1 -m autosync.cli tune --in-job --backend gloo \
  --workload gpt2-tiny --cluster 1x2@100gbit --measure 3 --out "$OUT/strategy.yaml" --data "$D/data" \
  --storage "sqlite:///$D/tune.db" > "$OUT/tune.log" 2>&1
echo "rc $?"; grep -v "^W1\|\*\*\*\|OMP_NUM" "$OUT/tune.log" | tail -30
echo "== 3. profile --in-job, 1 rank, NCCL"
time timeout 120 torchrun --nproc-per-node 1 -m autosync.cli profile --in-job --workload gpt2-tiny \
  --cluster 1x1@100gbit --out "$OUT/profile_nccl.json" > "$OUT/profile.log" 2>&1
echo "rc $?"; tail -15 "$OUT/profile.log"
(cd "$D" && tar czf "$OUT/in_job_data.tgz" data)
echo '```'
exec >&- 2>&-; wait   # let tee write the last lines before the script ends
