#!/usr/bin/env python
"""Test-time methods' unlabelled batches: each image preprocessed once (`PreprocessedImages`) against every batch
preprocessed again (the loader over the raw dataset, as before), in the same run (issue 30, item 3).

Both sides draw the same `--steps` batches of `--batch` test images of every task of the profile, as AdaMerging does
(one batch per task per step); the batches are checked equal bit for bit. Printed: seconds of each over `--repeat`
interleaved pairs (medians) and their ratio. No model runs: this is the data side of a test-time step only, to set
beside a step's forward and backward passes (in experiment 04 on tiny, py-spy put the stream at 15–20 % of the run).

    python bench/tta_stream.py --profile tiny
    python bench/tta_stream.py --profile micro --steps 20
"""
import argparse, statistics, time

import torch

from fusion_nb.methods.data import _loader, unlabelled_stream
from fusion_nb.pools import ModelPool, TaskPool
from fusion_nb.reproduce.profiles import load_profile, prepare

def draw(streams, steps:int)->list:
    return [next(s) for _ in range(steps) for s in streams]

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--profile', default='tiny')
    ap.add_argument('--steps', type=int, default=200, help="steps (the tiny profile's AdaMerging: 200)")
    ap.add_argument('--batch', type=int, default=16, help='images per task per step (paper 000: 16)')
    ap.add_argument('--repeat', type=int, default=3)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    P = prepare(load_profile(a.profile), progress=False)
    models, tasks = ModelPool.from_profile(P), TaskPool.from_profile(P)
    plain_streams = lambda: [iter(_endless(tasks[t].load(), models.processor, a.batch)) for t in P.tasks]
    memo_streams = lambda: [unlabelled_stream(tasks[t], models.processor, a.batch) for t in P.tasks]
    times = {'every batch preprocessed': [], 'each image once': []}
    for _ in range(a.repeat):
        for name, make in (('every batch preprocessed', plain_streams), ('each image once', memo_streams)):
            t0 = time.perf_counter(); got = draw(make(), a.steps); times[name].append(time.perf_counter() - t0)
            if name == 'every batch preprocessed': ref = got
            else: assert all(torch.equal(x, y) for x, y in zip(ref, got)), 'the batches differ'
    med = {k: statistics.median(v) for k, v in times.items()}
    n = a.steps * len(P.tasks) * a.batch
    print(f"\n{a.profile}: {len(P.tasks)} tasks × {a.steps} steps × {a.batch} images = {n} images drawn; batches equal bit for bit\n")
    print("| stream | s (median of {}) |\n|---|---:|".format(a.repeat))
    for k, v in med.items(): print(f"| {k} | {v:.2f} |")
    print(f"\nratio: {med['every batch preprocessed'] / med['each image once']:.1f}× faster with each image preprocessed once")
    return 0

def _endless(ds, processor, batch):
    "The stream as it was: the loader over the raw dataset, every batch preprocessed again, the same seed."
    loader = _loader(ds, processor, batch, True, 0)
    while True:
        for b in loader: yield b['pixel_values']

if __name__ == '__main__':
    raise SystemExit(main())
