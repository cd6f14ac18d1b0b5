"""Paper 002's (check) and (why) rows on other draws of the test images, for each build of the robust zoo (issue 48).

    python bench/robust_construction/draws.py cifar10 [--zoo DIR ...] [--n 300] [--draws 8] [--steps 20] [--out F.json]

Every build of the zoo is attacked on the same 300 rendered test images (`standin(dataset, 'test', 300)`: rendering seed 0,
whatever the build seed), so the spread between builds says nothing of how far a (check) difference moves with the images
drawn, and a verdict that "varies between builds" may be a build's model or the draw's luck. For each zoo folder given
(default: the pinned `data/tiny/robust/<dataset>`; other builds: their copies' folders, e.g. /work/sp1/data/tiny/robust/cifar10)
this attacks every base θp and fine-tune θp→q as experiment 20 does (batches of the profile's size, APGD with its losses and
radii on the clean-correct images, per-example flags) on `draws` renderings of `n` test images (rendering seeds 0 … draws−1;
draw 0 is the experiment's images, and its numbers are checked equal to the experiment's `results.csv` where given with
--results), then per draw and pooled over all draws: each fine-tune's p lost and q gained (the (check) row) and each pair of
specialists' differences (the (why) row), each with its paired standard error, and the verdict at the experiment's margin
(two images of the set judged: 0.67 points at 300, 0.083 pooled over 2,400).
Writes the JSON given by --out (default bench/robust_construction/draws_<dataset>.json, atomically) and prints a summary.
Measured 2026-12-05 with `cifar10 --control` on each build in the copy holding it (pins, seeds 1 and 2; 515–561 s each, one
thread; draws_cifar10_build{0,1,2}.json): (check) holds on 3 / 0 / 2 of 8 draws (draw 0 among the 3 and the 2), pooled on
build 0 only; ten of its twelve differences are ≥ 2.3 points on every build, the two between θ∞ and θ2 move ℓ2 by −2.5 … +1.9;
θ2 − θ∞ in ℓ2 is 4.25 / 2.58 / 3.71 ± 0.8; the controls move their own threat model by 0.0–1.7 points. Quoted in
nbs/experiments/20_robust_fronts.ipynb (what (check) on CIFAR-10 rests on)."""
import argparse, ast, json, os, sys, time
from pathlib import Path
import numpy as np, pandas as pd, torch
torch.set_num_threads(1)
from fusion_nb.reproduce.profiles import load_profile
from fusion_nb.robust import zoo as Z
from fusion_nb.robust.attacks import NORMS, apgd
from fusion_nb.robust.paper_data import to_input

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument('dataset', choices=['cifar10', 'imagenet'])
ap.add_argument('--zoo', nargs='+', type=Path, default=None, help='zoo folders, one per build (default: the pinned one)')
ap.add_argument('--labels', nargs='+', default=None, help='a name per zoo folder (default build0, build1, …)')
ap.add_argument('--n', type=int, default=300, help='test images per draw (experiment 20: robust_eval_images)')
ap.add_argument('--draws', type=int, default=8)
ap.add_argument('--steps', type=int, default=20, help='APGD steps (experiment 20: robust_eval_steps)')
ap.add_argument('--results', nargs='*', type=Path, default=[], help="experiment 20's results.csv per zoo, to check draw 0 against")
ap.add_argument('--control', action='store_true', help='also fine-tune each base against its own threat model (θp→p, the recipe alone) and compare every θp→q with it')
ap.add_argument('--out', type=Path, default=None)
a = ap.parse_args()

P = load_profile('tiny'); bs = P.batch_size
specs = Z.zoo_specs(a.dataset, P.extra.get('robust_bases', 'linf l2 l1').split())
# default: the zoo as experiment 20 gets it (restored from pins/ or retrained where missing or stale); --zoo folders are read as they are
folders = a.zoo or [Z.robust_zoo(Z.zoo_dir(P.root, 'tiny', a.dataset), a.dataset, specs, Z.profile_budget(P.extra, a.dataset), progress=False)]
labels = a.labels or [f'build{i}' for i in range(len(folders))]
names = [s.name for s in specs if s.name.startswith('theta_') and '_eps' not in s.name and 'nominal' not in s.name]
attacks = {t['norm']: t for t in Z.standin_attacks(a.dataset, NORMS, steps=a.steps)}
tests = [Z.standin(a.dataset, 'test', a.n, seed=d) for d in range(a.draws)]

def flags(model, x, y, norm):
    """Per-example correctness, as experiment 20's `flags`: clean, or robust under `norm` (attacked where clean-correct).
    Not `robust_accuracy`: that batches the clean-correct images, experiment 20 batches the test images first, and APGD's
    random starts follow the batch, so only this order gives draw 0 the experiment's numbers to the digit."""
    parts = []
    for i in range(0, len(y), bs):
        xb, yb = to_input(x[i:i + bs]), y[i:i + bs]
        with torch.no_grad(): ok = model(xb).argmax(1) == yb
        if norm != 'clean' and ok.any():
            t = attacks[norm]; r = torch.zeros_like(ok)
            r[ok] = apgd(model, xb[ok], yb[ok], norm, t['eps'], steps=t['steps'], loss=t['loss'], restarts=t.get('restarts', 1),
                         largereps=t.get('largereps', False)).robust
            ok = r
        parts.append(ok)
    return torch.cat(parts).numpy()

def diff(f1, f2):
    "Accuracy difference f1 − f2 in points over paired examples, and its standard error."
    d = f1.astype(float) - f2.astype(float)
    return 100 * d.mean(), 100 * d.std(ddof=1) / np.sqrt(len(d))

def comparisons(F, n):
    "(check) and (why) of experiment 20 on flags F[model][norm] over n images: each difference, its SE, and the verdicts."
    margin = 2 * 100 / n + 1e-3
    rows = []
    for m in names:
        if '_to_' not in m: continue
        p, q = m.removeprefix('theta_').split('_to_')
        if f'theta_{p}' not in F: continue
        for what, (f1, f2) in {f'{p} lost': (F[f'theta_{p}'][p], F[m][p]), f'{q} gained': (F[m][q], F[f'theta_{p}'][q])}.items():
            rows.append(dict(row='check', pair=f'θ{p}→{q}', what=what, **dict(zip(['diff', 'se'], diff(f1, f2)))))
    for p, q in [('linf', 'l2'), ('linf', 'l1'), ('l2', 'l1')]:
        A, B = f'theta_{p}', f'theta_{q}' if f'theta_{q}' in F else f'theta_{p}_to_{q}'
        if A not in F or B not in F: continue
        for what, (f1, f2) in {f'{p}: θ{p} above': (F[A][p], F[B][p]), f'{q}: {B} above': (F[B][q], F[A][q])}.items():
            rows.append(dict(row='why', pair=f'{A} vs {B}', what=what, **dict(zip(['diff', 'se'], diff(f1, f2)))))
    for m in [m for m in F if '_to_' in m and m.split('_to_')[0] != f"theta_{m.split('_to_')[1]}"]:   # against the control θp→p
        p, q = m.removeprefix('theta_').split('_to_')
        if f'theta_{p}_to_{p}' not in F: continue
        c = F[f'theta_{p}_to_{p}']
        for what, (f1, f2) in {f'{p} lost': (c[p], F[m][p]), f'{q} gained': (F[m][q], c[q])}.items():
            rows.append(dict(row='vs control', pair=f'θ{p}→{q} vs θ{p}→{p}', what=what, **dict(zip(['diff', 'se'], diff(f1, f2)))))
        if not any(r['pair'] == f'θ{p}→{p} − θ{p}' for r in rows):   # once per base: what the recipe alone does
            for k in NORMS: rows.append(dict(row='control', pair=f'θ{p}→{p} − θ{p}', what=f'{k}', **dict(zip(['diff', 'se'], diff(c[k], F[f'theta_{p}'][k])))))
    r = pd.DataFrame(rows).assign(beyond=lambda d: d['diff'] > margin)
    return r, {k: bool(g.beyond.all()) for k, g in r.groupby('row') if k in ('check', 'why', 'vs control')}, margin

out = dict(dataset=a.dataset, n=a.n, draws=a.draws, steps=a.steps, builds={})
t_all = time.time()
for label, folder, res in zip(labels, folders, a.results + [None] * len(folders)):
    zoo = Z.load_zoo(folder, names); t0 = time.time()
    if a.control:   # θp→p as the zoo's own recipe would train it: the build's budget and seed, the stand-in's training images
        from fusion_nb.tiny.zoo import deterministic
        man = json.loads((Path(folder)/'manifest.json').read_text()); b = Z.ZooBudget(**man['budget'])
        x, y = Z.standin(a.dataset, 'train', b.n_train, man.get('data_seed', b.seed))
        for p in [m.removeprefix('theta_') for m in names if '_to_' not in m]:
            with deterministic(b.threads):
                zoo[f'theta_{p}_to_{p}'] = Z.train_model(Z.ModelSpec(Z.model_name(p, p), (p,), f'theta_{p}'), a.dataset, x, y, b, zoo[f'theta_{p}']).eval()
        print(f'{label}: controls θp→p trained in {time.time() - t0:.0f} s', flush=True)
    F = [{m: {k: flags(zoo[m], x, y, k) for k in ['clean', *NORMS]} for m in zoo} for x, y in tests]
    acc0 = {m: {k: round(100 * float(v.mean()), 4) for k, v in F[0][m].items()} for m in zoo}
    check0 = None
    if res:   # draw 0 = experiment 20's images: its 'check' rows must be these accuracies
        r = pd.read_csv(res); r = r[(r.dataset == a.dataset) & (r.figure == 'check')]
        got = {(next(iter(ast.literal_eval(w))), k): v for w, k, v in zip(r.weights, r.metric, r.value)}
        check0 = max(abs(v - acc0[m][k]) for (m, k), v in got.items())
        print(f'{label}: draw 0 against {res}: {len(got)} accuracies, largest difference {check0:.4f} points', flush=True)
    per_draw = []
    for d in range(a.draws):
        r, v, margin = comparisons(F[d], a.n); per_draw.append(dict(draw=d, verdicts=v, rows=r.round(3).to_dict('records')))
    pooled = {m: {k: np.concatenate([F[d][m][k] for d in range(a.draws)]) for k in F[0][m]} for m in zoo}
    r, v, margin_p = comparisons(pooled, a.n * a.draws)
    r['beyond_300_margin'] = r['diff'] > 2 * 100 / a.n + 1e-3
    out['builds'][label] = dict(folder=str(folder), seconds=round(time.time() - t0), draw0_accuracy=acc0, draw0_vs_experiment=check0,
                                per_draw=per_draw, pooled=dict(margin=margin_p, verdicts=v, rows=r.round(3).to_dict('records')))
    print(f'\n## {label} ({folder}; {time.time() - t0:.0f} s)')
    for row in ['check', 'why'] + ['vs control'] * a.control:
        held = [d['verdicts'].get(row) for d in per_draw]
        print(f'({row}) holds on {sum(held)} of {len(held)} draws of {a.n} (margin {margin:.2f}): {["y" if h else "n" for h in held]}; '
              f'pooled over {a.n * a.draws}: {v.get(row)}')
    t = pd.DataFrame([dict(row=x['row'], pair=x['pair'], what=x['what'], draw=p['draw'], diff=x['diff']) for p in per_draw for x in p['rows']])
    s = t.groupby(['row', 'pair', 'what'], sort=False)['diff'].agg(['min', 'max', 'std']).join(r.set_index(['row', 'pair', 'what'])[['diff', 'se']])
    s = s.assign(draw0=t[t.draw == 0].set_index(['row', 'pair', 'what'])['diff'])
    print(s.rename(columns={'diff': 'pooled', 'se': 'pooled se', 'std': 'sd over draws'}).round(2).to_string(), flush=True)
dest = a.out or Path(__file__).with_name(f'draws_{a.dataset}.json')
tmp = dest.with_suffix('.tmp'); tmp.write_text(json.dumps(out, indent=1, default=float)); os.replace(tmp, dest)
print(f'\nwrote {dest} ({time.time() - t_all:.0f} s)')
