#!/usr/bin/env python
"""Why paper 000's test-time rows fall short on the tiny benchmark (issue 47, item 1): four diagnoses, one subcommand each.

    python bench/diagnose_paper000.py wemoe     # WE-MoE: oracle routing (each image to its own task's expert) vs trained routers,
                                                # and where each expert's knowledge sits (MLP / attention / other tensors)
    python bench/diagnose_paper000.py entropy   # AdaMerging's premise: does prediction entropy rank merged models as their error does?
    python bench/diagnose_paper000.py experts   # zero-shot vs chance, experts, task arithmetic normalised; task vectors by kind,
                                                # by layer, and their cosines; beside paper 000's B/32 numbers
    python bench/diagnose_paper000.py spread    # which rows of experiment 04 move between the three builds (the saved spread file)
    python bench/diagnose_paper000.py ties      # TIES's premises: the top 20 % of each task vector keeps its task; sign conflicts;
                                                # TIES's steps apart (trim only, elect only) at paper 000's λ = 0.3, and a λ sweep

Options: --profile (default tiny), --max-test-samples N (a seeded subset of each test split; default 0: the whole split,
400 images per task on tiny), --threads (torch threads, default 1). Every accuracy here is computed in this run from the
built benchmark (data/<profile>) with the frozen zero-shot heads the experiments use; nothing is trained except
WE-MoE's routers in `wemoe` (the profile's budget and seed, exactly as experiment 04's row). Numbers are in percent.
"""
from __future__ import annotations
import argparse, math, os, sys, time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fusion_nb.reproduce.profiles import load_profile, prepare
from fusion_nb.pools import ModelPool, TaskPool, PRETRAINED
from fusion_nb.evaluation import image_loader
from fusion_nb.methods.data import MergeData
from fusion_nb.reproduce.rows import fusion_settings, fuse

pd.set_option('display.width', 250); pd.set_option('display.max_columns', 40); pd.set_option('display.max_rows', 200)
ROOT = Path(__file__).resolve().parents[1]
B32 = 'clip-vit-b32'


def kind(key:str)->str:
    "Which part of a CLIP vision encoder a tensor belongs to: attention, mlp, layer_norm or embeddings."
    if '.mlp.' in key: return 'mlp'
    if 'self_attn' in key: return 'attention'
    if 'layer_norm' in key or 'layrnorm' in key or 'layernorm' in key: return 'layer_norm'
    return 'embeddings'

def layer(key:str)->str:
    "The block a tensor sits in: 'embeddings' (with the pre-LN), 'layer i', or 'post_layernorm'."
    if 'encoder.layers.' in key: return f"layer {int(key.split('encoder.layers.')[1].split('.')[0])}"
    return 'post_layernorm' if 'post_layernorm' in key else 'embeddings'


class Bench:
    "The profile's pool, heads, test images and weights, loaded once."
    def __init__(self, profile:str, max_test_samples:int):
        t0 = time.time()
        self.P = P = prepare(load_profile(profile, max_test_samples=max_test_samples))
        self.models, self.tasks = ModelPool.from_profile(P), TaskPool.from_profile(P)
        self.data = MergeData(self.models, self.tasks, seed=P.seed, max_test_samples=P.max_test_samples)
        self.names = list(P.tasks)
        self.pre = {k: v.float() for k, v in dict(self.models.vision_state(PRETRAINED)).items()}
        self.experts = {t: {k: v.float() for k, v in dict(self.models.vision_state(t)).items()} for t in self.names}
        self.tau = {t: {k: e[k] - self.pre[k] for k in self.pre} for t, e in self.experts.items()}
        self.pixels, self.labels = {}, {}
        for t in self.names:   # the same split, subset and order as `fusion_nb.evaluation.evaluate`
            ds = self.tasks[t].load(P.test_split, max_samples=P.max_test_samples, seed=P.seed)
            px, lb = zip(*[(b['pixel_values'], b['label']) for b in image_loader(ds, self.models.processor, batch_size=256)])
            self.pixels[t], self.labels[t] = torch.cat(px), torch.cat(lb)
        n = {t: len(v) for t, v in self.labels.items()}
        print(f"# profile {P.name}: {len(self.names)} tasks, test images per task {sorted(set(n.values()))}, "
              f"torch threads {torch.get_num_threads()}, loaded in {time.time() - t0:.0f} s")

    @torch.no_grad()
    def logits(self, task:str, params:dict|None=None, encoder=None, batch_size:int=400)->torch.Tensor:
        "Logits of `task`'s test images under weights `params` (through the pool's encoder) or a module `encoder`."
        x, out = self.pixels[task], []
        for i in range(0, len(x), batch_size):
            xb = x[i:i + batch_size]
            if encoder is not None: pooled = encoder(pixel_values=xb).pooler_output
            else: pooled = functional_call(self.data.encoder, params, args=(), kwargs={'pixel_values': xb}, strict=False).pooler_output
            out.append(self.data.heads(pooled, task))
        return torch.cat(out)

    def accuracy(self, task:str, params:dict|None=None, encoder=None, batch_size:int=400)->float:
        return 100 * float((self.logits(task, params, encoder, batch_size).argmax(-1) == self.labels[task]).float().mean())

    def merged(self, coef)->dict:
        "θ₀ + Σ_k λ_k τ_k with `coef(task, key)` the coefficient of task k on tensor `key`."
        return {k: self.pre[k] + sum(coef(t, k) * self.tau[t][k] for t in self.names) for k in self.pre}

    def swapped(self, task:str, kinds)->dict:
        "θ₀ with `task`'s expert tensors of the given kinds swapped in."
        return {k: (self.experts[task][k] if kind(k) in kinds else self.pre[k]) for k in self.pre}


def paper_b32(root:Path=ROOT)->pd.DataFrame:
    "Paper 000's B/32 eight-task table: method × task (and 'Avg.')."
    v = pd.read_csv(root/'data'/'paper_values'/'paper000.csv', dtype={'paper': str})
    v = v[(v.model == B32) & v.table.str.startswith('multi_task') & (v.metric == 'accuracy')]
    return v.pivot_table(index='method', columns='task', values='value')


# ---------------------------------------------------------------------------------------------------------------- a. WE-MoE
class FixedRouter(torch.nn.Module):
    "A router that outputs the same routing weights for every token of every image (the oracle)."
    def __init__(self, weights:torch.Tensor): super().__init__(); self.register_buffer('w', weights.float())
    def forward(self, h): return self.w.expand(*h.shape[:-1], -1)

def cmd_wemoe(B:Bench):
    P, names = B.P, B.names
    S = fusion_settings(P)
    t0 = time.time()
    moe, _ = fuse('weight_ensembling_moe', B.pre, B.experts, B.data, S, None, seed=P.seed, progress=False)
    print(f"# routers trained as experiment 04's row: {S['wemoe_steps']} steps, lr {S['wemoe_lr']}, {S['tta_batch_size']} images "
          f"per task per step, seed {P.seed} ({time.time() - t0:.0f} s)")
    moe.eval()
    layers = (moe.vision_model if hasattr(moe, 'vision_model') else moe).encoder.layers
    rows, routing = {}, {}
    for i, t in enumerate(names):
        r = {}
        r['expert'] = B.accuracy(t, B.experts[t])
        moe.set_routing('sample'); r['per-sample routing (ours)'] = B.accuracy(t, encoder=moe, batch_size=P.batch_size)
        moe.set_routing('batch'); r['batch routing (FusionBench, leaky)'] = B.accuracy(t, encoder=moe, batch_size=P.batch_size)
        moe.set_routing('sample')
        w = moe.routing_weights(B.pixels[t])   # (images, layers, experts)
        routing[t] = {'mean r, own expert': float(w[..., i].mean()), 'mean r, other experts': float(w.mean(-1).mean() * 8 / 7 - w[..., i].mean() / 7),
                      'own expert largest (%)': 100 * float((w.mean(1).argmax(-1) == i).float().mean())}
        saved = [l.mlp.router for l in layers]
        for scale in (1.0,):   # oracle: every MLP is exactly expert t's (r = one-hot), every other tensor task arithmetic at 0.3
            for l in layers: l.mlp.router = FixedRouter(scale * torch.nn.functional.one_hot(torch.tensor(i), len(names)))
            r['oracle one-hot (TA 0.3 elsewhere)'] = B.accuracy(t, encoder=moe)
        for l, s in zip(layers, saved): l.mlp.router = s
        r['oracle one-hot, θ₀ elsewhere'] = B.accuracy(t, B.swapped(t, {'mlp'}))
        r['task arithmetic 0.3'] = B.accuracy(t, B.merged(lambda _t, _k: 0.3))
        rows[t] = r
    table = pd.DataFrame(rows).T
    table.loc['Avg.'] = table.mean()
    print('\n## a1. WE-MoE: trained routers vs oracle routing, accuracy (%) per task')
    print(table.round(1).to_string())
    rt = pd.DataFrame(routing).T; rt.loc['Avg.'] = rt.mean()
    print('\n## a2. What the trained routers output per sample (routing weights over 4 layers; init 0.3 each)')
    print(rt.round(3).to_string())
    loc = {}
    for t in names:
        loc[t] = {'pretrained': B.accuracy(t, B.pre),
                  'θ₀ + expert MLP': B.accuracy(t, B.swapped(t, {'mlp'})),
                  'θ₀ + expert attention': B.accuracy(t, B.swapped(t, {'attention'})),
                  'θ₀ + expert embeddings+LN': B.accuracy(t, B.swapped(t, {'embeddings', 'layer_norm'})),
                  'expert without its MLP': B.accuracy(t, B.swapped(t, {'attention', 'embeddings', 'layer_norm'})),
                  'expert': B.accuracy(t, B.experts[t])}
    lt = pd.DataFrame(loc).T; lt.loc['Avg.'] = lt.mean()
    print("\n## a3. Where each expert's knowledge sits: θ₀ with one kind of the expert's tensors swapped in, accuracy (%)")
    print(lt.round(1).to_string())
    gain = lt.sub(lt['pretrained'], axis=0).div(lt['expert'] - lt['pretrained'], axis=0).drop(columns=['pretrained', 'expert'])
    print("\n   the same as a fraction of the expert's gain over θ₀ (1 = all of it)")
    print(gain.round(2).to_string())


# ------------------------------------------------------------------------------------------------------------- b. entropy
def entropies(logits:torch.Tensor)->torch.Tensor:
    logp = torch.log_softmax(logits.float(), -1)
    return -(logp.exp() * logp).sum(-1)

def cmd_entropy(B:Bench, n_taskwise:int=12, n_layerwise:int=12):
    from scipy.stats import spearmanr
    names, keys = B.names, list(B.pre)
    g = torch.Generator().manual_seed(B.P.seed)
    candidates = {f'TA λ={l:.1f}': (lambda l: lambda t, k: l)(l) for l in np.round(np.arange(0, 1.01, 0.1), 1)}
    for j in range(n_taskwise):   # task-wise: one λ per task, U(0, 1)
        lam = dict(zip(names, torch.rand(len(names), generator=g).tolist()))
        candidates[f'task-wise #{j}'] = (lambda lam: lambda t, k: lam[t])(lam)
    for j in range(n_layerwise):  # layer-wise (AdaMerging's granularity: one λ per task and tensor), U(0, 0.6)
        lam = {(t, k): float(x) for (t, k), x in zip([(t, k) for t in names for k in keys], 0.6 * torch.rand(len(names) * len(keys), generator=g))}
        candidates[f'layer-wise #{j}'] = (lambda lam: lambda t, k: lam[(t, k)])(lam)
    t0 = time.time()
    recs, per_sample = [], {}
    for name, coef in candidates.items():
        params = B.merged(coef)
        for t in names:
            lg = B.logits(t, params)
            h = entropies(lg)
            recs.append(dict(model=name, task=t, entropy=float(h.mean()), error=100 * float((lg.argmax(-1) != B.labels[t]).float().mean())))
            if name == 'TA λ=0.3':
                loss = torch.nn.functional.cross_entropy(lg, B.labels[t], reduction='none')
                per_sample[t] = spearmanr(h.numpy(), loss.numpy())[0]
    df = pd.DataFrame(recs)
    print(f"# {len(candidates)} merged models × {len(names)} tasks in {time.time() - t0:.0f} s: task arithmetic λ ∈ 0.0…1.0, "
          f"{n_taskwise} random task-wise λ ~ U(0,1), {n_layerwise} random layer-wise λ (per task and tensor) ~ U(0,0.6); seed {B.P.seed}")
    out = {}
    for t in names:
        d = df[df.task == t]; ta = d[d.model.str.startswith('TA')]
        out[t] = {'ρ all models': spearmanr(d.entropy, d.error)[0], 'ρ TA grid': spearmanr(ta.entropy, ta.error)[0],
                  'ρ per sample (TA 0.3, entropy vs loss)': per_sample[t],
                  'error range (pts)': d.error.max() - d.error.min(), 'entropy range (nats)': d.entropy.max() - d.entropy.min()}
    o = pd.DataFrame(out).T
    tot = df.groupby('model').agg(entropy=('entropy', 'sum'), error=('error', 'mean'))
    ta = tot[tot.index.str.startswith('TA')]
    o.loc['8-task objective (Σ entropy vs mean error)'] = {'ρ all models': spearmanr(tot.entropy, tot.error)[0], 'ρ TA grid': spearmanr(ta.entropy, ta.error)[0],
                                                          'error range (pts)': tot.error.max() - tot.error.min(), 'entropy range (nats)': tot.entropy.max() - tot.entropy.min()}
    print('\n## b1. Spearman ρ between mean prediction entropy on the unlabelled test images and the error, across merged models (per task)')
    print(o.round(2).to_string())
    pick = pd.DataFrame({'lowest Σ entropy': [tot.entropy.idxmin(), 100 - tot.loc[tot.entropy.idxmin(), 'error']],
                         'lowest error': [tot.error.idxmin(), 100 - tot.error.min()],
                         'TA grid, lowest Σ entropy': [ta.entropy.idxmin(), 100 - ta.loc[ta.entropy.idxmin(), 'error']],
                         'TA grid, lowest error': [ta.error.idxmin(), 100 - ta.error.min()]}, index=['model', 'avg. accuracy (%)']).T
    print('\n## b2. What the entropy would pick among these models (the objective AdaMerging minimises) vs the best by accuracy')
    print(pick.to_string())
    grid = df[df.model.str.startswith('TA')].pivot(index='model', columns='task', values='error')
    grid['Avg.'] = grid.mean(axis=1); grid['Σ entropy'] = df[df.model.str.startswith('TA')].groupby('model').entropy.sum()
    print('\n## b3. Task arithmetic grid: error (%) per task, and the 8-task entropy')
    print(grid.round(2).to_string())


# ------------------------------------------------------------------------------------------------------------- c. experts
def b32_shares()->dict:
    "Parameter counts by kind of CLIP ViT-B/32's vision encoder (hidden 768, 12 layers, MLP 3072, patch 32, 50 tokens)."
    d, L, m = 768, 12, 3072
    return {'attention': L * 4 * (d * d + d), 'mlp': L * (2 * d * m + m + d), 'layer_norm': L * 4 * d + 4 * d,
            'embeddings': 3 * 32 * 32 * d + 50 * d + d}

def ratio(a:float, b:float)->float:
    "100 a / b, NaN where b is 0 (an expert no better than zero-shot, as on micro)."
    return 100 * a / b if b else float('nan')

def cmd_experts(B:Bench):
    names, pre = B.names, B.pre
    paper = paper_b32()
    ta = B.merged(lambda t, k: 0.3)
    rows = {}
    for t in names:
        z, e, a = B.accuracy(t, pre), B.accuracy(t, B.experts[t]), B.accuracy(t, ta)
        c = 100 / len(B.tasks[t].class_names)
        rows[t] = {'classes': len(B.tasks[t].class_names), 'chance': c, 'zero-shot': z, 'zero-shot − chance': z - c, 'expert': e,
                   'TA 0.3': a, 'TA normalised (TA/expert)': ratio(a, e), 'TA gain share ((TA−zs)/(exp−zs))': ratio(a - z, e - z),
                   'B/32 zero-shot': paper.loc['pretrained', t], 'B/32 expert': paper.loc['finetuned', t], 'B/32 TA 0.3': paper.loc['task_arithmetic', t],
                   'B/32 TA normalised': 100 * paper.loc['task_arithmetic', t] / paper.loc['finetuned', t],
                   'B/32 TA gain share': 100 * (paper.loc['task_arithmetic', t] - paper.loc['pretrained', t]) / (paper.loc['finetuned', t] - paper.loc['pretrained', t])}
    df = pd.DataFrame(rows).T; df.loc['Avg.'] = df.mean()
    print('\n## c1. Zero-shot vs chance, experts, task arithmetic (λ = 0.3) normalised; B/32 from paper 000\'s eight-task table')
    print(df.round(1).to_string())
    keys = list(pre)
    kinds = ['attention', 'mlp', 'layer_norm', 'embeddings']
    sq = {t: {k: float(B.tau[t][k].double().pow(2).sum()) for k in keys} for t in names}
    byk = pd.DataFrame({t: {kd: sum(v for k, v in s.items() if kind(k) == kd) / sum(s.values()) for kd in kinds} for t, s in sq.items()}).T
    count = {kd: sum(pre[k].numel() for k in keys if kind(k) == kd) for kd in kinds}; n = sum(count.values())
    b = b32_shares(); nb = sum(b.values())
    rel = pd.DataFrame({t: {kd: math.sqrt(sum(v for k, v in s.items() if kind(k) == kd) / sum(float(pre[k].double().pow(2).sum()) for k in keys if kind(k) == kd))
                            for kd in kinds} for t, s in sq.items()}).T
    k_tab = pd.DataFrame({'‖τ‖² share, mean of experts': byk.mean(), '  min': byk.min(), '  max': byk.max(),
                          '‖τ‖/‖θ₀‖ (mean of experts)': rel.mean(), 'parameter share, tiny': pd.Series(count) / n,
                          'parameter share, B/32': pd.Series(b) / nb})
    print(f"\n## c2. Task vectors by kind of tensor (tiny: {n:,} vision parameters; B/32: {nb:,})")
    print(k_tab.round(3).to_string())
    print('\n   ‖τ‖² share by kind, per expert'); print(byk.round(3).to_string())
    blocks = list(dict.fromkeys(layer(k) for k in keys))
    byl = pd.DataFrame({t: {bl: sum(v for k, v in s.items() if layer(k) == bl) / sum(s.values()) for bl in blocks} for t, s in sq.items()}).T
    byl.loc['mean'] = byl.mean()
    print('\n## c3. ‖τ‖² share by block, per expert'); print(byl.round(3).to_string())
    lk = pd.DataFrame({f'{bl} {kd}': [np.mean([sum(v for k, v in sq[t].items() if layer(k) == bl and kind(k) == kd) / sum(sq[t].values()) for t in names])]
                       for bl in blocks for kd in kinds if any(layer(k) == bl and kind(k) == kd for k in keys)}, index=['mean ‖τ‖² share']).T
    print('\n   by block and kind (mean of experts)'); print(lk.round(3).to_string())
    def cos(sel):
        v = torch.stack([torch.cat([B.tau[t][k].double().flatten() for k in keys if sel(k)]) for t in names])
        v = v / v.norm(dim=1, keepdim=True)
        return pd.DataFrame((v @ v.T).numpy(), index=names, columns=names)
    full = cos(lambda k: True)
    print('\n## c4. Cosine similarity of the task vectors (all tensors)'); print(full.round(3).to_string())
    off = lambda m: m.values[~np.eye(len(m), dtype=bool)]
    summ = {}
    for label, sel in [('all tensors', lambda k: True), ('attention', lambda k: kind(k) == 'attention'), ('mlp', lambda k: kind(k) == 'mlp'),
                       ('layer_norm', lambda k: kind(k) == 'layer_norm'), ('embeddings', lambda k: kind(k) == 'embeddings')]:
        o = off(cos(sel)); summ[label] = {'mean off-diagonal': o.mean(), 'min': o.min(), 'max': o.max()}
    print('\n   off-diagonal cosines by kind'); print(pd.DataFrame(summ).T.round(3).to_string())
    norms = pd.Series({t: math.sqrt(sum(s.values())) for t, s in sq.items()}, name='‖τ‖')
    print('\n   ‖τ‖ per expert (‖θ₀‖ = %.1f)' % math.sqrt(sum(float(pre[k].double().pow(2).sum()) for k in keys))); print(norms.round(2).to_string())


# ---------------------------------------------------------------------------------------------------------------- e. TIES
def cmd_ties(B:Bench, lams=(0.3, 0.5, 0.7, 1.0)):
    "TIES's premises on this zoo (Yadav et al. 2023, §3: small updates are redundant, and signs conflict), and its steps apart."
    from fusion_nb.merge import merge
    from fusion_nb.methods.ties import ties_thresholds, ties_merging
    names, pre = B.names, B.pre
    keys, d = list(pre), sum(v.numel() for v in pre.values())
    # paper 000's k = 20, one whole-model threshold per expert, by hand (`topk` over the flat vector), beside the package's streaming one
    thr = {t: float(torch.cat([B.tau[t][k].flatten() for k in keys]).abs().topk(math.ceil(0.2 * d)).values[-1]) for t in names}
    pkg = ties_thresholds(pre, B.experts, k=20, progress=False)
    print(f"# top-20 % thresholds, by hand against ties_thresholds: largest difference {max(abs(thr[t] - pkg[t]) for t in names):.2e}")
    trim = {t: {k: B.tau[t][k] * (B.tau[t][k].abs() >= thr[t]) for k in keys} for t in names}
    sq = lambda sd: sum(float(v.double().pow(2).sum()) for v in sd.values())
    rows = {}
    for t in names:
        rows[t] = {'top-20 % share of ‖τ‖²': sq(trim[t]) / sq(B.tau[t]), 'expert': B.accuracy(t, B.experts[t]),
                   'θ₀ + top-20 % τ': B.accuracy(t, {k: pre[k] + trim[t][k] for k in pre}), 'zero-shot': B.accuracy(t, pre)}
    df = pd.DataFrame(rows).T
    df['kept share of the gain'] = (df['θ₀ + top-20 % τ'] - df['zero-shot']) / (df['expert'] - df['zero-shot'])
    df.loc['Avg.'] = df.mean()
    avg = df.loc['Avg.']; df.loc['Avg.', 'kept share of the gain'] = (avg['θ₀ + top-20 % τ'] - avg['zero-shot']) / (avg['expert'] - avg['zero-shot'])
    print('\n## e1. Redundancy: each expert with only the top 20 % of its task vector (λ = 1), against the expert')
    print(df.round(3).to_string())
    s = torch.cat([torch.stack([trim[t][k].flatten() for t in names]) for k in keys], dim=1)   # experts × d
    nz = (s != 0).sum(0); pos, neg = (s > 0).sum(0), (s < 0).sum(0)
    shared = nz >= 2; mixed = shared & (pos > 0) & (neg > 0)
    elected = torch.sign(s.sum(0)); dropped = (s * elected < 0)
    print('\n## e2. Sign conflicts among the trimmed task vectors')
    print(f"   entries kept by ≥ 2 experts: {float(shared.float().mean()):.3f} of all; of those with mixed signs: {float(mixed.sum() / shared.sum()):.3f}; "
          f"trimmed mass dropped by the election: {float((s.abs() * dropped).sum() / s.abs().sum()):.3f}")
    ties = lambda **h: dict(merge('ties_merging', pre, B.experts, **(ties_merging.paper_settings('000') | h), progress=False))
    merges = {'task arithmetic 0.3': B.merged(lambda t, k: 0.3),
              'trim only (Σ top-20 % τ) 0.3': {k: pre[k] + 0.3 * sum(trim[t][k] for t in names) for k in pre},
              'elect only (TIES, k = 100) 0.3': ties(k=100), **{f'TIES {l}': ties(scaling_factor=l) for l in lams},
              'task arithmetic 0.2': B.merged(lambda t, k: 0.2)}
    by_hand = {k: pre[k] + 0.3 * sum(trim[t][k] * (torch.sign(trim[t][k]) == torch.sign(sum(trim[u][k] for u in names))) for t in names) for k in pre}
    gap = max(float((merges['TIES 0.3'][k] - by_hand[k]).abs().max()) for k in pre)   # the package's TIES against the textbook steps
    print(f"\n   TIES 0.3 (package) against top-20 % trim → sign of the sum → disjoint sum, all by hand: largest difference {gap:.2e}")
    acc = pd.DataFrame({m: {t: B.accuracy(t, p) for t in names} for m, p in merges.items()}).T
    acc['Avg.'] = acc.mean(axis=1)
    print("\n## e3. TIES's steps apart at paper 000's settings (disjoint sum, k = 20), and its λ"); print(acc.round(1).to_string())

# -------------------------------------------------------------------------------------------------------------- d. spread
def cmd_spread(profile:str):
    from fusion_nb.reproduce.reports import load_build_spread, spread_rows
    spread, recipes = load_build_spread(profile, ROOT)
    if spread.empty: print(f'no build spread file for profile {profile!r}'); return
    print(f"# data/paper_values/build_spread_{profile}.csv (zoo recipe {recipes.get('zoo', '?')[:16]}): averages only, per build seed")
    rows = spread_rows(spread, '04_fusion_eight_tasks').copy()
    seeds = [c for c in rows.columns if c.startswith('seed')]
    rows['mean'] = rows[seeds].mean(axis=1)
    for s in seeds: rows[f'{s} − mean'] = rows[s] - rows['mean']
    print('\n## d1. Experiment 04: each row\'s eight-task average per build (points)')
    print(rows.round(2).to_string())
    ranks = rows[seeds].drop(index=[r for r in ('Pre-trained', 'Fine-tuned (STL)') if r in rows.index]).rank(ascending=False)
    print('\n## d2. Rank of each fusion row per build (1 = best)'); print(ranks.astype(int).to_string())
    dev = rows[[f'{s} − mean' for s in seeds]].drop(index=[r for r in ('Pre-trained', 'Fine-tuned (STL)') if r in rows.index])
    print('\n## d3. Do the rows move together? Mean deviation of the fusion rows from their own three-build mean, per build')
    print(f"   {dev.mean().round(2).to_dict()}")
    f = spread_rows(spread, '04_fusion_eight_tasks', 'findings')
    if len(f): print('\n## d4. Experiment 04 findings per build (difference in points)'); print(f.round(2).to_string())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('what', choices=['wemoe', 'entropy', 'experts', 'spread', 'ties'])
    ap.add_argument('--profile', default='tiny')
    ap.add_argument('--max-test-samples', type=int, default=0, help='per task; 0: the whole test split')
    ap.add_argument('--threads', type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    if args.what == 'spread': cmd_spread(args.profile)
    else:
        B = Bench(args.profile, args.max_test_samples)
        {'wemoe': cmd_wemoe, 'entropy': cmd_entropy, 'experts': cmd_experts, 'ties': cmd_ties}[args.what](B)
    print(f'\n# {args.what}: {time.time() - t0:.0f} s wall')

if __name__ == '__main__':
    main()
