#!/usr/bin/env python
"""Candidate constructions of the tiny zoo for paper 000 (issue 47, item 2): build one into a scratch folder, measure it.

    python bench/construction_paper000.py build NAME [--pretrain-steps N --pretrain-pairs N --intermediate-size N
                                                      --finetune-lr X --finetune-steps N ... --clip-from OTHER]
    python bench/construction_paper000.py measure NAME [--grid]      # → bench/construction_paper000/NAME.json and .txt
    python bench/construction_paper000.py measure pinned --models /work/main/data/tiny/models   # the pinned zoo, same bench
    python bench/construction_paper000.py compare NAME...            # the candidates side by side
    python bench/construction_paper000.py spread NAME_s0 NAME_s1 NAME_s2   # builds of one candidate (--methods run on each): spreads, orderings
    python bench/construction_paper000.py spread NAME_s0 NAME_s1 NAME_s2 --extra _extra   # with the rows of `--methods --rows … --suffix _extra`: experiment 04's ten
    python bench/construction_paper000.py export pinclip_ft_s0 pinclip_ft_s1 pinclip_ft_s2   # → data/paper_values/expert_spread_tiny.csv (experiment 04 reads it)
    python bench/construction_paper000.py measure NAME --methods [--rows R... --suffix S]   # paper 000's rows by the package's fuse()
    python bench/construction_paper000.py measure pinned --models data/tiny/models --methods --fuse-seed 1 --suffix _fuse1   # other test batches
    python bench/construction_paper000.py build NAME --corpus digits-near ...   # SVHN/MNIST pretraining renderings without the zoom-out
    python bench/construction_paper000.py build NAME --corpus cars-near --seed 1 ...   # Cars' likewise; --seed: another build of it
    python bench/construction_paper000.py build NAME --pretrain-schedule cosine --warmup-steps 200 ...   # CLIP's lr schedule, not the package's constant lr
    python bench/construction_paper000.py build|measure NAME --device cuda ...   # on a GPU (other weights than the CPU's); bench/construction_paper000_device.sh runs several

A candidate is the tiny `ZooConfig` with some fields replaced (`dataclasses.replace`): the package is not touched, the
datasets are the tiny benchmark's (`--datasets`, a built data/tiny/datasets), the weights go to `--scratch`/NAME.
`--clip-from OTHER` reuses OTHER's pretrained CLIP (only the experts are fine-tuned): a fine-tune recipe on the same CLIP.
Only the eight tasks of paper 000 get experts (the package builds twelve). Training runs under `deterministic(--threads)`
(the published build uses 2 threads; 1 here gives other weights of the same recipe, which is what a candidate needs).

`measure` computes, with the frozen zero-shot heads the experiments use and the same measurements as
bench/diagnose_paper000.py (its `kind`, `entropies`): per task zero-shot vs chance, expert, task arithmetic λ = 0.3 and its
normalised accuracy, the share of the expert's gain over θ₀ kept by θ₀ + the expert's MLPs (the MLP-swap share) and by
everything but the MLPs, WE-MoE's oracle (the expert's MLPs, task arithmetic 0.3 elsewhere: what one-hot routing
gives), the per-sample Spearman ρ(entropy, loss) at TA 0.3, ‖τ‖² share of the MLPs and the task vectors' cosines;
`--grid` adds ρ(entropy, error) across task arithmetic λ ∈ {0, 0.1, …, 1} per task (11 merged models).
"""
from __future__ import annotations
import argparse, json, math, sys, time
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT/'bench'))
from diagnose_paper000 import Bench, entropies, kind   # the diagnosis's measurements, reused as they are

pd.set_option('display.width', 250); pd.set_option('display.max_columns', 40)
OUT = ROOT/'bench'/'construction_paper000'
SCRATCH = Path('/work/scratch-47/zoos')
FIELDS = {'hidden_size': int, 'intermediate_size': int, 'num_layers': int, 'num_heads': int, 'pretrain_pairs': int,
          'pretrain_steps': int, 'pretrain_batch': int, 'pretrain_lr': float, 'pretrain_weight_decay': float,
          'finetune_steps': int, 'finetune_batch': int, 'finetune_lr': float}


def near_shift(img, rng):
    "`pretraining_shift` without its last step (the zoomed-out view on clutter): colour permutation or grey, crop, blur."
    from fusion_nb.tiny.tasks import pretraining_shift
    return pretraining_shift(img, rng, zoom_out=False)   # the package's own since issue 47 (Stanford Cars keeps its framing)


CORPORA = {'package': (), 'digits-near': ('svhn', 'mnist'),   # --corpus: the tasks whose pretraining renderings get `near_shift`
           'cars-near': ('stanford_cars',)}   # B/32 knows Cars before fine-tuning (zero-shot 59.8 of the expert's 78.3); tiny does not

def use_corpus(name:str)->list[str]:
    "Give the tasks of `CORPORA[name]` a `pretrain` renderer (their train renderer, `near_shift`ed) in this process only."
    from fusion_nb.tiny import tasks as T
    for t in CORPORA[name]:
        spec = T.TASKS[t]
        T.TASKS[t] = replace(spec, pretrain=lambda rng, y, spec=spec: near_shift(spec.render(rng, y, spec.splits[0]), rng))
    return list(CORPORA[name])

def cosine_lr(step:int, steps:int, warmup:int)->float:
    "The factor on the base lr at `step`: linear warmup over `warmup` steps, then a cosine decay to 0 at `steps` (CLIP's schedule, Radford et al. 2021 §2.5)."
    if step < warmup: return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

@contextmanager
def pretrain_schedule(kind:str, steps:int, warmup:int):
    """Inside the block, the AdamW `pretrain_clip` creates follows `kind`'s lr schedule ('constant': the package's, unchanged; 'cosine':
    `cosine_lr`), in this process only: a candidate construction, the package untouched (its zoo recipe digests zoo.py)."""
    if kind == 'constant': yield; return
    base = torch.optim.AdamW
    class Scheduled(base):
        def step(self, *args, **kw):
            self._t = getattr(self, '_t', 0)
            for g in self.param_groups: g['lr'] = g.setdefault('initial_lr', g['lr']) * cosine_lr(self._t, steps, warmup)
            self._t += 1
            return super().step(*args, **kw)
    torch.optim.AdamW = Scheduled
    try: yield
    finally: torch.optim.AdamW = base

def cmd_build(a):
    from fusion_nb.tiny.zoo import deterministic, finetune_expert, pretrain_clip, zoo_config
    from fusion_nb.tiny.tasks import EIGHT_TASKS
    near = use_corpus(a.corpus)
    cfg = replace(zoo_config(a.scale), **{f: getattr(a, f) for f in FIELDS if getattr(a, f) is not None})
    if a.warmup_steps and a.pretrain_schedule == 'constant': raise SystemExit('--warmup-steps needs --pretrain-schedule cosine')
    if not 0 <= a.warmup_steps < cfg.pretrain_steps:
        raise SystemExit(f'--warmup-steps {a.warmup_steps}: must be in [0, {cfg.pretrain_steps}) (the pre-training steps)')
    out = Path(a.scratch)/a.name; out.mkdir(parents=True, exist_ok=True)
    timings, clip_dir = {}, out/'clip-vit-tiny'
    with deterministic(a.threads):
        history = []
        if a.clip_from and (Path(a.clip_from)/'config.json').exists():   # a CLIP folder (the pinned zoo's): the scale's sizes
            clip_dir = Path(a.clip_from)
        elif a.clip_from:
            src = Path(a.scratch)/a.clip_from
            clip_dir, src_cfg = src/'clip-vit-tiny', json.loads((src/'candidate.json').read_text())['config']
            cfg = replace(cfg, **{k: v for k, v in src_cfg.items() if not k.startswith('finetune')})   # the CLIP's own sizes
        else:
            t0 = time.time()
            with pretrain_schedule(a.pretrain_schedule, cfg.pretrain_steps, a.warmup_steps):
                pretrain_clip(clip_dir, cfg, seed=a.seed, device=a.device, progress=False, history=history)
            timings['pretrain_s'] = round(time.time() - t0, 1)
            print(f'pretrained in {timings["pretrain_s"]} s', flush=True)
        t0 = time.time()
        for t in ([] if a.pretrain_only else EIGHT_TASKS):
            finetune_expert(clip_dir, t, Path(a.datasets)/t, out/f'clip-vit-tiny_{t}', cfg, seed=a.seed, device=a.device, progress=False)
        timings['experts_s'] = round(time.time() - t0, 1)
    curve = {f'loss, steps {i}-{i + 99}': round(float(np.mean(history[i:i + 100])), 3) for i in range(0, len(history), max(100, len(history) // 10 // 100 * 100))}
    rec = {'name': a.name, 'config': asdict(cfg), 'clip': str(clip_dir), 'seed': a.seed, 'threads': a.threads, 'device': a.device, 'timings': timings,
           'pretrain_schedule': 'see the CLIP' if a.clip_from else f'{a.pretrain_schedule}, warmup {a.warmup_steps}',
           'pretrain_loss': curve, 'corpus': a.corpus if not a.clip_from else 'see the CLIP', 'near_shift_tasks': near}
    (out/'candidate.json').write_text(json.dumps(rec, indent=1))
    print(json.dumps(rec, indent=1))


class ZooBench(Bench):
    "diagnose_paper000's Bench on a candidate zoo's folders instead of a profile's."
    def __init__(self, clip_dir:Path, expert_dirs:dict, datasets:Path, max_test_samples:int, seed:int=0):
        from types import SimpleNamespace
        from fusion_nb.pools import ModelPool, TaskPool, Task, PRETRAINED
        from fusion_nb.evaluation import image_loader
        from fusion_nb.methods.data import MergeData
        self.P = SimpleNamespace(seed=seed, max_test_samples=max_test_samples, test_split='test')
        self.models = ModelPool(clip_dir, expert_dirs, device='cpu')
        self.tasks = TaskPool([Task(t, datasets/t) for t in expert_dirs])
        self.data = MergeData(self.models, self.tasks, seed=seed, max_test_samples=max_test_samples)
        self.names = list(expert_dirs)
        self.pre = {k: v.float() for k, v in dict(self.models.vision_state(PRETRAINED)).items()}
        self.experts = {t: {k: v.float() for k, v in dict(self.models.vision_state(t)).items()} for t in self.names}
        self.tau = {t: {k: e[k] - self.pre[k] for k in self.pre} for t, e in self.experts.items()}
        self.pixels, self.labels = {}, {}
        for t in self.names:
            ds = self.tasks[t].load('test', max_samples=max_test_samples, seed=seed)
            px, lb = zip(*[(b['pixel_values'], b['label']) for b in image_loader(ds, self.models.processor, batch_size=256)])
            self.pixels[t], self.labels[t] = torch.cat(px), torch.cat(lb)


def gain(x, z, e): return (x - z) / (e - z) if e != z else float('nan')

def zero_shot_only(a, clip_dir:Path, t0:float):
    "A pretrain-only candidate: zero-shot accuracy per task against chance."
    from fusion_nb.pools import ModelPool, TaskPool, Task, PRETRAINED
    from fusion_nb.evaluation import evaluate
    from fusion_nb.tiny.tasks import EIGHT_TASKS
    mp, tp = ModelPool(clip_dir, {}, device='cpu'), TaskPool([Task(t, Path(a.datasets)/t) for t in EIGHT_TASKS])
    r = evaluate({'zero-shot': PRETRAINED}, mp, tp, batch_size=400, progress=False, max_samples=a.max_test_samples)
    r = r[r.metric == 'accuracy'].set_index('task')['value'] * 100
    df = pd.DataFrame({'chance': {t: 100 / len(tp[t].class_names) for t in EIGHT_TASKS}, 'zero-shot': r.reindex(EIGHT_TASKS)})
    df['zs − chance'] = df['zero-shot'] - df['chance']; df.loc['Avg.'] = df.mean()
    summary = {'zero-shot avg': df.loc['Avg.', 'zero-shot'], 'min zs − chance': df['zs − chance'].drop('Avg.').min()}
    text = [f'# candidate {a.name} (pretrain only): {clip_dir}, measured in {time.time() - t0:.0f} s', df.round(2).to_string()]
    print('\n'.join(text)); OUT.mkdir(exist_ok=True); (OUT/f'{a.name}.txt').write_text('\n'.join(text) + '\n')
    (OUT/f'{a.name}.json').write_text(json.dumps({'candidate': json.loads((Path(a.scratch)/a.name/'candidate.json').read_text()),
                                                  'summary': summary, 'per_task': df.to_dict()}, indent=1, default=float))

ROWS_000 = ['simple_average', 'task_arithmetic', 'ties_merging', 'task_wise_adamerging', 'layer_wise_adamerging', 'weight_ensembling_moe']
ORDERINGS_000 = [('task_arithmetic', 'simple_average'), ('ties_merging', 'task_arithmetic'), ('layer_wise_adamerging', 'task_wise_adamerging'),
                 ('layer_wise_adamerging', 'task_arithmetic'), ('weight_ensembling_moe', 'layer_wise_adamerging'),
                 ('weight_ensembling_moe', 'task_arithmetic')]   # "a above b" in paper 000's B/32 table (its Concrete rows not run here)
def b32_000()->dict:
    "Paper 000's ViT-B/32 averages (multi-task table), as data/paper_values transcribes them."
    v = pd.read_csv(ROOT/'data'/'paper_values'/'paper000.csv', dtype={'paper': str})
    v = v[v.table.str.startswith('multi_task') & (v.model == 'clip-vit-b32') & (v.task == 'avg')]
    return dict(zip(v.method, v.value))

def measure_methods(a, clip_dir:Path, models:Path, t0:float):
    "Paper 000's rows on a candidate zoo, each by the package's own `fuse` with the tiny profile's budgets and seed (experiment 04's)."
    import copy
    from fusion_nb.evaluation import evaluate
    from fusion_nb.methods.data import MergeData
    from fusion_nb.pools import ModelPool, TaskPool, Task, PRETRAINED
    from fusion_nb.reproduce.profiles import load_profile
    from fusion_nb.reproduce.rows import fuse, fusion_settings
    from fusion_nb.tiny.tasks import EIGHT_TASKS
    P = load_profile('tiny'); S = fusion_settings(P)   # the budgets settings.ini gives the tiny profile; its seed (42)
    mp = ModelPool(clip_dir, {t: models/f'clip-vit-tiny_{t}' for t in EIGHT_TASKS}, device=a.device)
    tp = TaskPool([Task(t, Path(a.datasets)/t) for t in EIGHT_TASKS])
    fuse_seed = P.seed if a.fuse_seed is None else a.fuse_seed   # the test streams' seed is MergeData's: the methods' own `seed` draws nothing here
    data = MergeData(mp, tp, seed=fuse_seed, max_test_samples=a.max_test_samples)
    pre, experts = mp.vision_state(PRETRAINED), {t: mp.vision_state(t) for t in EIGHT_TASKS}
    fused, seconds = {}, {}
    for r in a.rows or ROWS_000:
        fused[r], seconds[r] = fuse(r, pre, experts, data, S, None, seed=fuse_seed, progress=False)
        print(f'{r:28s} {seconds[r]:7.1f} s', flush=True)
    if 'weight_ensembling_moe' in fused:   # the same routers with FusionBench's batch-averaged routing (leaky: one task per batch)
        fused['weight_ensembling_moe (batch, leaky)'] = copy.deepcopy(fused['weight_ensembling_moe']).set_routing('batch')
    rows = {'pretrained': PRETRAINED, **{f'finetuned:{t}': t for t in EIGHT_TASKS}, **fused}
    per_task = {'pretrained': EIGHT_TASKS, **{f'finetuned:{t}': [t] for t in EIGHT_TASKS}, **{r: EIGHT_TASKS for r in fused}}
    rec = evaluate(rows, mp, tp, tasks=per_task, batch_size=P.batch_size, max_samples=a.max_test_samples, seed=P.seed, progress=False)
    rec = rec[rec.metric == 'accuracy'].assign(row=lambda d: d.model.str.split(':').str[0], value=lambda d: 100 * d.value)
    table = rec.pivot_table(index='row', columns='task', values='value')[EIGHT_TASKS]
    table = table.reindex(['pretrained', 'finetuned', *fused]); table['Avg.'] = table.mean(axis=1)
    B32 = b32_000(); table['B/32 Avg.'] = pd.Series(B32)
    avg = table['Avg.']
    orders = pd.DataFrame([{'a above b (paper 000)': f'{x} > {y}', 'a − b here': avg[x] - avg[y], 'B/32': B32[x] - B32[y]}
                           for x, y in ORDERINGS_000 if x in avg and y in avg])
    text = [f'# candidate {a.name}: paper 000 rows by fuse() with the tiny profile budgets {dict((k, S[k]) for k in sorted(S) if k.startswith(("adamerging", "wemoe", "tta")))}, '
            f'seed {P.seed}, fuse seed {fuse_seed}; measured in {time.time() - t0:.0f} s', table.round(2).to_string(), '', 'seconds to fuse: ' + json.dumps({k: round(v, 1) for k, v in seconds.items()}),
            '', orders.round(2).to_string(index=False)]
    print('\n'.join(text)); OUT.mkdir(exist_ok=True); (OUT/f'{a.name}_methods{a.suffix}.txt').write_text('\n'.join(text) + '\n')
    (OUT/f'{a.name}_methods{a.suffix}.json').write_text(json.dumps({'models': str(models), 'settings': S, 'seed': P.seed, 'fuse_seed': fuse_seed, 'seconds': seconds,
                                                        'table': table.to_dict(), 'orderings': orders.to_dict('records')}, indent=1, default=float))

def cmd_measure(a):
    from scipy.stats import spearmanr
    from fusion_nb.tiny.tasks import EIGHT_TASKS
    t0 = time.time()
    if a.models: clip_dir, models = Path(a.models)/'clip-vit-tiny', Path(a.models)
    else:
        rec = json.loads((Path(a.scratch)/a.name/'candidate.json').read_text())
        clip_dir, models = Path(rec['clip']), Path(a.scratch)/a.name
    if not (models/f'clip-vit-tiny_{EIGHT_TASKS[0]}').exists(): return zero_shot_only(a, clip_dir, t0)
    if a.methods: return measure_methods(a, clip_dir, models, t0)
    B = ZooBench(clip_dir, {t: models/f'clip-vit-tiny_{t}' for t in EIGHT_TASKS}, Path(a.datasets), a.max_test_samples)
    ta = B.merged(lambda t, k: 0.3)
    rows = {}
    for t in B.names:
        lg_z, lg_e, lg_ta = B.logits(t, B.pre), B.logits(t, B.experts[t]), B.logits(t, ta)
        acc = lambda lg: 100 * float((lg.argmax(-1) == B.labels[t]).float().mean())
        z, e, a_ = acc(lg_z), acc(lg_e), acc(lg_ta)
        mlp = B.accuracy(t, B.swapped(t, {'mlp'}))
        rest = B.accuracy(t, B.swapped(t, {'attention', 'embeddings', 'layer_norm'}))
        oracle = B.accuracy(t, {k: (B.experts[t][k] if kind(k) == 'mlp' else ta[k]) for k in B.pre})
        loss = torch.nn.functional.cross_entropy(lg_ta, B.labels[t], reduction='none')
        chance = 100 / len(B.tasks[t].class_names)
        rows[t] = {'chance': chance, 'zero-shot': z, 'zs − chance': z - chance, 'expert': e, 'TA 0.3': a_, 'TA norm.': 100 * a_ / e,
                   'TA gain share': gain(a_, z, e), 'MLP-swap share': gain(mlp, z, e), 'all-but-MLP share': gain(rest, z, e),
                   'oracle (MLP expert, TA else)': oracle, 'oracle / expert': 100 * oracle / e,
                   'ρ entropy~loss per sample (TA 0.3)': spearmanr(entropies(lg_ta).numpy(), loss.numpy())[0]}
    keys = list(B.pre)
    for t in B.names:
        sq = {k: float(B.tau[t][k].double().pow(2).sum()) for k in keys}
        rows[t]['MLP ‖τ‖² share'] = sum(v for k, v in sq.items() if kind(k) == 'mlp') / sum(sq.values())
        rows[t]['‖τ‖/‖θ₀‖'] = math.sqrt(sum(sq.values()) / sum(float(B.pre[k].double().pow(2).sum()) for k in keys))
    if a.grid:
        recs = []
        for lam in np.round(np.arange(0, 1.01, 0.1), 1):
            p = B.merged(lambda t, k: float(lam))
            for t in B.names:
                lg = B.logits(t, p)
                recs.append(dict(lam=lam, task=t, entropy=float(entropies(lg).mean()), error=100 * float((lg.argmax(-1) != B.labels[t]).float().mean())))
        g = pd.DataFrame(recs)
        for t in B.names:
            d = g[g.task == t]; rows[t]['ρ entropy~error TA grid'] = spearmanr(d.entropy, d.error)[0]
        tot = g.groupby('lam').agg(entropy=('entropy', 'sum'), error=('error', 'mean'))
        grid_pick = {'λ lowest Σ entropy': float(tot.entropy.idxmin()), 'acc at it': 100 - float(tot.loc[tot.entropy.idxmin(), 'error']),
                     'λ best accuracy': float(tot.error.idxmin()), 'best acc': 100 - float(tot.error.min()),
                     'ρ 8-task Σ entropy ~ mean error': spearmanr(tot.entropy, tot.error)[0]}
    v = torch.stack([torch.cat([B.tau[t][k].double().flatten() for k in keys]) for t in B.names]); v = v / v.norm(dim=1, keepdim=True)
    cos = (v @ v.T).numpy()[~np.eye(len(B.names), dtype=bool)]
    df = pd.DataFrame(rows).T; df.loc['Avg.'] = df.mean()
    summary = {'zero-shot avg': df.loc['Avg.', 'zero-shot'], 'min zs − chance': df['zs − chance'].drop('Avg.').min(),
               'expert avg': df.loc['Avg.', 'expert'], 'TA 0.3 avg': df.loc['Avg.', 'TA 0.3'], 'TA norm. avg': df.loc['Avg.', 'TA norm.'],
               'MLP-swap share avg': df.loc['Avg.', 'MLP-swap share'], 'oracle avg': df.loc['Avg.', 'oracle (MLP expert, TA else)'],
               'oracle / expert avg': df.loc['Avg.', 'oracle / expert'], 'ρ per sample avg': df.loc['Avg.', 'ρ entropy~loss per sample (TA 0.3)'],
               'min ρ per sample': df['ρ entropy~loss per sample (TA 0.3)'].drop('Avg.').min(),
               'experts ≥ 99.5': int((df['expert'].drop('Avg.') >= 99.5).sum()), 'cos off-diag mean': float(cos.mean()), 'cos max': float(cos.max()),
               **({'ρ TA grid avg': df.loc['Avg.', 'ρ entropy~error TA grid'], 'min ρ TA grid': df['ρ entropy~error TA grid'].drop('Avg.').min(), **grid_pick} if a.grid else {})}
    text = [f'# candidate {a.name}: {models} ({len(B.labels[B.names[0]])} test images per task), measured in {time.time() - t0:.0f} s',
            df.round(2).to_string(), '', pd.Series(summary).round(3).to_string()]
    print('\n'.join(text))
    OUT.mkdir(exist_ok=True)
    (OUT/f'{a.name}.txt').write_text('\n'.join(text) + '\n')
    cand = Path(a.scratch)/a.name/'candidate.json'
    (OUT/f'{a.name}.json').write_text(json.dumps({'candidate': json.loads(cand.read_text()) if cand.exists() else {'models': str(models)},
                                                  'summary': summary, 'per_task': df.to_dict()}, indent=1, default=float))


def cmd_compare(a):
    recs = {n: json.loads((OUT/f'{n}.json').read_text()) for n in a.names}
    df = pd.DataFrame({n: r['summary'] for n, r in recs.items()})
    diff = {n: {k: v for k, v in r['candidate'].get('config', {}).items()
                if v != recs[a.names[0]]['candidate'].get('config', {}).get(k)} for n, r in recs.items()}
    print(df.round(3).to_string()); print()
    for n, d in diff.items(): print(f'{n}: {d} {recs[n]["candidate"].get("timings", "")}')
    z = pd.DataFrame({n: r['per_task']['zero-shot'] for n, r in recs.items()}); print('\nzero-shot per task'); print(z.round(1).to_string())
    e = pd.DataFrame({n: r['per_task']['expert'] for n, r in recs.items()}); print('\nexperts per task'); print(e.round(1).to_string())


from fusion_nb.reproduce.rows import PAPER000_ORDERINGS as FINDINGS_04   # experiment 04's nine orderings
ROWS_04 = ['simple_average', 'task_arithmetic', 'ties_merging', 'fisher_merging', 'regmean', 'concrete_task_arithmetic', 'task_wise_adamerging',
           'layer_wise_adamerging', 'concrete_layer_wise_adamerging', 'weight_ensembling_moe']   # experiment 04's ten merged rows

def build_averages(name:str, extra:str='')->pd.Series:
    "A build's `Avg.` per row (the registry's names): its `measure --methods` file, joined by the rows of its `--suffix EXTRA` file if given."
    t = pd.Series(json.loads((OUT/f'{name}_methods.json').read_text())['table']['Avg.'])
    if not extra: return t
    x = pd.Series(json.loads((OUT/f'{name}_methods{extra}.json').read_text())['table']['Avg.'])
    return pd.concat([t, x[~x.index.isin(t.index)]])

def cmd_spread(a):
    """Paper 000's rows over several builds of a candidate (their `measure --methods` files) beside the spread file's builds: spreads, and the
    orderings judged as experiment 04 judges them. `--extra S` adds each build's `--methods --rows … --suffix S` file: experiment 04's ten
    merged rows and nine orderings."""
    from fusion_nb.reproduce.reports import ROW_LABELS, beyond_spread, load_build_spread, spread_rows
    rows, pairs = (ROWS_04, FINDINGS_04) if a.extra else (ROWS_000, ORDERINGS_000)
    avg = pd.DataFrame({f'seed {i}': build_averages(n, a.extra) for i, n in enumerate(a.names)}).loc[['pretrained', 'finetuned', *rows]]
    avg = avg.rename(index=ROW_LABELS).round(2)   # two decimals, as the spread file keeps them
    avg['spread'] = avg.max(axis=1) - avg.min(axis=1)
    before = spread_rows(load_build_spread('tiny', ROOT)[0], '04_fusion_eight_tasks').reindex(avg.index)   # the adopted construction's builds
    merged, orderings = [ROW_LABELS[r] for r in rows], [(ROW_LABELS[x], ROW_LABELS[y]) for x, y in pairs]
    text = [f'# {", ".join(a.names)}: paper 000\'s averages, a column per build (seed 0 = "this run" for the verdicts)',
            avg.join(before['spread'].rename('spread file')).round(2).to_string(), '',
            f'mean spread of the {len(merged)} merged rows: {avg.loc[merged, "spread"].mean():.2f} (spread file: {before.loc[merged, "spread"].mean():.2f})', '',
            '## orderings, this candidate', beyond_spread(avg['seed 0'], avg, orderings).round(2).to_string(), '',
            "## orderings, the spread file's builds", beyond_spread(before['seed 0'], before, orderings).round(2).to_string()]
    print('\n'.join(text)); (OUT/f'spread_{a.names[0]}{a.extra}.txt').write_text('\n'.join(text) + '\n')

EXPERT_SPREAD = ROOT/'data'/'paper_values'/'expert_spread_tiny.csv'

def cmd_export(a):
    """Experiment 04's rows on the pinned zoo's CLIP with its experts fine-tuned again (each NAME a `build --clip-from data/tiny/models/clip-vit-tiny`
    measured with `--methods` and `--extra`'s rows) → data/paper_values/expert_spread_tiny.csv: `seed 0` the pinned build's own rows (the spread
    file's seed 0, so a notebook can tell whether this run is still that build), `seed i` the i-th NAME. Paper 000's variation: one CLIP, other experts."""
    from fusion_nb.core import atomic_write_text
    from fusion_nb.reproduce.reports import ROW_LABELS, load_build_spread, spread_rows
    clip = (ROOT/'data'/'tiny'/'models'/'clip-vit-tiny').resolve()
    for n in a.names:   # each build's experts must have been fine-tuned on this checkout's pinned CLIP
        models = Path(json.loads((OUT/f'{n}_methods.json').read_text())['models'])
        used = Path(json.loads((models/'candidate.json').read_text())['clip']).resolve()
        if used != clip: raise SystemExit(f'{n}: its experts were fine-tuned on {used}, not the pinned CLIP {clip}')
    spread, recipes = load_build_spread('tiny', ROOT)
    pinned = spread_rows(spread, '04_fusion_eight_tasks')['seed 0']
    builds = {n: build_averages(n, a.extra).rename(index=ROW_LABELS) for n in a.names}
    for n, b in builds.items():   # the same path may hold another CLIP by now: its zero-shot average must be the pinned build's
        if round(b['Pre-trained'], 2) != pinned['Pre-trained']:
            raise SystemExit(f"{n}: its CLIP's zero-shot average is {b['Pre-trained']:.2f}, the pinned build's {pinned['Pre-trained']:.2f}: not the pinned CLIP")
    rows = [ROW_LABELS[r] for r in ['pretrained', 'finetuned', *ROWS_04]]
    avg = pd.DataFrame({'seed 0': pinned, **{f'seed {i + 1}': builds[n] for i, n in enumerate(a.names)}}).loc[rows].round(2)
    avg = avg.assign(min=avg.min(axis=1), max=avg.max(axis=1)); avg['spread'] = (avg['max'] - avg['min']).round(2)
    avg.index.name = 'row'; avg = avg.reset_index().assign(experiment='04_fusion_eight_tasks', table='table').set_index(['experiment', 'table', 'row'])
    header = (f"# experts' spread, profile tiny: zoo recipe {recipes['zoo']} (seed 0 = the pins; seeds 1-{len(a.names)}: the pinned CLIP's eight experts "
              f"fine-tuned again, bench seeds {', '.join(n.rsplit('_s', 1)[-1] for n in a.names)}, one thread); runs: python bench/construction_paper000.py "
              f"export {' '.join(a.names)} --extra {a.extra}\n")
    atomic_write_text(EXPERT_SPREAD, header + avg.to_csv())
    print(header + avg.droplevel(['experiment', 'table']).to_string())

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = ap.add_subparsers(dest='what', required=True)
    b = sub.add_parser('build'); b.add_argument('name'); b.add_argument('--clip-from'); b.add_argument('--scale', default='tiny')
    b.add_argument('--pretrain-only', action='store_true', help='no experts: `measure` then gives zero-shot only')
    b.add_argument('--pretrain-schedule', choices=['constant', 'cosine'], default='constant',
                   help="the pre-training's lr schedule: the package's constant lr, or warmup + cosine decay to 0 (CLIP's)")
    b.add_argument('--warmup-steps', type=int, default=0, help='with --pretrain-schedule cosine: linear warmup steps')
    b.add_argument('--corpus', choices=list(CORPORA), default='package',
                   help="pretraining corpus: the package's, or 'digits-near' / 'cars-near' (SVHN and MNIST's, or Cars' renderings without the zoom-out on clutter)")
    for f, typ in FIELDS.items(): b.add_argument('--' + f.replace('_', '-'), type=typ)
    m = sub.add_parser('measure'); m.add_argument('name'); m.add_argument('--models', help='a zoo folder (default: the candidate NAME)')
    m.add_argument('--grid', action='store_true'); m.add_argument('--max-test-samples', type=int, default=0)
    m.add_argument('--methods', action='store_true', help="instead: paper 000's rows (fuse() of the package, tiny profile budgets) → NAME_methods.*")
    m.add_argument('--rows', nargs='+', help=f'with --methods: these rows only (default {" ".join(ROWS_000)})')
    m.add_argument('--suffix', default='', help='with --methods: written to NAME_methodsSUFFIX.* (a partial run beside a full one)')
    m.add_argument('--fuse-seed', type=int, default=None, help="with --methods: MergeData's seed (which unlabelled test images each "
                   "test-time step draws, which labelled samples Fisher and RegMean read) and `fuse`'s, instead of the profile's: a method's own run-to-run spread on one zoo, beside the spread between builds")
    c = sub.add_parser('compare'); c.add_argument('names', nargs='+')
    sp = sub.add_parser('spread', help='the builds NAME... of one candidate (each measured with --methods): spreads and orderings')
    sp.add_argument('names', nargs='+')
    sp.add_argument('--extra', default='', help="a suffix: each build's rows measured by `--methods --rows … --suffix SUFFIX` join it (experiment 04's ten rows, nine orderings)")
    for p in (b, m):
        p.add_argument('--scratch', default=str(SCRATCH)); p.add_argument('--datasets', default='/work/scratch-47/datasets')
        p.add_argument('--threads', type=int, default=1); p.add_argument('--seed', type=int, default=0)
        p.add_argument('--device', default='cpu', help="where `build` trains and `measure --methods` merges ('cuda' on a GPU machine: other weights than the CPU's, same recipe); plain `measure` runs on the CPU")
    ex = sub.add_parser('export', help="the builds NAME... (experts fine-tuned on the pinned CLIP) → data/paper_values/expert_spread_tiny.csv, which experiment 04 reads")
    ex.add_argument('names', nargs='+'); ex.add_argument('--extra', default='_extra', help="the suffix of each build's `--methods --rows … --suffix` file")
    a = ap.parse_args(argv)
    if a.what in ('build', 'measure'): torch.set_num_threads(a.threads)
    t0 = time.time()
    {'build': cmd_build, 'measure': cmd_measure, 'compare': cmd_compare, 'spread': cmd_spread, 'export': cmd_export}[a.what](a)
    print(f'\n# {a.what}: {time.time() - t0:.0f} s wall')

if __name__ == '__main__':
    main()
