"""Paper 003 (experiments 30, 31): how far its refill and mask comparisons move with the test images drawn (issue 48).

    python bench/diagnose_masking_draws.py --profile micro --seeds 0 --draws 2   # smoke (seconds)
    python bench/diagnose_masking_draws.py --profile tiny                        # fine-tuning seeds 0-2, test draws 0-4

Every fine-tuning seed and every build of experiment 30 is scored on the same test images (400 per shift on tiny), so
neither its seeds' noise nor the build spread says how far a comparison moves with the images drawn: a margin can belong
to the draw (experiment 40's held-out sets had exactly that: `bench/diagnose_uq_merge.py questions`). This script trains
eq. 2's six refill / mask runs at section 4.2's middle (rate 0.5, threshold 0.5, as `diagnose_masking.py`; experiment 30
picks them per seed by validation) for each seed, scores each on the benchmark's test sets (draw 0) and on other draws
of the same renderers (`fusion_nb.tiny.tasks.build_split`, seeds 1 …), and prints, per comparison, the seeds' mean
difference on each draw (what experiment 30 judges), its sd over draws, and the sd over seeds on draw 0.
Writes bench/diagnose_masking/draws_<profile>.json; nothing in the package, the zoo or a method changes.
"""
from __future__ import annotations
import argparse, json, sys, time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

OOD = ['imagenet_v2', 'imagenet_r', 'imagenet_sketch', 'objectnet', 'imagenet_a']
RUNS = {f'{m}:{r}': dict(masking=m, refill=r) for m in ('random', 'context', 'object') for r in ('none', 'single')}
# paper 003's claims (2) and (3): refill − no-fill per mask, object − random per fill
COMPARISONS = {**{f'single-fill − no-fill ({m}-mask)': (f'{m}:single', f'{m}:none') for m in ('random', 'context', 'object')},
               **{f'object − random-mask ({r})': (f'object:{r}', f'random:{r}') for r in ('none', 'single')}}


def main(argv=None):
    from fusion_nb.masking.counterfactual_ft import CounterfactualFT, evaluate_id_ood, finetune_budget, finetune_counterfactual
    from fusion_nb.masking.imagenet_data import id_text
    from fusion_nb.pools import ModelPool, Task, TaskPool
    from fusion_nb.reproduce.profiles import load_profile, prepare
    from fusion_nb.tiny.tasks import build_split
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--profile', default='tiny')
    ap.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2], help='fine-tuning seeds')
    ap.add_argument('--draws', type=int, default=5, help='draws of the test sets (draw 0: the benchmark\'s)')
    a = ap.parse_args(argv)
    t0 = time.time()
    P = prepare(load_profile(a.profile, tasks=['imagenet', *OOD]))
    B = finetune_budget(P)
    models = ModelPool(P.pretrained, {}, P.device, P.dtype)
    tasks = TaskPool([Task(t, P.datasets[t], split=P.test_split) for t in ['imagenet', *OOD]])
    clip, tok, proc = models.clip, models.tokenizer, models.processor
    train = tasks['imagenet'].load('train')
    ID = id_text(P, 'imagenet', train.features['label'].names)
    draw0 = {t: tasks[t].load(P.test_split, max_samples=P.max_test_samples, seed=P.seed) for t in OOD}
    draws = [draw0] + [{t: build_split(t, P.test_split, len(draw0[t]), seed=d) for t in OOD} for d in range(1, a.draws)]
    rows = []
    for seed in a.seeds:
        enc = {n: finetune_counterfactual(clip, tok, proc, train, ID.class_names, ID.templates,
                                          CounterfactualFT(**{**B, **r, 'threshold': 0.5, 'rate': 0.5}), seed=seed, device=P.device,
                                          progress=False).encoder.eval() for n, r in RUNS.items()}
        for d, sets in enumerate(draws):
            rec = evaluate_id_ood(enc, clip, tok, proc, sets, ID.class_names, ID.templates, device=P.device, progress=False,
                                  id_wnids=ID.wnids, id_aliases=ID.aliases)
            ood = (rec.pivot_table(index='model', columns='task', values='value') * 100)[OOD].mean(axis=1)
            rows += [dict(seed=seed, draw=d, run=n, ood_avg=float(v)) for n, v in ood.items()]
        print(f'seed {seed} done, {time.time() - t0:.0f} s', flush=True)
    df = pd.DataFrame(rows).pivot_table(index=['seed', 'draw'], columns='run', values='ood_avg')
    out = []
    for name, (x, y) in COMPARISONS.items():
        diff = (df[x] - df[y]).unstack('draw')                     # seeds × draws
        per_draw = diff.mean(axis=0)                               # experiment 30's number: the mean over seeds
        out.append(dict(comparison=name, per_draw=per_draw.round(2).tolist(), sd_over_draws=round(float(per_draw.std(ddof=1)), 2) if a.draws > 1 else None,
                        draw0=round(float(per_draw.iloc[0]), 2), sd_over_seeds_draw0=round(float(diff[0].std(ddof=1)), 2) if len(a.seeds) > 1 else None))
    table = pd.DataFrame(out).set_index('comparison')
    print(table.to_string())
    res = dict(profile=P.name, seeds=a.seeds, draws=a.draws, test_images_per_shift={t: len(draw0[t]) for t in OOD},
               budget=B, comparisons=out, ood_avg=df.round(3).reset_index().to_dict('records'), seconds=round(time.time() - t0))
    dest = REPO/'bench'/'diagnose_masking'/f'draws_{P.name}.json'; dest.parent.mkdir(exist_ok=True)
    dest.write_text(json.dumps(res, indent=1))
    print('wrote', dest, res['seconds'], 's')


if __name__ == '__main__': main()
