"""Why single-fill drifts *less* than no-fill (issue 48, item 3; experiment 30's finding 4): where the counterfactuals lie, measured.

    python bench/diagnose_masking_drift.py --profile micro                       # smoke (seconds)
    python bench/diagnose_masking_drift.py --profile tiny --runs outputs/tiny/30_masked_images
    python bench/diagnose_masking_drift.py --profile tiny --reference ood --tag _ood   # distances to the OOD test images instead
    FUSION_NB_ROOT=<copy> FUSION_NB_BUILD_SEED=2 python bench/diagnose_masking_drift.py --profile tiny --runs <copy>/spread/seed2/tiny/30_masked_images --tag _seed2

Finding 4 of experiment 30 is the project's own explanation of an earlier tiny result (multi-fill below no-fill): eq. 2
distils the pre-trained features on the counterfactuals, and a fine-tune stays near the pre-trained features on
*natural* images (its feature drift) only as far as the counterfactuals resemble natural images. It measured each
counterfactual's distance from *its own* image (`counterfactual_distance`), and single-fill's lie further from their
own images than no-fill's (object: 55.6 against 37.3 ×100), yet its fine-tunes drift less. A refilled image is a
mixture of two natural images, so it can lie far from its own image and still near natural images. This script
measures, in the frozen pre-trained feature space, the distance from each counterfactual to the *nearest natural
image* of a reference set (training images the counterfactuals are not built from), for every strategy at the rate /
threshold experiment 30 chose per seed, and sets it beside the drift that run measured (its
`feature_drift_records.csv`, `runs.csv`): a property explains the drift if it orders the strategies as the drift does.
Nothing in the package, the zoo or a method changes; writes bench/diagnose_masking/drift_<profile>.json.
"""
from __future__ import annotations
import argparse, json, sys, time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy import stats

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fusion_nb.evaluation import cached_zeroshot_head
from fusion_nb.masking.cam import ZeroShotLogits, class_cam
from fusion_nb.masking.counterfactual_ft import CounterfactualFT, evaluation_splits, finetune_budget
from fusion_nb.masking.imagenet_data import id_text
from fusion_nb.masking.masks import counterfactual_features, counterfactuals
from fusion_nb.pools import ModelPool, Task, TaskPool
from fusion_nb.reproduce.profiles import load_profile, prepare
from fusion_nb.tiny.finetune import pixel_values

OOD = ['imagenet_v2', 'imagenet_r', 'imagenet_sketch', 'objectnet', 'imagenet_a']


@torch.no_grad()
def features(encoder, zs, x, batch=256)->torch.Tensor:
    "Unit-norm projected image embeddings of natural images."
    return torch.cat([F.normalize(zs.features(encoder(pixel_values=x[i:i + batch]).pooler_output), dim=-1) for i in range(0, len(x), batch)])


def strategy_distances(encoder, zs, x, y, reference, cfg, seed)->dict[str, float]:
    "Mean over images: cosine distance (×100) of x_cf to its own x and to the nearest reference image; masked share; % of x_cf the pre-trained model labels y."
    g, patch = torch.Generator().manual_seed(seed), encoder.config.patch_size
    own, nearest, masked, agrees, n = 0., 0., 0., 0., 0
    for i in range(0, len(x), cfg.batch_size):   # batch by batch, as training builds them (donors come from the batch)
        xb, yb = x[i:i + cfg.batch_size], y[i:i + cfg.batch_size]
        if len(xb) < 2 and cfg.masking != 'none' and cfg.refill != 'none': continue
        rel = class_cam(encoder, zs, xb, yb) if cfg.masking in ('object', 'context') else None
        cf = counterfactuals(xb, patch, cfg.masking, cfg.refill, rel, cfg.threshold, cfg.rate, generator=g)
        with torch.no_grad(): f = F.normalize(counterfactual_features(encoder, zs, cf), dim=-1)
        own += float((1 - (f * features(encoder, zs, xb)).sum(-1)).sum())
        nearest += float((1 - (f @ reference.T).max(-1).values).sum())
        masked += float(cf.mask.float().mean(-1).sum()); n += len(xb)
        agrees += float(((zs.scale * f @ zs.head.T).argmax(-1) == yb).sum())   # eq. 2's target on x_cf names the label CE trains on x
    return {'own_distance': 100 * own / n, 'nearest_natural_distance': 100 * nearest / n, 'masked_share': masked / n,
            'teacher_names_label': 100 * agrees / n}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--profile', default='tiny')
    ap.add_argument('--runs', default=None, help="experiment 30's output folder (default outputs/<profile>/30_masked_images)")
    ap.add_argument('--tag', default='', help='suffix of the output file (e.g. _seed2 for another build)')
    ap.add_argument('--reference', choices=['train', 'ood'], default='train',
                    help="the natural images distances are taken to: the other training images, or the five OOD test sets (where drift is measured)")
    ap.add_argument('--images', type=int, default=512, help="training images whose counterfactuals are measured (experiment 30's why_images)")
    a = ap.parse_args(argv)
    t0, c0 = time.time(), time.process_time()
    P = prepare(load_profile(a.profile, tasks=['imagenet', *OOD]))
    runs_dir = Path(a.runs or REPO/'outputs'/P.name/'30_masked_images')
    runs, drift = pd.read_csv(runs_dir/'runs.csv'), pd.read_csv(runs_dir/'feature_drift_records.csv')
    drift = drift[(drift.metric == 'cosine_distance') & drift.task.isin(OOD)].groupby('model').value.mean()
    picked = runs[runs.model.isin(drift.index) & (runs.method != 'vanilla_ft')]   # table 1's runs (the ones drift was measured on)
    B = finetune_budget(P)
    models = ModelPool(P.pretrained, {}, P.device, P.dtype)
    clip, tok, proc = models.clip, models.tokenizer, models.processor
    train = TaskPool([Task('imagenet', P.datasets['imagenet'], split=P.test_split)])['imagenet'].load('train')
    ID = id_text(P, 'imagenet', train.features['label'].names)
    zs = ZeroShotLogits(clip.visual_projection, clip.logit_scale, cached_zeroshot_head(clip, tok, ID.class_names, ID.templates, device=P.device)).to(P.device).eval()
    enc = clip.vision_model.to(P.device).eval()
    n = min(a.images, len(train) // 2)   # the other half is the reference: natural images no counterfactual is built from
    x, y = pixel_values(proc, train.select(range(n))['image']).to(P.device), torch.tensor(train['label'][:n], device=P.device)
    if a.reference == 'train': ref_images = train.select(range(n, len(train)))['image']
    else:   # the OOD test images experiment 30 measures the drift on
        pool, splits = TaskPool([Task(t, P.datasets[t], split=P.test_split) for t in OOD]), evaluation_splits(OOD, P.test_split, P.extra.get('test_splits'))
        ref_images = [im for t in OOD for im in pool[t].load(splits[t], max_samples=P.max_test_samples, seed=P.seed)['image']]
    reference = features(enc, zs, pixel_values(proc, ref_images).to(P.device))
    fx = features(enc, zs, x)
    natural = {'own_distance': 0., 'nearest_natural_distance': 100 * float((1 - (fx @ reference.T).max(-1).values).mean()), 'masked_share': 0.,
               'teacher_names_label': 100 * float(((zs.scale * fx @ zs.head.T).argmax(-1) == y).float().mean())}
    rows = []
    for r in picked.itertuples():
        h = {} if pd.isna(r.hparam) else {'rate': float(r.hparam)} if r.masking == 'random' else {'threshold': float(r.hparam)}
        cfg = CounterfactualFT(**{**B, 'masking': r.masking, 'refill': r.refill, **h})
        d = natural if r.masking == 'none' else strategy_distances(enc, zs, x, y, reference, cfg, int(r.seed))
        rows.append({'method': r.method, 'seed': int(r.seed), 'hparam': r.hparam, 'drift_ood': float(drift[r.model]), **d})
        print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    PROPS = ['own_distance', 'nearest_natural_distance', 'masked_share', 'teacher_names_label']
    mean = df.groupby('method')[['drift_ood', *PROPS]].mean()
    rho = {c: stats.spearmanr(df[c], df.drift_ood).statistic for c in PROPS}
    rho_mean = {c: stats.spearmanr(mean[c], mean.drift_ood).statistic for c in rho}
    print(mean.round(3).to_string()); print('Spearman rho with drift OOD over runs:', rho, '\nover strategies:', rho_mean)
    out = {'profile': P.name, 'runs': str(runs_dir), 'images': n, 'reference': a.reference, 'reference_images': len(reference), 'per_run': rows,
           'per_strategy': mean.round(4).to_dict(orient='index'), 'spearman_over_runs': rho, 'spearman_over_strategies': rho_mean,
           'seconds': {'wall': round(time.time() - t0), 'cpu': round(time.process_time() - c0)}}
    dest = REPO/'bench'/'diagnose_masking'/f'drift_{P.name}{a.tag}.json'; dest.parent.mkdir(exist_ok=True)
    tmp = dest.with_suffix('.tmp'); tmp.write_text(json.dumps(out, indent=1)); tmp.replace(dest)
    print('wrote', dest, out['seconds'])


if __name__ == '__main__':
    main()
