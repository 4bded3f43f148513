#!/usr/bin/env bash
# The CUDA path on a machine with a GPU, in one go: the CUDA tests, then
# `daskpri bench` on a `dask scheduler` with two `dask worker --resources GPU=1`
# processes on loopback (both on the machine's one GPU).
#
#   OUT=/some/dir bash benchmarks/device_run.sh
#
# Wheels in .whl/ (dask, distributed, ... missing from the machine's image) are
# installed to /tmp/site first where the directory exists. BUDGET, MLP_BUDGET,
# SEEDS and the *_LIMIT seconds let a short rehearsal run on a CPU machine.
set -u
OUT=${OUT:-/tmp/device_out}
BUDGET=${BUDGET:-6}
MLP_BUDGET=${MLP_BUDGET:-4}
SEEDS=${SEEDS:-3}
TEST_LIMIT=${TEST_LIMIT:-120}
CNN_LIMIT=${CNN_LIMIT:-290}
MLP_LIMIT=${MLP_LIMIT:-110}
PY=${PY:-python3}
mkdir -p "$OUT"
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi -L 2>&1; nproc
  $PY -c "import torch, numpy, pandas, xarray, dask, distributed; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), 'numpy', numpy.__version__, 'pandas', pandas.__version__, 'xarray', xarray.__version__, 'dask', dask.__version__, 'distributed', distributed.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

echo "== tests"
timeout "$TEST_LIMIT" $PY -m pytest -q -p no:cacheprovider --timeout 120 -rs \
  tests/test_cuda.py tests/test_strategies_extra.py -k "cuda or gpu or end_to_end or bfloat16" \
  > "$OUT/pytest.log" 2>&1
echo "pytest rc $?"; tail -n 15 "$OUT/pytest.log"

echo "== cluster"
PORT=8786
$PY -m distributed.cli.dask_scheduler --host 127.0.0.1 --port $PORT --dashboard-address 127.0.0.1:0 \
  > /tmp/scheduler.log 2>&1 &
sleep 3
for i in 1 2; do
  $PY -m distributed.cli.dask_worker tcp://127.0.0.1:$PORT --host 127.0.0.1 --nthreads 1 \
    --resources GPU=1 --dashboard-address 127.0.0.1:0 > /tmp/worker$i.log 2>&1 &
done
sleep 8

SB="selective-backprop+r8"
OPTS=(--strategy-option $SB:fraction=0.33 --strategy-option $SB:refresh=8
      --strategy-option $SB:warmup=1)
bench() {  # NAME LIMIT ARGS...
  local name=$1 limit=$2; shift 2
  echo "== bench $name"
  timeout "$limit" $PY -m daskpri bench --scheduler tcp://127.0.0.1:$PORT --workers 2 --no-ddp \
    --no-progress --seeds "$SEEDS" --first-seed 10 --local-steps 16 --out /tmp/bench_$name "$@" \
    > "$OUT/$name.log" 2>&1
  echo "bench $name rc $?"; tail -n 30 "$OUT/$name.log"
  for f in results.json results.md; do
    [ -f /tmp/bench_$name/$f ] && cp /tmp/bench_$name/$f "$OUT/${name}_$f"
  done
}
bench cnn "$CNN_LIMIT" --datasets mnist1d,mnist5k --models cnn --strategies uniform,$SB \
  "${OPTS[@]}" --budget "$BUDGET" --learning-rates 0.1,0.15 --baseline-budget 3
bench mlp "$MLP_LIMIT" --datasets mnist5k --models mlp --strategies uniform,$SB "${OPTS[@]}" \
  --budget "$MLP_BUDGET" --learning-rates 0.3,0.4 --baseline-budget 2
tail -n 5 /tmp/worker1.log
