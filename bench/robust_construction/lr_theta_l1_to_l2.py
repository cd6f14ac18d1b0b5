"""θ1→2 on the CIFAR-10 stand-in at App. A.1's peak rate for it (0.5) and at the other fine-tunes' 0.1 (the zoo's since
2026-12-04), from the zoo's θ1 (data/tiny/robust/cifar10 as experiment 20 built it): ℓ1 / ℓ2 robust accuracy (APGD 20 steps, 300 test images) along
the front w·θ1 + (1 − w)·θ1→2.

Measured 2026-11-24 (issue 13): nbs/experiments/20_robust_fronts.ipynb, "The run before the training attack was fixed":
at 0.1 θ1→2 keeps ℓ2 at 60–61 % along the whole front while ℓ1 falls 32 → 23 (at the zoo's 0.5 it lost both), so it
would not trade either; App. A.1's 0.5 was kept. Nothing is written.
Again 2026-12-03 on the pinned zoo of issue 47's recipe (57 s, one thread, beside a zoo build): at 0.5 ℓ2 / ℓ1 55.7 / 47.0 (θ1),
35.7 / 30.0, 42.0 / 33.3, 45.0 / 36.0, 43.0 / 30.7 (θ1→2) at w = 1, 0.75, 0.5, 0.25, 0; at 0.1 55.7 / 47.0, 58.0 / 45.0,
58.3 / 43.7, 59.3 / 39.0, 59.3 / 34.3: now the 0.1 fine-tune trades and (check) would hold for it (notebook 20, why (check)
fails on CIFAR-10). The zoo's θ1→2 has peaked at 0.1 since (FINETUNE_LR_SCALE empty); the script trains the 0.5 one.

Usage: python bench/robust_construction/lr_theta_l1_to_l2.py   (from the project root, after the tiny zoo is built)"""
import json, torch
torch.set_num_threads(1)
from fusion_nb.robust import zoo
from fusion_nb.robust.attacks import apgd
from fusion_nb.robust.soups import SoupKitchen
from fusion_nb.tiny.zoo import deterministic
import sys
from pathlib import Path
if {'-h', '--help'} & set(sys.argv[1:]): print(__doc__); sys.exit(0)   # after the imports: --help also checks that they resolve
folder = 'data/tiny/robust/cifar10'
if not Path(folder, 'manifest.json').is_file():
    sys.exit(f"{folder} holds no robust zoo: build it first (fusion-nb reproduce --profile tiny --only 20_robust_fronts)")
b = zoo.ZooBudget(**json.load(open(f'{folder}/manifest.json'))['budget'])
m = zoo.load_zoo(folder, ['theta_l1', 'theta_l1_to_l2']); x, y = zoo.standin('cifar10', 'train', b.n_train, b.seed); xt, yt = zoo.standin('cifar10', 'test', 300)
att = {a['norm']: a for a in zoo.standin_attacks('cifar10', ('l2', 'l1'), steps=20)}
ev = lambda net: {k: round(apgd(net, xt, yt, k, a['eps'], steps=20, loss=a['loss'], seed=0).accuracy * 100, 1) for k, a in att.items()}
spec = zoo.ModelSpec('theta_l1_to_l2', ('l2',), 'theta_l1')
zoo.FINETUNE_LR_SCALE = {('cifar10', 'l1', 'l2'): 5.0}   # App. A.1's factor: θ1→2 at 0.5
with deterministic(b.threads): high = zoo.train_model(spec, 'cifar10', x, y, b, m['theta_l1'])
for name, ft in (('peak 0.5 (App. A.1)', high), ('peak 0.1 (the zoo)', m['theta_l1_to_l2'])):
    k = SoupKitchen(m['theta_l1'], {'theta_l1': m['theta_l1'], 'theta_l1_to_l2': ft})
    print(name, {w: ev(k.set({'theta_l1': w, 'theta_l1_to_l2': 1 - w})) for w in (1.0, 0.75, 0.5, 0.25, 0.0)}, flush=True)
