"""Why refilling never beats no-fill on the tiny ImageNet stand-in (issue 48, item 3): the properties paper 003's claims need, measured.

    python bench/diagnose_masking.py --profile micro            # smoke (seconds)
    python bench/diagnose_masking.py --profile tiny             # the measurement (one seed, one rate/threshold per strategy)
    python bench/diagnose_masking.py --profile tiny --runs --zoo --tag _zoo   # inference only: zero-shot and the zoo's ImageNet expert
    python bench/diagnose_masking.py --profile tiny --runs vanilla_ft --pretrained DIR --tag _NAME   # P0-P2 on a candidate pre-trained CLIP
    python bench/diagnose_masking.py --profile tiny --object-scale 0.6 --datasets D --tag _cand_NAME   # on a candidate ImageNet stand-in (bench/masking_candidate.py)

Paper 003's mechanism (section 3.1.2, Fig. 3; section 3.2.2, Fig. 4): vanilla fine-tuning learns a spurious
context → label correlation of the ID data, which the OOD shifts break, so it loses OOD accuracy; counterfactual
images that *contradict* the fine-tuning model (its prediction still follows the context, the pre-trained model's
does not) make eq. 2's distillation pull it off the context. Refilling is claimed to help because (a) object-mask
without refilling leaves parts of the object that the pre-trained model still recognises (imperfect masking, no
contradiction), and (b) context-mask without refilling leaves no conflicting context. So the claims need:

  P1  the fine-tuned model relies on the ID context more than the pre-trained one (accuracy with the object on
      its own class's background vs on another class's; accuracy from the background alone, no object);
  P2  that reliance costs it OOD accuracy: vanilla FT loses OOD accuracy against zero-shot (paper: −4.5 points);
  P3  refilling makes counterfactuals that contradict more than no-fill's: on training counterfactuals, how often
      the fine-tuned model still predicts the label while the pre-trained model does not, no-fill vs single-fill;
      and how much of the object CAM object-masking leaves (object masking rate, `masking_metrics`).

Models: zero-shot, the zoo's ImageNet expert (`--zoo`: fine-tuned on the same ID training split by the zoo's recipe), and eq. 2 fine-tunes from this profile's budget (`finetune_*` keys) with seed 0, as experiment 30
runs them: vanilla FT (β = 0), no masking, and {random, context, object} × {no-fill, single-fill} at the middle of
section 4.2's sweeps (rate 0.5, threshold 0.5; experiment 30 picks per seed by validation). Probe images are the ID
test split's generator with the background controlled (`fusion_nb.tiny.tasks` renderers, new seeds): `aligned` (the
class's own background, as 90 % of ID training images), `conflict` (another class's background), `neutral` (a
natural background no ImageNet class owns), `background` (no object; label = the class owning the background).
Writes bench/diagnose_masking/<profile>.json; nothing in the package, the zoo or a method changes.
"""
from __future__ import annotations
import argparse, json, os, sys, time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fusion_nb.masking.cam import ZeroShotLogits, class_cam
from fusion_nb.masking.counterfactual_ft import CounterfactualFT, evaluate_id_ood, finetune_budget, finetune_counterfactual
from fusion_nb.masking.imagenet_data import id_text
from fusion_nb.masking.masks import counterfactual_features, counterfactuals, masking_metrics
from fusion_nb.evaluation import cached_zeroshot_head
from fusion_nb.pools import ModelPool, Task, TaskPool
from fusion_nb.reproduce.profiles import load_profile, prepare
from fusion_nb.tiny import tasks as T
from fusion_nb.tiny.finetune import pixel_values

OOD = ['imagenet_v2', 'imagenet_r', 'imagenet_sketch', 'objectnet', 'imagenet_a']
NEUTRAL = [b for b in T.NATURAL_BGS if b not in T.IMAGENET_BACKGROUNDS]   # backgrounds no ImageNet stand-in class is shown on
# share of each set's images on their own class's background, from `imagenet_scene`'s code (P2's "the shift changes the context")
OWN_BG_SHARE = {'imagenet': T.IMAGENET_CUE, 'imagenet_v2': T.IMAGENET_V2_CUE, 'imagenet_r': 0.4 / 12, 'imagenet_sketch': 0.,
                'objectnet': 0.4 / 12, 'imagenet_a': 0.}
RUNS = {'vanilla_ft': dict(masking='none', refill='none', beta=0.), 'ours:none': dict(masking='none', refill='none'),
        **{f'ours:{m}:{r}': dict(masking=m, refill=r) for m in ('random', 'context', 'object') for r in ('none', 'single')}}


def probe_images(kind:str, n:int, seed:int=4803)->tuple[list, list, list]:
    "(images, labels, background owners) of a probe set: the ID renderer with the background chosen by `kind`."
    names, k = list(T.IMAGENET_SPRITES), len(T.IMAGENET_SPRITES)
    ims, ys, owners = [], [], []
    for i in range(n):
        rng, y = np.random.default_rng([seed, ['aligned', 'conflict', 'neutral', 'background'].index(kind), i]), i % k
        if kind == 'aligned': bg, owner = T.IMAGENET_BACKGROUNDS[y], y
        elif kind == 'conflict': owner = T._other(rng, y, k); bg = T.IMAGENET_BACKGROUNDS[owner]
        elif kind == 'neutral': bg, owner = NEUTRAL[int(rng.integers(len(NEUTRAL)))], -1
        else: bg, owner = T.IMAGENET_BACKGROUNDS[y], y
        if kind == 'background': im = T._finish(Image.fromarray(np.clip(T.BACKGROUNDS[bg](rng), 0, 255).astype(np.uint8)), rng, 0.35, 5.)
        else: im = T._object_scene(rng, T.IMAGENET_SPRITES[names[y]], bg, size=(16, 26), angle=15)[0]
        ims.append(im); ys.append(y); owners.append(owner)
    return ims, ys, owners


def scene_backgrounds(task:str, split:str, n:int, seed:int=0)->list:
    "The background each image of a built ImageNet-family split was rendered on (its renderer replayed, `_object_scene` watched)."
    seen, real = [], T._object_scene
    def watch(rng, sprite, bg_name, **kw): seen.append(bg_name); return real(rng, sprite, bg_name, **kw)
    T._object_scene = watch
    try:
        out = []
        for i in range(n):
            seen.clear(); T.imagenet_scene(T._rng(seed, task, split, i), i % len(T.IMAGENET_CLASSES), task)
            out.append(seen[0] if seen else None)
        return out
    finally: T._object_scene = real


@torch.no_grad()
def predict(encoder, zs, x, batch=256)->torch.Tensor:
    return torch.cat([zs(encoder(pixel_values=x[i:i + batch]).pooler_output).argmax(-1) for i in range(0, len(x), batch)])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--profile', default='tiny'); ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--probe', type=int, default=0, help='images per probe set (default: the ID test split size)')
    ap.add_argument('--cf_images', type=int, default=256, help='training images whose counterfactuals P3 measures')
    ap.add_argument('--runs', nargs='*', default=list(RUNS), help='eq. 2 fine-tunes to train (none: inference only)')
    ap.add_argument('--zoo', action='store_true', help="also the zoo's ImageNet expert (the profile's expert_template): a fine-tune that costs nothing here")
    ap.add_argument('--tag', default='', help='suffix of the output file')
    ap.add_argument('--by_background', action='store_true', help='accuracy on the ID and IN-V2 test images split by own / other background')
    ap.add_argument('--pretrained', default=None, help="another pre-trained CLIP folder (a construction candidate, e.g. issue 47's); default the profile's")
    ap.add_argument('--datasets', default=None, help='a folder of candidate ImageNet-family datasets (bench/masking_candidate.py); default the profile\'s')
    ap.add_argument('--object-jitter', type=float, default=None, help='the candidate renderer\'s centre jitter (bench/masking_candidate.py)')
    ap.add_argument('--cue', type=float, default=None, help="the candidate's share of ID images on their own background (bench/masking_candidate.py)")
    ap.add_argument('--object-scale', type=float, default=None, help='the candidate renderer of bench/masking_candidate.py (probes and object masks follow it); give it with --datasets')
    a = ap.parse_args(argv)
    if (a.object_jitter is not None or a.cue is not None) and a.object_scale is None: ap.error('--object-jitter and --cue need --object-scale and --datasets')
    if (a.datasets is None) != (a.object_scale is None): ap.error('--datasets and --object-scale go together (the probes and object masks must come from the renderer that built the datasets)')
    if a.object_scale is not None:
        from masking_candidate import object_scale
        with object_scale(a.object_scale, a.object_jitter, a.cue): return run(a)
    return run(a)


def run(a):
    t_start, c_start = time.time(), time.process_time()
    P = prepare(load_profile(a.profile, tasks=['imagenet', *OOD]))
    if a.datasets:
        from dataclasses import replace
        P = replace(P, datasets={t: str(Path(a.datasets)/t) for t in ['imagenet', *OOD]})
    B = finetune_budget(P)
    models = ModelPool(a.pretrained or P.pretrained, {}, P.device, P.dtype)
    tasks = TaskPool([Task(t, P.datasets[t], split=P.test_split) for t in ['imagenet', *OOD]])
    clip, tok, proc = models.clip, models.tokenizer, models.processor
    train = tasks['imagenet'].load('train')
    ID = id_text(P, 'imagenet', train.features['label'].names)
    test_sets = {t: tasks[t].load(P.test_split, max_samples=P.max_test_samples, seed=P.seed) for t in ['imagenet', *OOD]}
    head = cached_zeroshot_head(clip, tok, ID.class_names, ID.templates, device=P.device)
    zs = ZeroShotLogits(clip.visual_projection, clip.logit_scale, head).to(P.device).eval()
    out = {'profile': P.name, 'pretrained': str(a.pretrained or P.pretrained), 'datasets': a.datasets, 'object_scale': a.object_scale, 'object_jitter': a.object_jitter, 'cue': a.cue, 'seed': a.seed, 'budget': B, 'neutral_backgrounds': NEUTRAL, 'own_background_share': {**OWN_BG_SHARE, 'imagenet': T.IMAGENET_CUE}, 'runs': {}}   # the ID share read at run time: a candidate's --cue

    encoders, seconds = {'zero_shot': clip.vision_model.eval()}, {}
    for name in a.runs:
        t0 = time.process_time()
        cfg = CounterfactualFT(**{**B, **RUNS[name], 'threshold': 0.5, 'rate': 0.5})
        encoders[name] = finetune_counterfactual(clip, tok, proc, train, ID.class_names, ID.templates, cfg, seed=a.seed, device=P.device, progress=False).encoder.eval()
        seconds[name] = time.process_time() - t0
        print(f'{name}: fine-tuned in {seconds[name]:.0f} s CPU', flush=True)
    out['finetune_cpu_seconds'] = seconds
    if a.zoo:   # the benchmark's ImageNet expert: fine-tuned on the same ID training split by the zoo's recipe (fusion_nb.tiny.zoo)
        from transformers import CLIPVisionModel
        encoders['zoo_imagenet_expert'] = CLIPVisionModel.from_pretrained(P.experts['imagenet']).to(P.device).eval()

    # accuracies on the real test sets (as experiment 30 evaluates them)
    rec = evaluate_id_ood(encoders, clip, tok, proc, test_sets, ID.class_names, ID.templates, device=P.device, progress=False,
                          id_wnids=ID.wnids, id_aliases=ID.aliases)
    acc = rec.pivot_table(index='model', columns='task', values='value') * 100
    acc['ood_avg'] = acc[OOD].mean(axis=1)
    # P1: probes with the background controlled
    n = a.probe or len(test_sets['imagenet'])
    probes = {k: probe_images(k, n) for k in ('aligned', 'conflict', 'neutral', 'background')}
    px = {k: pixel_values(proc, v[0]).to(P.device) for k, v in probes.items()}
    for name, enc in encoders.items():
        r = {'test': {t: round(float(acc.loc[name, t]), 2) for t in acc.columns}}
        for k, (_, ys, owners) in probes.items():
            pred = predict(enc, zs, px[k]).cpu().numpy()
            r[k] = round(100 * float((pred == np.asarray(ys)).mean()), 2)
            if k == 'conflict': r['conflict_follows_background'] = round(100 * float((pred == np.asarray(owners)).mean()), 2)
        r['context_reliance'] = round(r['aligned'] - r['conflict'], 2)   # points lost when the background is another class's
        out['runs'][name] = r
        print(name, json.dumps(r), flush=True)

    if a.by_background:   # P1 on the real test sets: the images on their class's background vs on another's
        out['by_background'] = {}
        for t in ('imagenet', 'imagenet_v2'):
            ds = test_sets[t]; bgs = scene_backgrounds(t, P.test_split, len(ds))
            own = np.array([b == T.IMAGENET_BACKGROUNDS[y] for b, y in zip(bgs, ds['label'])])
            check = pixel_values(proc, [T.imagenet_scene(T._rng(0, t, P.test_split, 0), 0, t)[0]])
            assert torch.allclose(check, pixel_values(proc, [ds[0]['image']])), f'{t}: the replayed renderer does not give the built test images'
            x, y = pixel_values(proc, ds['image']).to(P.device), np.asarray(ds['label'])
            for name, enc in encoders.items():
                ok = predict(enc, zs, x).cpu().numpy() == y
                out['by_background'].setdefault(name, {})[t] = {'own background share': round(float(own.mean()), 3), 'own': round(100 * float(ok[own].mean()), 2),
                                                             'other': round(100 * float(ok[~own].mean()), 2), 'gap': round(100 * float(ok[own].mean() - ok[~own].mean()), 2)}
            print(t, {m: v[t] for m, v in out['by_background'].items()}, flush=True)

    # P3: contradictions on training counterfactuals (CAM of the fine-tuning model: vanilla FT's, as mid-training)
    tuned = 'vanilla_ft' if 'vanilla_ft' in encoders else 'zoo_imagenet_expert' if 'zoo_imagenet_expert' in encoders else None
    out['counterfactuals_finetuned_model'] = tuned
    if tuned and a.cf_images:
        m = min(a.cf_images, len(train))
        x, y = pixel_values(proc, train.select(range(m))['image']).to(P.device), torch.tensor(train['label'][:m], device=P.device)
        obj = torch.as_tensor(T.object_masks('imagenet', 'train', P.name)[:m]) if P.name in T.SCALES else None   # exact object pixels
        ft, pre, patch = encoders[tuned], encoders['zero_shot'], clip.config.vision_config.patch_size
        p3 = {}
        for masking in ('none', 'random', 'context', 'object'):
            for refill in (('none',) if masking == 'none' else ('none', 'single', 'multi')):   # none:none: the natural images
                g = torch.Generator(device='cpu').manual_seed(a.seed)
                ok_pre, ok_ft, contra, contra_pre, differ, metrics = 0, 0, 0, 0, 0, []
                for i in range(0, m, B['batch_size']):
                    xb, yb = x[i:i + B['batch_size']], y[i:i + B['batch_size']]
                    rel = class_cam(ft, zs, xb, yb) if masking in ('object', 'context') else None
                    cf = counterfactuals(xb, patch, masking, refill, rel, 0.5, 0.5, generator=g)
                    with torch.no_grad():
                        pp = (zs.scale * torch.nn.functional.normalize(counterfactual_features(pre, zs, cf), dim=-1) @ zs.head.T).argmax(-1)
                        pf = (zs.scale * torch.nn.functional.normalize(counterfactual_features(ft, zs, cf), dim=-1) @ zs.head.T).argmax(-1)
                    ok_pre += int((pp == yb).sum()); ok_ft += int((pf == yb).sum()); contra += int(((pf == yb) & (pp != yb)).sum())
                    contra_pre += int(((pp == yb) & (pf != yb)).sum()); differ += int((pp != pf).sum())
                    if obj is not None: metrics.append((masking_metrics(cf.mask.cpu(), obj[i:i + B['batch_size']], patch), len(xb)))
                mm = {k: round(float(sum(d[k] * w for d, w in metrics) / sum(w for _, w in metrics)), 3) for k in metrics[0][0]} if metrics else {}
                p3[f'{masking}:{refill}'] = {'pretrained_acc': round(100 * ok_pre / m, 2), 'finetuned_acc': round(100 * ok_ft / m, 2),
                                             'contradiction': round(100 * contra / m, 2),   # Fig. 3 (c, f): the fine-tuned model keeps the label, the pre-trained one does not
                                             'contradiction_pretrained_right': round(100 * contra_pre / m, 2),   # Fig. 3 (b, e): the context misleads the fine-tuned model
                                             'predictions_differ': round(100 * differ / m, 2), **mm}
                print(masking, refill, p3[f'{masking}:{refill}'], flush=True)
        out['counterfactuals'] = p3
    out['seconds'] = {'wall': round(time.time() - t_start), 'cpu': round(time.process_time() - c_start)}
    dest = REPO/'bench'/'diagnose_masking'/f'{P.name}{a.tag}.json'; dest.parent.mkdir(exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    print('wrote', dest, out['seconds'])


if __name__ == '__main__':
    main()
