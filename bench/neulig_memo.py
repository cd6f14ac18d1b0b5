#!/usr/bin/env python
"""NeuLig with the frozen encoders' outputs memoised per image (`fusion_nb.neulig.portland.FROZEN`) against recomputing
them, in the same run (issue 30, item 3).

What experiment 10 does over and over, on the profile's models and paper 001's seven tasks: train Portland (semi-supervised,
`--steps` steps of `--batch` images per task) and score the merge and the ensemble on `--test` test images per task, for
each of `--scales` visible-data scales (Table s9 trains one Portland per scale and scores each on the same images). Timed
once with the memo emptied and kept empty (`max_bytes=0`: every output computed, as before) and once with it; one torch
thread. Printed: seconds of each, their ratio, and the largest difference between the two runs' accuracies (training may
differ in the last bits: an image first met in one batch is read later in another).

    python bench/neulig_memo.py --profile tiny
    python bench/neulig_memo.py --profile micro --steps 3 --test 10
"""
import argparse, time

import torch

from fusion_nb.methods.data import MergeData
from fusion_nb.neulig.neulig import neulig_records, train_portland
from fusion_nb.neulig.portland import FROZEN, NeuLigModel
from fusion_nb.pools import PRETRAINED, ModelPool, TaskPool
from fusion_nb.reproduce.profiles import load_profile, prepare
from fusion_nb.tiny.tasks import NEULIG_TASKS

def run(models, data, pre, experts, scales, steps, batch, n_test):
    t0, recs = time.perf_counter(), []
    for s in scales:
        m = NeuLigModel(pre, experts, models.config)
        train_portland(m, data, data_scale=s, steps=steps, batch_size=batch, progress=False)
        recs.append(neulig_records(m, data, max_samples=n_test, progress=False).assign(scale=s))
    return time.perf_counter() - t0, recs

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--profile', default='tiny')
    ap.add_argument('--steps', type=int, default=25, help="Portland steps per scale (the tiny profile's Table s9: 25)")
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--test', type=int, default=100, help="test images per task (the tiny profile's Table s9: 100)")
    ap.add_argument('--scales', type=float, nargs='+', default=[0.1, 0.4, 1.0])
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    P = prepare(load_profile(a.profile, tasks=NEULIG_TASKS), progress=False)
    models, tasks = ModelPool.from_profile(P), TaskPool.from_profile(P)
    data = MergeData(models, tasks, seed=P.seed)
    pre, experts = models.vision_state(PRETRAINED), {t: models.vision_state(t) for t in NEULIG_TASKS}
    budget = FROZEN.max_bytes
    FROZEN.clear(); FROZEN.max_bytes = 0
    off, recs_off = run(models, data, pre, experts, a.scales, a.steps, a.batch, a.test)
    FROZEN.max_bytes = budget
    on, recs_on = run(models, data, pre, experts, a.scales, a.steps, a.batch, a.test)
    acc = lambda rs: torch.tensor([r[r.metric == 'accuracy'].value.tolist() for r in rs])
    diff = float((acc(recs_off) - acc(recs_on)).abs().max()) * 100
    print(f"\n{a.profile}: {len(NEULIG_TASKS)} tasks, scales {a.scales}, {a.steps} steps of {a.batch} images, {a.test} test images per task\n")
    print(f"| frozen outputs | s |\n|---|---:|\n| computed every time | {off:.1f} |\n| memoised per image | {on:.1f} |")
    print(f"\nratio: {off / on:.2f}× faster memoised; largest accuracy difference between the two: {diff:.2f} points")
    return 0

if __name__ == '__main__':
    raise SystemExit(main())
