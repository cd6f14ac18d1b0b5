"""Why WiSE-FT (α = 0.5) loses ID accuracy against vanilla fine-tuning on tiny (issue 48; experiment 31's one failing claim).

    python bench/diagnose_wise_id.py --profile micro                          # smoke (seconds)
    python bench/diagnose_wise_id.py --profile tiny                           # the pins; writes bench/diagnose_masking/wise_id_tiny.json
    python bench/diagnose_wise_id.py --profile tiny --finetune-lr 3e-5 --tag _lr3e-5   # a probe: fine-tuning that leaves ID errors
    FUSION_NB_ROOT=<copy> FUSION_NB_BUILD_SEED=2 python bench/diagnose_wise_id.py --profile tiny --tag _seed2   # another build

Paper 003's Table 3 (CLIP ViT-B/32 on ImageNet) has WiSE-FT at α = 0.5 above vanilla fine-tuning in distribution (76.6
against 75.9; zero-shot 63.4), as WiSE-FT's own paper found. A weight-space ensemble gains in distribution where the
two ends err on different images: the zero-shot model must be right on some of the fine-tuned model's errors, and
mixing must cost fewer of the fine-tuned model's right answers than it fixes. This script measures, per fine-tuning
seed of experiment 31 (vanilla runs read from the cache experiment 30 keeps, else trained as 31 trains them), on the
ID test split and on the five OOD ones pooled: how many images the fine-tuned model gets wrong, how many of those the
zero-shot model gets right, which of them WiSE-FT (α = 0.5) fixes and which right answers it breaks, and the
output-space ensemble of the two ends (mean of their class probabilities) beside it. `--finetune-lr` / `--finetune-epochs`
probe the mechanism with a budget experiment 31 does not use (fine-tuning that leaves the fine-tuned model ID errors).
Nothing in the package changes.
"""
from __future__ import annotations
import argparse, json, os, sys, time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO)); sys.path.insert(0, str(REPO/'bench'))

from fusion_nb.evaluation import cached_zeroshot_head
from fusion_nb.masking.cam import ZeroShotLogits
from fusion_nb.masking.counterfactual_ft import FINETUNE_CACHE, CounterfactualFT, cached_finetune, evaluation_splits, finetune_budget
from fusion_nb.masking.imagenet_data import id_text
from fusion_nb.methods.interpolation import wise_ft
from fusion_nb.pools import ModelPool, Task, TaskPool
from fusion_nb.reproduce.profiles import load_profile, prepare
from fusion_nb.tiny.finetune import pixel_values
from diagnose_masking_drift import OOD, features   # the same five shifts, and unit-norm projected embeddings of natural images


def probabilities(encoder, zs, x)->torch.Tensor:
    "Class probabilities of the zero-shot head on `encoder`'s features (the head experiment 31 scores every row with)."
    return (zs.scale * features(encoder, zs, x) @ zs.head.T).softmax(-1)


def agreement(p_zs, p_ft, p_wise, y)->dict:
    "Counts of images by which ends are right, what WiSE-FT fixes and breaks, and the output ensemble's accuracy (%)."
    zs, ft, wise, ens = (p.argmax(-1) == y for p in (p_zs, p_ft, p_wise, (p_zs + p_ft) / 2))
    pct = lambda m: round(100 * float(m.float().mean()), 2)
    return {'images': len(y), 'ft_wrong': int((~ft).sum()), 'zs_wrong': int((~zs).sum()),
            'zs_right_where_ft_wrong': int((zs & ~ft).sum()), 'ft_right_where_zs_wrong': int((ft & ~zs).sum()),
            'wise_fixes': int((wise & ~ft).sum()), 'wise_breaks': int((~wise & ft).sum()),
            'wise_fixes_where_zs_right': int((wise & ~ft & zs).sum()),
            'accuracy': {'zero_shot': pct(zs), 'vanilla_ft': pct(ft), 'wise_ft_0.5': pct(wise), 'output_ensemble': pct(ens)}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--profile', default='tiny')
    ap.add_argument('--tag', default='', help='suffix of the output file (e.g. _seed2 for another build)')
    ap.add_argument('--finetune-lr', type=float, default=None, help="a probe: vanilla fine-tuning at this learning rate (default the profile's)")
    ap.add_argument('--finetune-epochs', type=int, default=None, help="a probe: vanilla fine-tuning for this many epochs (default the profile's)")
    a = ap.parse_args(argv)
    t0 = time.time()
    P = prepare(load_profile(a.profile, tasks=['imagenet', *OOD]))
    probe = a.finetune_lr is not None or a.finetune_epochs is not None   # a budget experiment 31 does not run: nothing read from or kept in its cache
    B, seeds = finetune_budget(P, finetune_lr=a.finetune_lr, finetune_epochs=a.finetune_epochs), [int(s) for s in str(P.extra.get('finetune_seeds', '0 1 2')).split()]
    models = ModelPool(P.pretrained, {}, P.device, P.dtype)
    clip, tok, proc = models.clip, models.tokenizer, models.processor
    tasks = TaskPool([Task(t, P.datasets[t], split=P.test_split) for t in ['imagenet', *OOD]])
    train = tasks['imagenet'].load('train')
    ID = id_text(P, 'imagenet', train.features['label'].names)
    zs = ZeroShotLogits(clip.visual_projection, clip.logit_scale, cached_zeroshot_head(clip, tok, ID.class_names, ID.templates, device=P.device)).to(P.device).eval()
    splits = evaluation_splits(['imagenet', *OOD], P.test_split, P.extra.get('test_splits'))
    test = {t: tasks[t].load(splits[t], max_samples=P.max_test_samples, seed=P.seed) for t in ['imagenet', *OOD]}
    names = train.features['label'].names   # the tiny OOD sets share the ID classes' names and order (checked)
    for t, d in test.items(): assert d.features['label'].names == names, f'{t}: its classes are not the ID classes in order'
    x = {t: pixel_values(proc, d['image']).to(P.device) for t, d in test.items()}
    y = {t: torch.tensor(d['label'], device=P.device) for t, d in test.items()}
    pre = clip.vision_model.eval()
    pre_sd = {k: v.detach().cpu() for k, v in pre.state_dict().items()}
    p_zs = {t: probabilities(pre, zs, x[t]) for t in x}
    out = {'profile': P.name, 'budget': B, 'build_seed': os.environ.get('FUSION_NB_BUILD_SEED', '0 (the pins)'), 'per_seed': {}}
    for s in seeds:
        ft = cached_finetune(None if probe else P.root/FINETUNE_CACHE, clip, tok, proc, train, ID.class_names, ID.templates,
                             CounterfactualFT(**{**B, 'masking': 'none', 'refill': 'none', 'beta': 0.}), seed=s, device=P.device, progress=False)
        wise = models.vision_model(wise_ft(pre_sd, {'ft': {k: v.detach().cpu() for k, v in ft.encoder.state_dict().items()}}, alpha=0.5, progress=False))
        p_ft = {t: probabilities(ft.encoder.eval(), zs, x[t]) for t in x}
        p_wise = {t: probabilities(wise, zs, x[t]) for t in x}
        cat = lambda p: torch.cat([p[t] for t in OOD])
        out['per_seed'][s] = {'read_from_cache': ft.read, 'id': agreement(p_zs['imagenet'], p_ft['imagenet'], p_wise['imagenet'], y['imagenet']),
                              'ood_pooled': agreement(cat(p_zs), cat(p_ft), cat(p_wise), torch.cat([y[t] for t in OOD]))}
        print(s, json.dumps(out['per_seed'][s]), flush=True)
    out['seconds'] = round(time.time() - t0)
    dest = REPO/'bench'/'diagnose_masking'/f'wise_id_{P.name}{a.tag}.json'; dest.parent.mkdir(exist_ok=True)
    tmp = dest.with_suffix('.tmp'); tmp.write_text(json.dumps(out, indent=1)); tmp.replace(dest)
    print('wrote', dest, out['seconds'], 's')


if __name__ == '__main__':
    main()
