#!/usr/bin/env python
"""`evaluate` with each encoder run once per batch (shared by the rows that hold it) against every row running its own, in
the same run (issue 47).

The rows are those of paper 001's Table s5 that need no training (`merge_ensemble_gap` as experiment 10 calls it): the
pretrained model, each expert on its task, and Mer. and Ens. of simple averaging, task arithmetic and TIES-merging;
the Ens. rows are output-space ensembles of θ₀ and the seven experts, so the same eight encoders sit in most rows.
The baseline is the same call with the memo switched off (`ZeroShotClassifier(shared=None)`, as before). Printed:
each side's seconds (medians of `--repeat` interleaved pairs), their ratio, the forward passes of each, and whether
the records are equal bit for bit.

    python bench/eval_shared_encoders.py --profile tiny       # the built benchmark (restored from pins/)
    python bench/eval_shared_encoders.py --profile micro --repeat 1
"""
import argparse, statistics, time

import pandas as pd
import torch

from fusion_nb import evaluation
from fusion_nb.pools import PRETRAINED, ModelPool, TaskPool
from fusion_nb.reproduce.profiles import load_profile, prepare
from fusion_nb.reproduce.rows import fuse
from fusion_nb.neulig.merge_vs_ensemble import merge_ensemble_gap

NEULIG_TASKS = ['gtsrb', 'cifar100', 'resisc45', 'cifar10', 'mnist', 'stl10', 'svhn']   # paper 001's seven (notebook 10)
ROWS = ['simple_average', 'task_arithmetic', 'ties_merging']

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--profile', default='tiny')
    ap.add_argument('--repeat', type=int, default=3)
    a = ap.parse_args(argv)
    P = prepare(load_profile(a.profile, tasks=NEULIG_TASKS), progress=False)
    models, tasks = ModelPool.from_profile(P), TaskPool.from_profile(P)
    pre, experts = models.vision_state(PRETRAINED), {t: models.vision_state(t) for t in P.tasks}
    fused = {r: fuse(r, pre, experts, None, progress=False, paper='001')[0] for r in ROWS}
    init, passes = evaluation.ZeroShotClassifier.__init__, []
    def unshared(self, *args, shared=None, **kw): init(self, *args, shared=None, **kw)
    forward = models.vision_model(pre).__class__.forward
    def counted(self, *args, **kw): passes.append(1); return forward(self, *args, **kw)
    def run(share:bool):
        evaluation.ZeroShotClassifier.__init__ = init if share else unshared
        models.vision_model(pre).__class__.forward = counted
        passes.clear(); t0 = time.perf_counter()
        try: rec = merge_ensemble_gap(fused, models, tasks, P.tasks, pretrained=pre, experts=experts, combine='logits',
                                      batch_size=P.batch_size, max_samples=P.max_test_samples, progress=False)
        finally: evaluation.ZeroShotClassifier.__init__ = init; models.vision_model(pre).__class__.forward = forward
        return time.perf_counter() - t0, len(passes), rec
    run(True)   # warm-up: heads, datasets, encoders
    shared, alone = [], []
    for _ in range(a.repeat):
        shared.append(run(True)); alone.append(run(False))
    same = all(s[2].equals(b[2]) for s, b in zip(shared, alone))
    ts, tb = statistics.median(s[0] for s in shared), statistics.median(b[0] for b in alone)
    print(f"profile {P.name}, {len(P.tasks)} tasks, {len(ROWS)} methods (Mer. and Ens.), torch threads {torch.get_num_threads()}")
    print(f"each row its own encoders: {tb:7.1f} s, {alone[0][1]} forward passes")
    print(f"encoders shared:           {ts:7.1f} s, {shared[0][1]} forward passes")
    print(f"ratio (shared / own):      {ts / tb:7.2f}; records equal bit for bit: {same}")
    return 0 if same else 1

if __name__ == '__main__':
    raise SystemExit(main())
