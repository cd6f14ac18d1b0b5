"""How many test images paper 003's refill claims need on tiny (issue 48, item 3; P4 of `bench/diagnose_masking.md`) — bench only.

    python bench/masking_test_size.py --runs R/tiny/30_masked_images/runs.csv --n 2000    # about 8 minutes, one thread

Experiment 30 calls a claim "within noise" when its mean difference over the fine-tuning seeds is no larger than the
seed standard deviation of either row. Those rows are accuracies on 400 rendered images per shift (`SCALES['tiny']['test']`),
so part of their seed-to-seed spread is which of 2,000 OOD images flip between two fine-tunes, not how the fine-tunes differ.
This script fine-tunes again, exactly as experiment 30 did, the run it picked for each method and seed (read from its
`runs.csv`: the best validation accuracy over the method's thresholds or rates), renders the ImageNet family's test
splits with `n` images each (the first 400 are the built ones: an image depends only on its index), and judges every
refill claim (finding 2) and object- vs random-mask claim (finding 3) on the first 400 images and on all `n` with
experiment 30's own rule (`claim_findings`). The package, the zoo, its pins and data/ are unchanged.
"""
from __future__ import annotations
import argparse, json, sys, time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pandas as pd

from fusion_nb.core import atomic_write_text
from fusion_nb.masking.counterfactual_ft import CounterfactualFT, cached_finetune, claim_findings, evaluate_id_ood, finetune_budget
from fusion_nb.masking.imagenet_data import id_text
from fusion_nb.pools import ModelPool, Task, TaskPool
from fusion_nb.reproduce.profiles import load_profile, prepare
from fusion_nb.tiny.build import read_manifest
from fusion_nb.tiny.tasks import build_split

ID_TASK, OOD = 'imagenet', ['imagenet_v2', 'imagenet_r', 'imagenet_sketch', 'objectnet', 'imagenet_a']
MASKINGS, FILLS = ['random', 'context', 'object'], ['single', 'multi']
FILL_LABEL = {'none': 'no-fill', 'single': 'single-fill', 'multi': 'multi-fill'}   # experiment 30's names of its claims


def picked(runs:pd.DataFrame)->pd.DataFrame:
    "Experiment 30's choice per (method, seed): the run of best validation accuracy, the first on ties."
    rows = [g.loc[g.val_accuracy.idxmax()] for _, g in runs.groupby(['method', 'seed'], sort=False)]
    return pd.DataFrame(rows).reset_index(drop=True)


def claims()->list[tuple]:
    "Findings 2 and 3 of experiment 30, named as it names them: (claim, row a, row b, column, sign)."
    out = [(f'{FILL_LABEL[r]} beats no-fill on OOD ({m}-mask)', f'ours:{m}:{r}', f'ours:{m}:none', 'ood_avg', +1) for m in MASKINGS for r in FILLS]
    return out + [(f'object-mask beats random-mask on OOD ({FILL_LABEL[r]})', f'ours:object:{r}', f'ours:random:{r}', 'ood_avg', +1) for r in ['none', *FILLS]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--runs', required=True, help="experiment 30's runs.csv (the run it picked per method and seed is fine-tuned again)")
    ap.add_argument('--n', type=int, default=2000, help='test images per ImageNet-family split (the built ones: 400)')
    ap.add_argument('--out', default=str(REPO/'bench'/'masking_test_size_tiny.json'))
    a = ap.parse_args()
    t0 = time.time()
    P = prepare(load_profile('tiny', tasks=[ID_TASK, *OOD]))
    B = finetune_budget(P)
    models = ModelPool(P.pretrained, {}, P.device, P.dtype)
    tasks = TaskPool([Task(t, P.datasets[t], split=P.test_split) for t in [ID_TASK, *OOD]])
    clip, tok, proc = models.clip, models.tokenizer, models.processor
    train = tasks[ID_TASK].load('train')
    ID = id_text(P, ID_TASK, train.features['label'].names)
    built = {t: tasks[t].load(P.test_split) for t in [ID_TASK, *OOD]}
    n0 = len(built[ID_TASK])
    if a.n < n0: raise SystemExit(f'--n {a.n} is below the built test splits ({n0} images)')
    big = {t: build_split(t, 'test', a.n, seed=read_manifest('tiny', P.root)['seed']) for t in [ID_TASK, *OOD]}   # the build's data seed
    for t in big:   # the first n0 rendered images are the built split's: same labels, same pixels
        same = big[t].select(range(n0))
        if same['label'] != built[t]['label'] or any(x.tobytes() != y.tobytes() for x, y in zip(same['image'], built[t]['image'])):
            raise SystemExit(f'{t}: the first {n0} of {a.n} rendered test images are not the built split')
    runs = picked(pd.read_csv(a.runs))
    runs = runs[runs.method.isin({'vanilla_ft', *(r for c in claims() for r in c[1:3])})]
    encoders = {}
    for _, r in runs.iterrows():
        h = {} if pd.isna(r.hparam) else {'rate': float(r.hparam)} if r.masking == 'random' else {'threshold': float(r.hparam)}
        cfg = CounterfactualFT(**{**B, 'masking': r.masking, 'refill': r.refill, **h, **({'beta': 0.} if r.method == 'vanilla_ft' else {})})
        res = cached_finetune(None, clip, tok, proc, train, ID.class_names, ID.templates, cfg, seed=int(r.seed), device=P.device, progress=False)
        if abs(res.best_val_accuracy - r.val_accuracy) > 1e-9: raise SystemExit(f'{r.model}: validation {res.best_val_accuracy} here, {r.val_accuracy} in {a.runs}')
        encoders[(r.method, int(r.seed))] = res.encoder
        print(f'{r.model}: fine-tuned again ({time.time() - t0:.0f} s)', flush=True)
    named = {f'{m}/s{s}': e for (m, s), e in encoders.items()}
    rec = evaluate_id_ood(named, clip, tok, proc, big, ID.class_names, ID.templates, batch_size=P.batch_size, device=P.device, progress=False,
                          id_wnids=ID.wnids, id_aliases=ID.aliases)
    result = {'n_built': n0, 'n': a.n, 'runs': runs.model.tolist(), 'seconds': None, 'verdicts': {}}
    for n in (n0, a.n):
        sub = {t: d.select(range(n)) for t, d in big.items()}
        r_n = rec if n == a.n else evaluate_id_ood(named, clip, tok, proc, sub, ID.class_names, ID.templates, batch_size=P.batch_size,
                                                   device=P.device, progress=False, id_wnids=ID.wnids, id_aliases=ID.aliases)
        acc = r_n.pivot_table(index='model', columns='task', values='value') * 100
        acc['ood_avg'] = acc[OOD].mean(axis=1)
        values = lambda row, col: pd.Series({s: acc.loc[f'{row}/s{s}', col] for (m, s) in encoders if m == row}).sort_index()
        f = claim_findings(claims(), values)
        result['verdicts'][str(n)] = f.reset_index().to_dict('records')
        result.setdefault('accuracy', {})[str(n)] = acc.round(4).reset_index().to_dict('records')
        print(f'\n{n} images per split:'); print(f[['difference (points)', 'min over seeds', 'max over seeds', 'seed std (larger row)', 'verdict']].round(2).to_string())
    result['seconds'] = round(time.time() - t0)
    atomic_write_text(Path(a.out), json.dumps(result, indent=1, default=float))
    print(f'\n{result["seconds"]} s; wrote {a.out}')


if __name__ == '__main__':
    main()
