#!/usr/bin/env python
"""WE-MoE at evaluation: routing each sample on its own (the library) vs averaging the routing weights over
the batch (`routing='batch'`: the code before issue 11, and FusionBench's evaluation, whose MoE layers never read the
`batch_reduce = False` its algorithm sets after adaptation).

The same routers are evaluated both ways on every task's test split, task by task (as the tables do), with
the profile's evaluation batch size. Then the leak itself: each task's test images are evaluated in batches
mixed with other tasks' images (a shuffled stream of all tasks, the same batch size): per-sample routing
must give exactly the task-by-task predictions; batch-averaged routing depends on the batch-mates.

    python bench/wemoe_routing.py                                # tiny profile, routers trained here (wemoe budget of the profile)
    python bench/wemoe_routing.py --routers outputs/tiny/04_fusion_eight_tasks/artefacts/weight_ensembling_moe.routers.safetensors
    python bench/wemoe_routing.py --profile micro --steps 3       # smoke run

Prints a table: per task, accuracy with per-sample routing, with batch-averaged routing (task-pure batches),
with batch-averaged routing in mixed batches, and the fraction of predictions that change when the batch
is mixed (per-sample routing: must be 0).
"""
import argparse, contextlib, os, sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fusion_nb.reproduce.profiles import load_profile, prepare
from fusion_nb.pools import ModelPool, TaskPool, PRETRAINED
from fusion_nb.evaluation import image_loader
from fusion_nb.methods.data import MergeData
from fusion_nb.reproduce.rows import fusion_settings
from fusion_nb.merge import merge


@contextlib.contextmanager
def batch_averaged(model):
    "FusionBench's evaluation protocol, the library's labelled option routing='batch': routing averaged over each batch."
    old = model.we_moe_info.get('routing', 'sample')
    model.set_routing('batch')
    try: yield model
    finally: model.set_routing(old)


@torch.no_grad()
def predictions(model, heads, pixels, tasks, batch_size):
    "Arg-max predictions of each image under its own task's head, in batches of `batch_size` in the given order."
    out = []
    for i in range(0, len(pixels), batch_size):
        pooled = model(pixel_values=pixels[i:i + batch_size].to(heads.scale.device)).pooler_output
        out += [int(heads(pooled[j:j + 1], t).argmax(-1)) for j, t in enumerate(tasks[i:i + batch_size])]
    return torch.tensor(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--profile', default='tiny')
    ap.add_argument('--routers', default=None, help='trained routers (.safetensors); default: train them here')
    ap.add_argument('--steps', type=int, default=None, help="router training steps (default: the profile's wemoe_steps)")
    ap.add_argument('--max-test-samples', type=int, default=0, help='per task, 0: the whole test split')
    ap.add_argument('--threads', type=int, default=max(1, min(2, os.cpu_count() or 1)))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    P = prepare(load_profile(args.profile, max_test_samples=args.max_test_samples))
    models, tasks = ModelPool.from_profile(P), TaskPool.from_profile(P)
    data = MergeData(models, tasks, seed=P.seed, max_test_samples=P.max_test_samples)
    S = fusion_settings(P)
    hp = dict(load_from=args.routers) if args.routers else dict(steps=args.steps or S['wemoe_steps'], lr=S['wemoe_lr'], batch_size=S['tta_batch_size'])
    model = merge('weight_ensembling_moe', models.vision_state(PRETRAINED), {t: models.vision_state(t) for t in P.tasks}, data=data, seed=P.seed, **hp).eval()
    heads = data.heads
    pix, lab, own = [], [], []
    for t in P.tasks:
        ds = tasks[t].load(P.test_split, max_samples=P.max_test_samples, seed=P.seed)
        for b in image_loader(ds, models.processor, batch_size=256):
            pix.append(b['pixel_values']); lab.append(b['label']); own += [t] * len(b['label'])
    pix, lab = torch.cat(pix), torch.cat(lab)
    mix = torch.randperm(len(lab), generator=torch.Generator().manual_seed(P.seed))
    bs = P.batch_size
    per_sample = predictions(model, heads, pix, own, bs)
    per_sample_mixed = torch.empty_like(per_sample); per_sample_mixed[mix] = predictions(model, heads, pix[mix], [own[i] for i in mix], bs)
    with batch_averaged(model):
        averaged = predictions(model, heads, pix, own, bs)
        averaged_mixed = torch.empty_like(averaged); averaged_mixed[mix] = predictions(model, heads, pix[mix], [own[i] for i in mix], bs)
    own = list(own)
    print(f"profile {P.name}, evaluation batch {bs}, routers {'from ' + args.routers if args.routers else 'trained here'}")
    print(f"{'task':16s} {'n':>5s} {'per-sample':>11s} {'batch-avg':>10s} {'batch-avg mixed':>16s} {'changed mixed (per-sample / batch-avg)':>40s}")
    rows = []
    for t in [*P.tasks, 'Avg.']:
        idx = torch.tensor([i for i, o in enumerate(own) if o == t]) if t != 'Avg.' else None
        if idx is None:
            r = [sum(x[k] for x in rows) / len(rows) for k in range(5)]
        else:
            acc = lambda p: 100 * float((p[idx] == lab[idx]).float().mean())
            chg = lambda a, b: 100 * float((a[idx] != b[idx]).float().mean())
            r = [acc(per_sample), acc(averaged), acc(averaged_mixed), chg(per_sample, per_sample_mixed), chg(averaged, averaged_mixed)]
            rows.append(r)
        n = len(idx) if idx is not None else len(lab)
        print(f"{t:16s} {n:5d} {r[0]:11.1f} {r[1]:10.1f} {r[2]:16.1f} {r[3]:19.1f}% / {r[4]:.1f}%")


if __name__ == '__main__':
    main()
