"""Why the CoopVec Map (Table s7) and the transfer (Table s8) of paper 001 do not hold on tiny (issue 48, item 4), measured.

    python bench/diagnose_neulig.py s7 --profile micro                 # smoke
    python bench/diagnose_neulig.py s7 --profile tiny                  # Table s5/s7's Portlands (experiment 10's budget), sample by sample
    python bench/diagnose_neulig.py s7 --profile tiny --steps 400      # the same, trained 5x longer (budget, not method)
    python bench/diagnose_neulig.py s8 --profile tiny --subset 100     # Table s8: model-A vs model-B experts, the transfer on 100 and on all test samples
    python bench/diagnose_neulig.py probe --profile tiny               # dataset identity from Portland's input: train-split fit, test-split score
    python bench/diagnose_neulig.py probe --profile tiny --pretrained DIR   # the same from a candidate pre-trained CLIP (e.g. issue 47's)
    python bench/diagnose_neulig.py cross --profile tiny               # each expert alone on each task (that task's head): the cost of misrouting
    python bench/diagnose_neulig.py cost --profile tiny                # CPU seconds of one Table s8 evaluation on 100 vs all test samples per task
    python bench/diagnose_neulig.py gap --profile tiny                 # Table s5's Gap taken apart: each member's logits on each task, the uniform ensemble and merge
    python bench/diagnose_neulig.py table --profile tiny               # Table s5 as experiment 10 computes it (every baseline, NeuLig in both settings) and the Gap claims' margins
    python bench/diagnose_neulig.py s9 --profile tiny                  # Table s9 as experiment 10 computes it, its Gap claim against `table`'s smallest baseline Gap (run `table` first)
    python bench/diagnose_neulig.py {s7,gap,table,s9} --profile tiny --clip DIR/clip-vit-tiny --experts 'DIR/clip-vit-tiny_{task}' --tag NAME   # a candidate zoo

s7. The CoopVec Map replaces each test sample's CoopVec by its dataset's mean CoopVec (the map row of the sample's
*known* dataset). It can only differ much from per-sample CoopVecs where per-sample CoopVecs differ from their
dataset's mean, i.e. where Portland does not route every sample of a dataset alike; in the paper, per-sample NeuLig
already reaches the experts' own accuracy (Table s5: Mer. 95.43 vs Fine-tuned 95.27), so the map has nothing to add
(Table s7: 95.25, −0.18). Measured here per test sample: the weight on the sample's own expert, whether it is the
largest, and the merged prediction under the per-sample CoopVec, the map row, one-hot own-expert routing (= the
Fine-tuned row) and uniform weights (= Simple Averaging); accuracies split by whether the sample is routed to its own
expert.

s8. Portland's input is the frozen *pre-trained* encoder's features, so a transferred Portland gives every test
sample the same CoopVec over the Bs as over the As: Trans. − Ori. is only the difference between the B and A
experts under the same weights. The claim needs the two halves' experts to be interchangeable. Measured: each half
expert alone on its task (all test samples and experiment 10's 100-sample subsets), one-hot and uniform routing over
As and Bs, and experiment 10's Table s8 rerun (same budget, the pinned half experts of pins/<profile>/neulig_halves)
on the 100-sample subsets and on all test samples, with the binomial standard error of the difference.

gap. Paper 001's ensemble pools logits (Σ wₘ logitsₘ), so under Simple Averaging's uniform weights a task's own expert
must outvote the six others. Measured per task: each member's accuracy, confidence, log-probability of the true class,
logit spread and cosines with the class embeddings; the uniform ensemble with the own expert's logits scaled by 1, 2,
4, 8; the ensemble and the merge with the six others replaced by θ₀.

table. Experiment 10's Table s5 cells (the baselines fused by `fuse`, `merge_ensemble_gap`, NeuLig in both settings, no
CoopVec Map) on the pinned zoo or a candidate's CLIP and experts (bench/neulig_candidate_clip.py, neulig_candidate_experts.py);
on the pins it reproduces experiment 10's claim margins (−0.21, −0.54; Mer. +5.29, +6.43).

Results go to bench/diagnose_neulig/<profile>_<cmd>[_<steps>][_<tag>].json. Nothing in the package, the zoo or a method changes.
"""
from __future__ import annotations
import argparse, json, sys, time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fusion_nb.core import seed_everything
from fusion_nb.evaluation import image_loader
from fusion_nb.methods.data import MergeData, profile_settings
from fusion_nb.neulig.half_zoo import HALVES, HalfZooBudget, half_indices
from fusion_nb.neulig.neulig import epoch_steps, map_diagonal, neulig, train_portland, transfer_portland, visible_count
from fusion_nb.neulig.portland import NeuLigModel, coop_ensemble, expert_logits, merged_logits, merged_pooled
from fusion_nb.pools import PRETRAINED, ModelPool, TaskPool
from fusion_nb.reproduce.profiles import load_profile, prepare
from fusion_nb.tiny.tasks import NEULIG_TASKS
import functools


def setup(profile, experts:str|None=None, clip:str|None=None):
    "The profile, experiment 10's budgets, and the pools; `experts`: a candidate's expert folders ('{task}' replaced), `clip`: its pre-trained CLIP."
    P = prepare(load_profile(profile, tasks=NEULIG_TASKS))
    D = neulig.defaults()
    B = profile_settings(P, {'neulig_steps': D['steps'], 'neulig_lr': D['lr'], 'neulig_batch_size': D['batch_size'],
                             'neulig_scale_steps': 0, 'neulig_data_scales': '0.01 0.05 0.1 0.15 0.2 0.3 0.4 0.6 0.8 1.0', 'neulig_scale_test_samples': -1,
                             'neulig_transfer_epochs': 10, 'neulig_transfer_data_scale': 1.0, 'neulig_transfer_test_samples': -1,
                             'neulig_half_steps': 4000, 'neulig_half_lr': 1e-5, 'neulig_half_batch_size': 32})
    B['neulig_scale_steps'] = B['neulig_scale_steps'] or B['neulig_steps']   # as experiment 10 resolves them
    for k in ('neulig_scale_test_samples', 'neulig_transfer_test_samples'):
        if B[k] < 0: B[k] = P.max_test_samples
    models, tasks = ModelPool.from_profile(P), TaskPool.from_profile(P)
    if experts or clip:
        models = ModelPool(clip or models.pretrained, {t: experts.format(task=t) for t in P.tasks} if experts else models.experts, device=models.device)
    return P, B, models, tasks, MergeData(models, tasks, seed=P.seed, num_workers=P.num_workers)


@torch.no_grad()
def per_sample(model:NeuLigModel, data:MergeData, task:str, max_samples:int, seed:int, routings:dict)->pd.DataFrame:
    "One row per test sample of `task`: own-expert weight, routed-to-own, and correctness of the merge (and ensemble) under each routing."
    k, K, rows = model.names.index(task), len(model.names), []
    head = functools.partial(data.heads, task=task)
    for b in image_loader(data.task_pool[task].load(max_samples=max_samples, seed=seed), data.model_pool.processor, 128):
        x, y = b['pixel_values'], b['label']
        c = model.coopvecs(x).cpu()
        r = {'own_weight': c[:, k].numpy(), 'routed_own': (c.argmax(-1) == k).numpy(), 'max_weight': c.max(-1).values.numpy()}
        el = expert_logits(model, x, head)
        for name, cv in routings.items():
            cv = c if cv is None else cv
            r[f'mer_{name}'] = (merged_logits(model, x, head, cv.to(model.device)).argmax(-1).cpu() == y).numpy()
            r[f'ens_{name}'] = (coop_ensemble(el, cv.to(model.device)).argmax(-1).cpu() == y).numpy()
        rows.append(pd.DataFrame(r))
    return pd.concat(rows, ignore_index=True).assign(task=task)


def routing_summary(df:pd.DataFrame, names)->dict:
    "Averages over tasks (as the tables' Avg.) of the per-sample frame's columns, and the accuracies split by routed-own."
    g = df.groupby('task')
    avg = lambda s: round(100 * float(s.reindex(names).mean()), 2)
    out = {c: avg(g[c].mean()) for c in df.columns if c != 'task'}
    for c in [c for c in df.columns if c.startswith('mer_')]:
        out[f'{c} | routed own'] = round(100 * float(df.loc[df.routed_own, c].mean()), 2)
        out[f'{c} | misrouted'] = round(100 * float(df.loc[~df.routed_own, c].mean()), 2) if (~df.routed_own).any() else None
    out['per task routed_own'] = {t: round(100 * float(v), 1) for t, v in g['routed_own'].mean().reindex(names).items()}
    out['per task mer_per_sample'] = {t: round(100 * float(v), 1) for t, v in g['mer_per_sample'].mean().reindex(names).items()}
    out['per task mer_map'] = {t: round(100 * float(v), 1) for t, v in g['mer_map'].mean().reindex(names).items()}
    return out


def s7(a):
    P, B, models, tasks, data = setup(a.profile, a.experts, a.clip)
    T = list(P.tasks); pre = models.vision_state(PRETRAINED); experts = {t: models.vision_state(t) for t in T}
    steps = a.steps or B['neulig_steps']
    out = {'profile': P.name, 'steps': steps, 'lr': B['neulig_lr'], 'batch_size': B['neulig_batch_size'], 'settings': {}}
    for setting in a.settings:
        t0 = time.process_time()
        m = neulig(pre, experts, data=data, setting=setting, steps=steps, lr=B['neulig_lr'], batch_size=B['neulig_batch_size'], seed=P.seed, progress=False)
        train_s = time.process_time() - t0
        K = len(m.names)
        frames = []
        for t in T:
            onehot = torch.zeros(K); onehot[m.names.index(t)] = 1
            routings = {'per_sample': None, 'map': torch.tensor(m.coopvec_map.loc[t].values, dtype=torch.float32),
                        'own_expert': onehot, 'uniform': torch.full((K,), 1 / K)}
            frames.append(per_sample(m, data, t, P.max_test_samples, P.seed, routings))
        df = pd.concat(frames, ignore_index=True)
        s = routing_summary(df, T)
        s['map_diagonal'] = {t: round(float(v), 3) for t, v in map_diagonal(m.coopvec_map).items()}
        s['map_minus_per_sample (Avg. Mer.)'] = round(s['mer_map'] - s['mer_per_sample'], 2)
        s['epochs'] = round(steps * B['neulig_batch_size'] / min(m.neulig_info['visible'].values()), 2)
        s['train_cpu_seconds'], s['total_cpu_seconds'] = round(train_s), round(time.process_time() - t0)
        out['settings'][setting] = s
        print(setting, json.dumps(s), flush=True)
    # can the frozen pre-trained features tell the datasets apart at all? (experiment 10's linear probe, here on the test samples too)
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score
    X = torch.cat([m.visible_features[t] for t in T]).numpy(); y = [t for t in T for _ in range(len(m.visible_features[t]))]
    out['dataset_probe_cv_accuracy'] = round(100 * float(cross_val_score(LogisticRegression(max_iter=3000), X, y, cv=5).mean()), 2)
    print('dataset probe', out['dataset_probe_cv_accuracy'], flush=True)
    return out


def s8(a):
    P, B, models, tasks, data = setup(a.profile)
    T = list(P.tasks); pre = models.vision_state(PRETRAINED)
    pins = Path(a.halves or REPO/'pins'/P.name/'neulig_halves')
    half_pools = {h: ModelPool(models.pretrained, {t: pins/f'{t}_{h}' for t in T}, device=models.device) for h in HALVES}
    seed_everything(P.seed)
    pair = {h: NeuLigModel(pre, {t: half_pools[h].vision_state(t) for t in T}, models.config).to(models.device) for h in HALVES}
    budget = HalfZooBudget(steps=B['neulig_half_steps'], lr=B['neulig_half_lr'], batch_size=B['neulig_half_batch_size'])
    A_ROWS = {t: half_indices(len(tasks[t].load(split='train')), budget.seed)['A'] for t in T}
    visible = {t: visible_count(len(A_ROWS[t]), B['neulig_transfer_data_scale']) for t in T}
    E = epoch_steps(visible, B['neulig_batch_size'])
    K = len(T)
    subsets = {'subset': B['neulig_transfer_test_samples'] if a.subset is None else a.subset, 'all': 0}
    out = {'profile': P.name, 'halves': str(pins), 'epoch_steps': E, 'epochs': B['neulig_transfer_epochs'], 'visible': visible,
           'test_samples': subsets, 'epoch': {}}

    def evaluate(step):
        res = {}
        for sub, n in subsets.items():
            for h in HALVES:
                frames = []
                for t in T:
                    onehot = torch.zeros(K); onehot[pair[h].names.index(t)] = 1
                    rts = {'per_sample': None, 'own_expert': onehot} if step else {'own_expert': onehot, 'uniform': torch.full((K,), 1 / K), 'per_sample': None}
                    frames.append(per_sample(pair[h], data, t, n, P.seed, rts))
                df = pd.concat(frames, ignore_index=True)
                res[f'{sub}/{h}'] = {c: round(100 * float(df.groupby('task')[c].mean().reindex(T).mean()), 2) for c in df.columns if c.startswith(('mer_', 'ens_'))}
                res[f'{sub}/{h}']['per task mer_own_expert'] = {t: round(100 * float(v), 1) for t, v in df.groupby('task')['mer_own_expert'].mean().reindex(T).items()}
                res[f'{sub}/{h}']['_n'] = int(len(df))
                res[f'{sub}/{h}']['_correct'] = df['mer_per_sample'].astype(int).tolist()   # for the paired SE, dropped below
            ca, cb = np.asarray(res[f'{sub}/A'].pop('_correct')), np.asarray(res[f'{sub}/B'].pop('_correct'))
            # per-task means averaged over K tasks: SE of the Avg. difference from the paired per-sample differences
            d = (cb - ca).astype(float); n_t = len(d) // K
            res[f'{sub}/Trans.-Ori. (Mer.)'] = round(res[f'{sub}/B']['mer_per_sample'] - res[f'{sub}/A']['mer_per_sample'], 2)
            res[f'{sub}/paired SE of Trans.-Ori.'] = round(100 * float(np.sqrt(sum(d[i * n_t:(i + 1) * n_t].var(ddof=1) / n_t for i in range(K)) / K ** 2)), 2)
        return res

    out['epoch'][0] = evaluate(0)   # before training: uniform CoopVecs; and each half expert alone (own_expert)
    print(0, json.dumps(out['epoch'][0]), flush=True)
    t0 = time.process_time()
    def after_step(step):
        if step % E: return
        transfer_portland(pair['A'], pair['B'])
        out['epoch'][step // E] = evaluate(step)
        print(step // E, json.dumps(out['epoch'][step // E]), flush=True)
    train_portland(pair['A'], data, setting='semi-supervised', data_scale=B['neulig_transfer_data_scale'], steps=B['neulig_transfer_epochs'] * E,
                   lr=B['neulig_lr'], batch_size=B['neulig_batch_size'], seed=P.seed, progress=False, after_step=after_step, subsets=A_ROWS)
    out['cpu_seconds'] = round(time.process_time() - t0)
    for sub in subsets:
        diffs = [out['epoch'][e][f'{sub}/Trans.-Ori. (Mer.)'] for e in out['epoch'] if e]
        out[f'largest |Trans.-Ori.| over epochs ({sub})'] = max(abs(x) for x in diffs)
    return out


def probe(a):
    "Can Portland's input (the frozen pre-trained features) tell the seven datasets apart? A logistic regression fitted on the training splits, scored on the test splits."
    from sklearn.linear_model import LogisticRegression
    P, B, models, tasks, data = setup(a.profile)
    T = list(P.tasks)
    if a.pretrained:   # a candidate pre-trained CLIP (e.g. issue 47's): its frozen vision tower is what Portland would read
        from transformers import CLIPVisionModel
        enc = CLIPVisionModel.from_pretrained(str(Path(a.pretrained))).to(models.device).eval()
        encode = lambda x: enc(pixel_values=x.to(models.device)).pooler_output.float()
    else:
        model = NeuLigModel(models.vision_state(PRETRAINED), {t: models.vision_state(t) for t in T}, models.config).to(models.device)
        encode = model.features
    feats = lambda split, n: {t: torch.cat([encode(b['pixel_values']).detach() for b in image_loader(
        data.task_pool[t].load(split=split, max_samples=n, seed=P.seed), data.model_pool.processor, 256)]) for t in T}
    tr, te = feats('train', 0), feats(P.test_split, P.max_test_samples)
    X = lambda f: torch.cat([f[t] for t in T]).numpy(); y = lambda f: np.array([t for t in T for _ in range(len(f[t]))])
    clf = LogisticRegression(max_iter=3000).fit(X(tr), y(tr))
    pred, truth = clf.predict(X(te)), y(te)
    conf = pd.crosstab(pd.Series(truth, name='dataset'), pd.Series(pred, name='predicted'), normalize='index').mul(100).round(1)
    out = {'profile': P.name, 'pretrained': str(a.pretrained or P.pretrained), 'test accuracy': round(100 * float((pred == truth).mean()), 2),
           'per task': {t: round(100 * float((pred[truth == t] == t).mean()), 1) for t in T}, 'confusion (% of row)': conf.to_dict(orient='index')}
    print(json.dumps(out), flush=True)
    return out


def cross(a):
    "Each expert alone on each task's test split, through that task's head: what a sample sent to another dataset's expert gets."
    P, B, models, tasks, data = setup(a.profile)
    T = list(P.tasks)
    model = NeuLigModel(models.vision_state(PRETRAINED), {t: models.vision_state(t) for t in T}, models.config).to(models.device)
    acc = {}
    with torch.no_grad():
        for t in T:
            head, right, n = functools.partial(data.heads, task=t), torch.zeros(len(T)), 0
            for b in image_loader(data.task_pool[t].load(max_samples=P.max_test_samples, seed=P.seed), data.model_pool.processor, 256):
                right += (expert_logits(model, b['pixel_values'], head).argmax(-1).cpu() == b['label']).float().sum(1); n += len(b['label'])
            acc[t] = {e: round(100 * float(r) / n, 1) for e, r in zip(model.names, right)}
    out = {'profile': P.name, 'accuracy (% ; task -> expert)': acc}
    print(pd.DataFrame(acc).T.to_string(), flush=True)
    return out


def cost(a):
    "CPU seconds of one Table s8 evaluation (experiment 10's `neulig_records` over one half's seven experts) at the profile's test subset and at all test samples."
    from fusion_nb.neulig.neulig import neulig_records
    P, B, models, tasks, data = setup(a.profile)
    T = list(P.tasks); pre = models.vision_state(PRETRAINED)
    pins = Path(a.halves or REPO/'pins'/P.name/'neulig_halves')
    pool = ModelPool(models.pretrained, {t: pins/f'{t}_A' for t in T}, device=models.device)
    model = NeuLigModel(pre, {t: pool.vision_state(t) for t in T}, models.config).to(models.device)
    out = {'profile': P.name}
    sub = B['neulig_transfer_test_samples']   # first call: the frozen experts' outputs computed; again: read from FROZEN, as in epochs 2-10
    for label, n in [('subset', sub), ('subset again', sub), ('all', 0), ('all again', 0)]:
        c0 = time.process_time()
        neulig_records(model, data, T, progress=False, batch_size=P.batch_size, max_samples=n, seed=P.seed, num_workers=P.num_workers, autocast=P.autocast)
        out[f'{label} ({n or "all"} per task): cpu seconds'] = round(time.process_time() - c0, 1)
        print(out, flush=True)
    return out

def gap(a):
    "Why the baselines' merges lose little against their ensembles on tiny (Table s5's Gap): each expert's outputs on each task, the uniform ensemble and merge, and their parts."
    import torch.nn.functional as F
    P, B, models, tasks, data = setup(a.profile, a.experts, a.clip)
    T = list(P.tasks); pre = models.vision_state(PRETRAINED)
    model = NeuLigModel(pre, {**{t: models.vision_state(t) for t in T}, 'pretrained': pre}, models.config).to(models.device)
    K, scale = len(T), float(models.clip.logit_scale.detach().exp())
    rows = {}
    with torch.no_grad():
        for t in T:
            head, i = functools.partial(data.heads, task=t), T.index(t)
            sums, n = {}, 0
            add = lambda k, v: sums.__setitem__(k, sums.get(k, 0.) + float(v))
            for b in image_loader(data.task_pool[t].load(max_samples=P.max_test_samples, seed=P.seed), data.model_pool.processor, 256):
                y, L = b['label'], expert_logits(model, b['pixel_values'], head).cpu().float()   # (K+1, batch, classes): the experts, then θ₀
                logp = F.log_softmax(L, -1); others = [k for k in range(K) if k != i]
                right = lambda lp: (lp.argmax(-1) == y).float().sum()
                true = lambda lp: lp.gather(-1, y[..., None].expand(*lp.shape[:-1], 1)).squeeze(-1)
                add('own expert', right(logp[i])); add('pre-trained', right(logp[K])); add('other experts (mean)', right(logp[others]) / len(others))
                add('own: log p(true)', true(logp[i]).sum()); add('others: log p(true)', true(logp[others]).mean(0).sum()); add('pre-trained: log p(true)', true(logp[K]).sum())
                add('own: max p', logp[i].exp().max(-1).values.sum()); add('others: max p', logp[others].exp().max(-1).values.mean(0).sum())
                add('pre-trained: max p', logp[K].exp().max(-1).values.sum())
                add('own: logit sd', L[i].std(-1).sum()); add('others: logit sd', L[others].std(-1).mean(0).sum()); add('pre-trained: logit sd', L[K].std(-1).sum())
                cos = L / scale   # the head's logits are the scale times cosines of the image and class embeddings
                for who, c in (('own', cos[i]), ('pre-trained', cos[K])):
                    add(f'{who}: cos, true class', true(c).sum()); add(f'{who}: cos, mean of classes', c.mean(-1).sum())
                u = torch.zeros(K + 1); u[:K] = 1 / K
                add('Ens. (uniform, Simple Averaging)', right(coop_ensemble(L, u)))
                for k in (2, 4, 8):   # how much larger the own expert's logits must be for the uniform ensemble to keep its accuracy
                    Lk = L.clone(); Lk[i] *= k; add(f'Ens. (uniform), own logits x{k}', right(coop_ensemble(Lk, u)))
                v = u.clone(); v[others] = 0; v[K] = (K - 1) / K   # the others replaced by θ₀: the ensemble if the experts had not forgotten
                add('Ens., others → θ₀', right(coop_ensemble(L, v)))
                add('Mer. (uniform, Simple Averaging)', right(head(merged_pooled(model, b['pixel_values'], u)).cpu()))
                add('Mer., others → θ₀ (own τ at 1/K)', right(head(merged_pooled(model, b['pixel_values'], v)).cpu()))
                n += len(y)
            rows[t] = {k: round((1 if any(w in k for w in ('log p', 'logit sd', 'max p', 'cos')) else 100) * v / n, 3) for k, v in sums.items()}   # accuracies in %
            print(t, json.dumps(rows[t]), flush=True)
    df = pd.DataFrame(rows).T
    df.loc['Avg.'] = df.mean()
    print(df.round(2).T.to_string(), flush=True)
    scale = round(scale, 2)
    print('the CLIP\'s logit scale', scale, flush=True)
    return {'profile': P.name, 'experts': a.experts or 'pinned', 'clip': a.clip or 'pinned', 'logit scale': scale,
            'per task': {t: r for t, r in df.round(3).T.to_dict().items()}}


def table(a):
    "Table s5 (experiment 10's cells: every baseline fused, its Mer. and Ens.; NeuLig in both settings), on the pinned or a candidate's experts."
    from fusion_nb.reproduce.rows import fuse, fusion_settings, paper_rows
    from fusion_nb.reproduce.reports import paper_model, ROW_LABELS
    from fusion_nb.neulig.merge_vs_ensemble import gap_table, merge_ensemble_gap
    from fusion_nb.neulig.neulig import neulig_records
    import tempfile
    P, B, models, tasks, data = setup(a.profile, a.experts, a.clip)
    T = list(P.tasks); pre = models.vision_state(PRETRAINED); experts = {t: models.vision_state(t) for t in T}
    S, EVAL = fusion_settings(P), dict(batch_size=P.batch_size, max_samples=P.max_test_samples, seed=P.seed, num_workers=P.num_workers, autocast=P.autocast)
    rows = paper_rows('001', 's5_', paper_model(P))
    with tempfile.TemporaryDirectory() as tmp:
        fused = {r: fuse(r, pre, experts, data, S, Path(tmp), seed=P.seed, progress=False, paper='001')[0] for r in rows}
    base = merge_ensemble_gap(fused, models, tasks, T, pretrained=pre, experts=experts, progress=False, **EVAL)
    names = {'pretrained': 'Pre-trained', 'finetuned': 'Fine-tuned', **{r: ROW_LABELS[r] for r in rows}}
    parts = [base.assign(method=base['method'].map(names))]
    for setting in a.settings:
        m = neulig(pre, experts, data=data, setting=setting, steps=B['neulig_steps'], lr=B['neulig_lr'], batch_size=B['neulig_batch_size'], seed=P.seed, progress=False)
        r = neulig_records(m, data, T, progress=False, **EVAL)
        parts.append(r.assign(method=f'NeuLig ({setting})', measure=r['level'].map({'merge': 'Mer.', 'ensemble': 'Ens.'}))[base.columns])
    tab = gap_table(pd.concat(parts, ignore_index=True), T)
    avg = tab['Avg.']
    print(tab.xs('Mer.', axis=1, level=1).round(1).to_string(), '\n', avg.round(2).to_string(), flush=True)
    with_ens = [names[r] for r in rows if avg.notna().loc[names[r], 'Ens.']]
    out = {'profile': P.name, 'experts': a.experts or 'pinned', 'Avg.': {k: {m: (None if pd.isna(v) else round(float(v), 2)) for m, v in row.items()} for k, row in avg.iterrows()},
           'per task Mer.': tab.xs('Mer.', axis=1, level=1).round(2).to_dict(), 'per task Ens.': tab.xs('Ens.', axis=1, level=1).round(2).to_dict()}
    for setting in a.settings:
        n = f'NeuLig ({setting})'
        out[f'{n}: smallest baseline Gap minus its Gap'] = round(float(avg.loc[with_ens, 'Gap'].min() - avg.loc[n, 'Gap']), 2)
        out[f'{n}: Mer. minus the best baseline Mer.'] = round(float(avg.loc[n, 'Mer.'] - avg.loc[[names[r] for r in rows], 'Mer.'].max()), 2)
    print(json.dumps({k: v for k, v in out.items() if ':' in k}), flush=True)
    return out


def s9(a):
    "Table s9 as experiment 10 computes it (NeuLig, semi-supervised, at each data scale) and its Gap claim's margin against `table`'s smallest baseline Gap."
    from fusion_nb.neulig.neulig import consistency_table, neulig_records
    P, B, models, tasks, data = setup(a.profile, a.experts, a.clip)
    src = REPO/'bench'/'diagnose_neulig'/f"{P.name}_table{'_' + a.tag if a.tag else ''}.json"
    if not src.exists(): raise SystemExit(f"s9 needs {src.name}: run `table` with the same --tag (and --clip/--experts) first")
    table_run = json.loads(src.read_text())
    if table_run['experts'] != (a.experts or 'pinned'):   # the baselines' gaps must be of this zoo
        raise SystemExit(f"{src.name} was measured on experts {table_run['experts']!r}, not {a.experts or 'pinned'!r}: give the --tag of this zoo's `table` run")
    base = table_run['Avg.']
    base_gap = {k: v['Gap'] for k, v in base.items() if v['Gap'] is not None and not k.startswith('NeuLig')}
    T = list(P.tasks); pre = models.vision_state(PRETRAINED); experts = {t: models.vision_state(t) for t in T}
    EVAL = dict(batch_size=P.batch_size, max_samples=B['neulig_scale_test_samples'], seed=P.seed, num_workers=P.num_workers, autocast=P.autocast)
    runs = []
    for s in [float(x) for x in str(B['neulig_data_scales']).split()]:
        m = neulig(pre, experts, data=data, setting='semi-supervised', data_scale=s, steps=B['neulig_scale_steps'], lr=B['neulig_lr'],
                   batch_size=B['neulig_batch_size'], seed=P.seed, progress=False)
        runs.append(neulig_records(m, data, T, progress=False, **EVAL).assign(row=f'{s:g}'))
    st = consistency_table(pd.concat(runs, ignore_index=True), tasks=T)['Avg.'].T
    print(st.round(2).to_string(), flush=True)
    gaps = st.loc['Gap', [c for c in st.columns if float(c) >= 0.1]]   # the claim: "even at a scale of 0.1"
    least = min(base_gap, key=base_gap.get)
    out = {'profile': P.name, 'experts': a.experts or 'pinned', 'clip': a.clip or 'pinned', 'Table s9': st.round(2).to_dict(),
           'smallest baseline Gap (table)': {least: base_gap[least]}, 'table file': src.name, 'largest Gap at scale >= 0.1': round(float(gaps.max()), 2),
           'Table s9: smallest baseline Gap minus the largest Gap at scale >= 0.1': round(float(base_gap[least] - gaps.max()), 2)}
    print(json.dumps({k: v for k, v in out.items() if k != 'Table s9'}), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('cmd', choices=['s7', 's8', 'cost', 'probe', 'cross', 'gap', 'table', 's9'])
    ap.add_argument('--profile', default='tiny')
    ap.add_argument('--steps', type=int, default=0, help='s7: Portland steps (default: the profile\'s neulig_steps)')
    ap.add_argument('--settings', nargs='*', default=['semi-supervised', 'supervised'])
    ap.add_argument('--pretrained', default=None, help='probe: another pre-trained CLIP folder (a construction candidate)')
    ap.add_argument('--subset', type=int, default=None, help="s8: test samples per task of the 'subset' evaluation (default the profile's neulig_transfer_test_samples; 100 before this issue)")
    ap.add_argument('--experts', default=None, help="s7, gap, table, s9: a candidate's expert folders, '{task}' replaced (bench/neulig_candidate_experts.py)")
    ap.add_argument('--clip', default=None, help="s7, gap, table, s9: a candidate's pre-trained CLIP folder (bench/neulig_candidate_clip.py)")
    ap.add_argument('--tag', default='', help='appended to the JSON file name (s9 reads the table JSON of the same tag)')
    ap.add_argument('--halves', default=None, help='s8: folder of the half experts (default pins/<profile>/neulig_halves)')
    a = ap.parse_args(argv)
    t0, c0 = time.time(), time.process_time()
    out = {'s7': s7, 's8': s8, 'cost': cost, 'probe': probe, 'cross': cross, 'gap': gap, 'table': table, 's9': s9}[a.cmd](a)
    out['seconds'] = {'wall': round(time.time() - t0), 'cpu': round(time.process_time() - c0)}
    dest = REPO/'bench'/'diagnose_neulig'/f"{out['profile']}_{a.cmd}{'_' + str(a.steps) if a.steps else ''}{'_' + Path(a.pretrained).parent.name if a.pretrained else ''}{'_' + a.tag if a.tag else ''}.json"
    dest.parent.mkdir(exist_ok=True); dest.write_text(json.dumps(out, indent=1))
    print('wrote', dest, out['seconds'])


if __name__ == '__main__':
    main()
