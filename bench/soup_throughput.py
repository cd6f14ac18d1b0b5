#!/usr/bin/env python
"""Soups evaluated per second, against a bare forward pass over the same images (issue 13, paper 002 §4).

One run, one thread (`torch.set_num_threads(1)`), the small CIFAR-sized ConvNet of `fusion_nb.robust.models` and four
ingredients (random perturbations of one init: the soup arithmetic does not care how they were trained),
`--images` random images in [0, 1]. Measured per soup, interleaved with a bare pass (medians of the ratios):

- bare:     one forward pass of one fixed model over all images (in batches of `--batch`): the floor;
- in-place: `SoupKitchen.set(w)` (one matrix-vector product into the model's parameters) then the same
            forward pass, for every soup of the paper's four-model grid (affine weights in [-0.4, 1.4],
            step 0.2: 480 soups; `--soups` takes the first N);
- naive:    the merge-method path, per soup: `weighted_average` builds a new state dict, a fresh model is
            built and `load_state_dict`-ed, then the same forward pass (`--naive-soups` of them);
- set only: `SoupKitchen.set(w)` alone;
- build only: the naive path without the forward pass (`weighted_average` + new model + `load_state_dict`).

Printed as ratios (absolute times depend on the machine and its load): a soup's cost in bare forward
passes taken at the same moment (ideal: 1.0), and in-place's speed-up over naive. Goal: in-place costs at most 1.2 forward passes.
With many images per soup the forward pass dominates both paths; `--images 8` shows the regime where
building the soup is what costs.

    python bench/soup_throughput.py                  # 480 soups, 256 images, 1 repeat
    python bench/soup_throughput.py --soups 48 --images 8 --batch 8   # a quick run in the soup-bound regime
"""
import argparse, statistics, time

import torch
from torch import nn

from fusion_nb.methods.soups import affine_grid, weighted_average
from fusion_nb.robust.models import convnet
from fusion_nb.robust.soups import SoupKitchen

def best_time(fn, repeat):
    "Best wall time of `repeat` calls of `fn`."
    out = []
    for _ in range(repeat):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    return min(out)

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--images', type=int, default=256); p.add_argument('--batch', type=int, default=256)
    p.add_argument('--soups', type=int, default=480); p.add_argument('--naive-soups', type=int, default=24)
    p.add_argument('--width', type=int, default=32); p.add_argument('--repeat', type=int, default=1)
    a = p.parse_args(argv)
    threads = torch.get_num_threads(); torch.set_num_threads(1); torch.manual_seed(0)
    try: return _run(a)
    finally: torch.set_num_threads(threads)  # leave a caller's (e.g. pytest's) thread count as it was

def _run(a):
    base = convnet(a.width).eval()
    ings = {f'ing{i}': {k: (v + 0.01 * torch.randn_like(v)) if v.is_floating_point() else v.clone() for k, v in base.state_dict().items()} for i in range(4)}
    grid = affine_grid(4)[:a.soups]
    x = torch.rand(a.images, 3, 32, 32)
    kitchen = SoupKitchen(base, ings)

    @torch.no_grad()
    def forward(m):
        for i in range(0, len(x), a.batch): m(x[i:i + a.batch])
    def timed(fn):
        t = time.perf_counter(); fn(); return time.perf_counter() - t
    def naive_soup(w):
        m = convnet(a.width); m.load_state_dict(weighted_average(None, ings, weights=w, progress=False)); return m.eval()

    fixed = convnet(a.width); fixed.load_state_dict(base.state_dict()); fixed.eval()
    forward(fixed); forward(kitchen.set(grid[0]))  # warm-up
    # interleaved: each soup's timing sits next to a bare pass taken at the same moment, so a shared
    # machine's changing load moves both alike; the ratios are medians over soups
    rows = []
    for r in range(a.repeat):
        for j, w in enumerate(grid):
            row = dict(bare=timed(lambda: forward(fixed)), inplace=timed(lambda: forward(kitchen.set(w))),
                       set=timed(lambda: kitchen.set(w)))
            if j < a.naive_soups: row.update(naive=timed(lambda: forward(naive_soup(w))), build=timed(lambda: naive_soup(w)))
            rows.append(row)
    med = lambda k: statistics.median(r[k] / r['bare'] for r in rows if k in r)
    t_bare = statistics.median(r['bare'] for r in rows)
    n_par = kitchen.table.shape[1]
    print(f"model: ConvNet width {a.width}, {n_par:,} parameters; {a.images} images of 3x32x32; {len(grid)} soups of 4 ingredients "
          f"({min(a.naive_soups, len(grid))} naive); {a.repeat} repeat(s); 1 thread")
    print(f"bare forward pass over the images : {1 / t_bare:8.2f} passes/s (median; absolute times depend on the machine's load)")
    print(f"in-place soup (set + forward)     : {med('inplace'):.3f} bare passes per soup")
    print(f"naive soup (build + load + fwd)   : {med('naive'):.3f} bare passes per soup")
    print(f"set only (one mv into the params) : {med('set'):.4f} bare passes per soup")
    print(f"build only (naive soup, no fwd)   : {med('build'):.4f} bare passes per soup")
    print(f"in-place speed-up over naive      : {med('naive') / med('inplace'):.2f}x (soup assembly alone: {med('build') / med('set'):.1f}x)")
    return dict(bare=t_bare, inplace=med('inplace'), naive=med('naive'), set=med('set'), build=med('build'))

if __name__ == '__main__': main()
