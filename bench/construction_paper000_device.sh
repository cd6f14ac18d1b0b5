#!/usr/bin/env bash
# Issue 47, option (a) on a lent GPU: several builds of each pre-training candidate side by side on one GPU, each pre-trained,
# fine-tuned (the eight experts) and merged (experiment 04's ten rows) on CUDA by bench/construction_paper000.py; what is done
# comes back as $OUT/results.tgz (repacked every 20 s, so a run cut short still returns its finished builds), and each
# pre-trained CLIP as $OUT/clip_NAME.tgz (so experts and rows can be finished on a CPU: `build NAME_ft --clip-from …`).
# Three builds a call should fit 10 minutes on an H200 (estimated: bench/construction_paper000.md, option (a)); six only pre-trained.
#
#   bash bench/construction_paper000_device.sh "NAME:SCHEDULE:STEPS:WARMUP ..." "SEEDS" [SECONDS] ["SEEDS of a second wave"]
#   e.g. bash bench/construction_paper000_device.sh "const8k:constant:8000:0 cos8k:cosine:8000:200" "0 1 2" 530 "3 4"
#
# Needs, in .gpu/ (ignored through .git/info/exclude, carried by the device tool): wheels/ (datasets, dill, multiprocess, fastcore
# for the machine's Python) and datasets/ (the eight tasks of data/tiny/datasets). GPU weights are not the CPU's: the builds here are
# compared with each other, not with the pins. A second wave starts only while half the time is left.
set -u
LIMIT=${3:-530}; WAVE2=${4:-}; T0=$SECONDS
python3 -c "import datasets, fastcore" 2>/dev/null ||   # the machine lacks them: the carried wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TQDM_DISABLE=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 \
       CUBLAS_WORKSPACE_CONFIG=:4096:8
RES=${OUT:-/tmp/out}; mkdir -p "$RES" logs
ROWS=${ROWS:-simple_average task_arithmetic ties_merging fisher_merging regmean concrete_task_arithmetic task_wise_adamerging
      layer_wise_adamerging concrete_layer_wise_adamerging weight_ensembling_moe}   # experiment 04's ten merged rows
A="--scratch /tmp/zoos --datasets .gpu/datasets --device ${DEVICE:-cuda}"   # DEVICE=cpu, BUILD_ARGS/MEASURE_ARGS: a smoke test here
touch /tmp/zoos.t0
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__)"; nproc; } > logs/machine.txt 2>&1

pipeline() {   # NAME SCHEDULE STEPS WARMUP SEED: build, then the ten rows (one process; row by row if that fails, so one broken row costs only itself)
  local n=$1_s$5 r
  python3 bench/construction_paper000.py build $n --pretrain-schedule $2 --pretrain-steps $3 --warmup-steps $4 --seed $5 $A ${BUILD_ARGS:-} || return 1
  python3 bench/construction_paper000.py measure $n --methods --rows $ROWS $A ${MEASURE_ARGS:-} && return 0
  for r in $ROWS; do python3 bench/construction_paper000.py measure $n --methods --rows $r --suffix _$r $A ${MEASURE_ARGS:-}; done
}
pack() {   # the measurements, and each pre-trained CLIP once written (atomically, by pretrain_clip): 3.8 MB each, a file each (the tool returns 8)
  tar czf "$RES/results.tmp" logs $(find bench/construction_paper000 -newer /tmp/zoos.t0 -type f) /tmp/zoos/*/candidate.json 2>/dev/null
  mv "$RES/results.tmp" "$RES/results.tgz"
  for c in /tmp/zoos/*/clip-vit-tiny; do n=$(basename $(dirname $c))
    [ -e "$RES/clip_$n.tgz" ] || { tar czf "$RES/clip.tmp" -C /tmp/zoos $n/clip-vit-tiny && mv "$RES/clip.tmp" "$RES/clip_$n.tgz"; }; done 2>/dev/null
}
wave() {
  for c in $1; do IFS=: read -r name sched steps warm <<< "$c"
    for s in $2; do pipeline $name $sched $steps $warm $s > logs/${name}_s$s.log 2>&1 & done
  done
  while [ -n "$(jobs -r)" ] && [ $((SECONDS - T0)) -lt $LIMIT ]; do sleep 20; pack; done
  echo "wave '$2' ended at $((SECONDS - T0)) s" >> logs/machine.txt
}
wave "$1" "$2"
if [ -n "$WAVE2" ] && [ $((SECONDS - T0)) -lt $((LIMIT / 2)) ]; then wave "$1" "$WAVE2"; fi
kill $(jobs -p) 2>/dev/null; pack; ls -la "$RES"
