"""Are a zoo's bases converged? For each base θp of the zoo experiment 20 built (data/tiny/robust/DATASET, its budget
read from the manifest), fine-tune a control θp→p (the fine-tune recipe, against p again) and print θp, θp→p and every
θp→q under the three attacks (APGD 20 steps) on 300 test images, and θp's robust accuracy on 300 of its training images.
Measured (2026-11-24, issue 13) with `cifar10` and `imagenet` on the 80-epoch zoo: nbs/experiments/20_robust_fronts.ipynb,
"80 epochs (the profile since 2026-11-24)": a θp→p control moves θp by at most 3 points (CIFAR-10 θ∞ 49.0 → 49.7 ℓ∞,
θ2 65.7 → 68.3 ℓ2, θ1 32.0 → 32.3 ℓ1; ImageNet θ∞ 80.0 → 78.3 ℓ∞). On the ×8 ImageNet zoo (2026-12-03, issue 48; run in a
copy holding the zoo: the pins, and seed 2's build): θ∞ 57.0 → 48.3 ℓ∞ (pins), 51.7 → 56.7 (seed 2, 50.3 on its own
training images): the recipe alone moves it by more than (check)'s margin, one way or the other (notebook 20). Until
2026-12-05 the controls trained on the stand-in rendered with the *build's* seed, so seed 2's control above saw other images
than its θ∞ did (the pins' unaffected); the zoo renders with seed 0 for every build, as this script now does (the manifest's
`data_seed`). The 160-epoch change rests on imagenet_finetune.py, which rendered them as the zoo does. Nothing is written.

Usage: python bench/robust_construction/control.py [cifar10|imagenet]   (from the project root, after the tiny zoo is built)"""
import json, sys, torch
torch.set_num_threads(1)
from fusion_nb.robust.attacks import apgd
from fusion_nb.robust.zoo import ModelSpec, ZooBudget, load_zoo, model_name, standin, standin_attacks, train_model
from fusion_nb.tiny.zoo import deterministic
from pathlib import Path
if {'-h', '--help'} & set(sys.argv[1:]): print(__doc__); sys.exit(0)   # after the imports: --help also checks that they resolve
ds = sys.argv[1] if len(sys.argv) > 1 else 'cifar10'
folder = f'data/tiny/robust/{ds}'
if not Path(folder, 'manifest.json').is_file():
    sys.exit(f"{folder} holds no robust zoo: build it first (fusion-nb reproduce --profile tiny --only 20_robust_fronts)")
man = json.load(open(f'{folder}/manifest.json')); b = ZooBudget(**man['budget'])
zoo = load_zoo(folder); x, y = standin(ds, 'train', b.n_train, man.get('data_seed', b.seed))   # another build: its seed trains, seed 0 renders
xt, yt = standin(ds, 'test', 300)
att = {a['norm']: a for a in standin_attacks(ds, steps=20)}
ev = lambda m, xx, yy: {k: round(apgd(m, xx, yy, k, a['eps'], steps=20, loss=a['loss'], seed=0).accuracy * 100, 1) for k, a in att.items()}
print(ds, 'budget', man['budget'], flush=True)
for p in [n.removeprefix('theta_') for n in zoo if n.startswith('theta_') and '_to_' not in n and n != 'theta_nominal']:
    base = zoo[f'theta_{p}']
    with deterministic(b.threads): ctrl = train_model(ModelSpec(model_name(p, p), (p,), f'theta_{p}'), ds, x, y, b, base)
    print(f'theta_{p} (test)', ev(base, xt, yt), '| on 300 training images', ev(base, x[:300], y[:300]), flush=True)
    print(f'theta_{p}_to_{p} (control)', ev(ctrl, xt, yt), flush=True)
    for n in [n for n in zoo if n.startswith(f'theta_{p}_to_') and '_eps' not in n]: print(n, ev(zoo[n], xt, yt), flush=True)
