"""Cost and effect of App. A.2's strong protocol (APGD 100 steps × 5 restarts, targeted DLR for ℓ∞/ℓ2) against the
20-step evaluation attack, on the tiny CIFAR-10 zoo (data/tiny/robust/cifar10, as experiment 20 builds it) for two soups
(θ∞ alone, and the 1/3 soup of θ∞, θ∞→2 and θ∞→1) on 100 test images: robust % and seconds per threat model.

Measured 2026-11-23/24 (issue 13); its numbers were not recorded. The decision they informed is settings.ini's: the tiny
profile attacks Fig. 3/10's simplices with the standard attack (robust_simplex_attack = eval), the robust-soups profile
with the strong one, and experiment 20's `robust_simplex_attack` parameter chooses. Nothing is written.

Usage: python bench/robust_construction/strong.py   (from the project root, after the tiny zoo is built)"""
import time, torch
torch.set_num_threads(1)
from fusion_nb.robust.zoo import load_zoo, standin, standin_attacks
from fusion_nb.robust.attacks import apgd, budget, NORMS
from fusion_nb.robust.soups import SoupKitchen
import sys
from pathlib import Path
if {'-h', '--help'} & set(sys.argv[1:]): print(__doc__); sys.exit(0)   # after the imports: --help also checks that they resolve
if not Path('data/tiny/robust/cifar10', 'manifest.json').is_file():
    sys.exit("data/tiny/robust/cifar10 holds no robust zoo: build it first (fusion-nb reproduce --profile tiny --only 20_robust_fronts)")
zoo = load_zoo('data/tiny/robust/cifar10', ['theta_linf', 'theta_linf_to_l2', 'theta_linf_to_l1'])
k = SoupKitchen(zoo['theta_linf'], zoo)
x, y = standin('cifar10', 'test', 100)
ev = {a['norm']: a for a in standin_attacks('cifar10', steps=20)}
for w in ({'theta_linf': 1.0}, {'theta_linf': 1/3, 'theta_linf_to_l2': 1/3, 'theta_linf_to_l1': 1/3}):
    m = k.set({n: w.get(n, 0.0) for n in k.names})
    with torch.no_grad(): c = m(x).argmax(1) == y
    for n in NORMS:
        row = {}
        for proto in ('eval', 'strong'):
            a = ev[n] if proto == 'eval' else dict(budget('cifar10', n, 'strong'), eps=ev[n]['eps'])
            t0 = time.time(); r = apgd(m, x[c], y[c], n, a['eps'], steps=a['steps'], loss=a['loss'], restarts=a.get('restarts', 1))
            row[proto] = (round(100 * float(r.robust.sum()) / len(y), 1), round(time.time() - t0, 1))
        print({k2: round(v, 2) for k2, v in w.items()}, n, 'robust % / seconds: eval', row['eval'], 'strong', row['strong'], flush=True)
