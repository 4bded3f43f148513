#!/usr/bin/env bash
# The CUDA path on a machine with a GPU, in one go (about 7 minutes on an
# H100): the CUDA tests, then `daskpri bench` on a `dask scheduler` with two
# `dask worker --resources GPU=1` processes on loopback (both on the machine's
# one GPU). What comes back in $OUT: device_run.tar.gz, which holds env.txt,
# pytest.log, and each benchmark's log, results.json and results.md (11 files;
# the device tool returns at most 8, so they travel as one, written on exit, a
# run stopped at its limit included).
#
#   OUT=/some/dir bash benchmarks/device_run.sh
#
# Wheels in .whl/ (dask, distributed, ... missing from the machine's image) are
# installed to /tmp/site first where the directory exists. BUDGET, SHORT_BUDGET,
# OVERHEAD_BUDGET, SEEDS, OVERHEAD_SEEDS
# and the *_LIMIT seconds (560 s in all) let a short rehearsal run on a CPU machine.
set -u
OUT=${OUT:-/tmp/device_out}
FILES=$(mktemp -d /tmp/device_files.XXXX)
# the scheduler and workers started below stop with the script, and what it wrote
# is packed into one file
trap 'kill $(jobs -p) 2>/dev/null; tar czf "$OUT/device_run.tar.gz" -C "$FILES" .' EXIT
BUDGET=${BUDGET:-6}
SHORT_BUDGET=${SHORT_BUDGET:-1.5}
SEEDS=${SEEDS:-5}
TEST_LIMIT=${TEST_LIMIT:-80}
CNN_LIMIT=${CNN_LIMIT:-210}
SHORT_LIMIT=${SHORT_LIMIT:-160}
OVERHEAD_LIMIT=${OVERHEAD_LIMIT:-110}
OVERHEAD_BUDGET=${OVERHEAD_BUDGET:-4}
OVERHEAD_SEEDS=${OVERHEAD_SEEDS:-3}
PY=${PY:-python3}
# the benchmarks' directories: fresh, unless BENCH_ROOT names the one of a run to take on
# with RESUME=1 (after a call that stopped at its limit)
BENCH_ROOT=${BENCH_ROOT:-$(mktemp -d /tmp/daskpri_bench.XXXX)}
RESUME=${RESUME:+--resume}
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
} > "$FILES/env.txt" 2>&1
cat "$FILES/env.txt"

echo "== tests"
timeout "$TEST_LIMIT" $PY -m pytest -q -p no:cacheprovider --timeout 120 -rs \
  tests/test_cuda.py tests/test_evaluation.py tests/test_strategies_extra.py \
  -k "cuda or gpu or end_to_end or bfloat16 or eval" \
  > "$FILES/pytest.log" 2>&1
echo "pytest rc $?"; tail -n 15 "$FILES/pytest.log"

echo "== cluster"
PORT=8786
$PY -m distributed.cli.dask_scheduler --host 127.0.0.1 --port $PORT --dashboard-address 127.0.0.1:0 \
  > /tmp/scheduler.log 2>&1 &
sleep 3
for i in 1 2; do
  $PY -m distributed.cli.dask_worker tcp://127.0.0.1:$PORT --host 127.0.0.1 --nthreads 1 \
    --resources GPU=1 --death-timeout 60 --dashboard-address 127.0.0.1:0 > /tmp/worker$i.log 2>&1 &
done
sleep 8

SB="selective-backprop+r8"
OPTS=(--strategy-option $SB:fraction=0.33 --strategy-option $SB:refresh=8
      --strategy-option $SB:warmup=1)
bench() {  # NAME LIMIT WORKERS ARGS...
  local name=$1 limit=$2 workers=$3; shift 3
  echo "== bench $name"
  timeout "$limit" $PY -m daskpri bench --scheduler tcp://127.0.0.1:$PORT --workers $workers --no-ddp \
    --no-progress --first-seed 10 --out $BENCH_ROOT/$name $RESUME "$@" > "$FILES/$name.log" 2>&1
  echo "bench $name rc $?"; tail -n 30 "$FILES/$name.log"
  # a benchmark stopped at its limit still gets its report, of the runs it made
  [ -f $BENCH_ROOT/$name/results.md ] || $PY -m daskpri bench --out $BENCH_ROOT/$name --report-only
  for f in results.json results.md; do
    [ -f $BENCH_ROOT/$name/$f ] && cp $BENCH_ROOT/$name/$f "$FILES/${name}_$f"
  done
}
# the MNIST-1D CNN as the thirtieth and thirty-first sessions ran it on an H200 and an H100
# (1.45x on ten seeds), now with grad_scale=0.5: the warmup at the swept rate, the selection
# at half of it (on CPU D 1.44x against 1.32x without it; thirty-second session)
GS="selective-backprop+gs"
bench cnn "$CNN_LIMIT" 2 --datasets mnist1d --models cnn --strategies uniform,$GS \
  --strategy-option $GS:fraction=0.33 --strategy-option $GS:refresh=8 --strategy-option $GS:warmup=1 \
  --strategy-option $GS:grad_scale=0.5 \
  --seeds "$SEEDS" --local-steps 16 --budget "$BUDGET" --learning-rates 0.15,0.2 --baseline-budget 3
# the mnist5k models reach their targets within a second on a GPU: short budgets, and rounds
# of 4 steps so that the evaluations (every round) resolve the time to target; the CNN wants
# 0.075 (at 0.15 the selective arm collapsed on 2 of 5 seeds of an H100), the MLP 0.3
bench mnist5k "$SHORT_LIMIT" 2 --datasets mnist5k --models mlp,cnn --strategies uniform,$SB "${OPTS[@]}" \
  --seeds "$SEEDS" --local-steps 4 --eval-every 4 --budget "$SHORT_BUDGET" \
  --learning-rates 0.075,0.15,0.3 --baseline-budget 1
# the overhead goal's setting: one worker, 512 local steps, each seed next to the plain loop
bench overhead "$OVERHEAD_LIMIT" 1 --datasets mnist1d --models mlp,cnn --strategies uniform \
  --seeds "$OVERHEAD_SEEDS" --local-steps 512 --budget "$OVERHEAD_BUDGET" --baseline-budget "$OVERHEAD_BUDGET" \
  --learning-rates 0.15
tail -n 5 /tmp/worker1.log
