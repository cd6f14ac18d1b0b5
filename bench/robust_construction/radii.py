"""Per-threat-model radius rule of the stand-ins (nbs/robust/53_zoo): a nominally trained stand-in ConvNet's robust
accuracy at 1, 2, 4, 8 × each radius carried per pixel from paper 002 (§4), for both stand-ins.
Measured with `300 20 80` (2026-11-24): nbs/robust/53_zoo.ipynb, the stand-ins' radii (the nominal CIFAR-10 model at
92.3 % clean; ×4 per pixel is the smallest factor that breaks it), the rule `fusion_nb.robust.zoo.standin_eps` applies.
Nothing is written.

Usage: python bench/robust_construction/radii.py [test images=300] [APGD steps=20] [epochs=80]"""
import sys, torch
torch.set_num_threads(1)
from fusion_nb.core import seed_everything
from fusion_nb.robust.attacks import NORMS, apgd, budget
from fusion_nb.robust.models import adversarial_train, convnet
from fusion_nb.robust.zoo import PAPER_SIDE, STANDINS, ZooBudget, standin
from fusion_nb.tiny.zoo import deterministic
if {'-h', '--help'} & set(sys.argv[1:]): print(__doc__); sys.exit(0)   # after the imports: --help also checks that they resolve
N, S, E = (int(a) for a in (sys.argv[1:] + ['300', '20', '80'][len(sys.argv) - 1:])[:3])
b = ZooBudget(batch_size=32, epochs=E)   # the tiny profile's budget (settings.ini: robust_width 16, robust_batch_size 32, 1000 images)
per_pixel = lambda ds, n: budget(ds, n)['eps'] * {'linf': 1, 'l2': 32 / PAPER_SIDE[ds], 'l1': (32 / PAPER_SIDE[ds]) ** 2}[n]
with deterministic(1):
    for ds in STANDINS:
        x, y = standin(ds, 'train', b.n_train); xt, yt = standin(ds, 'test', N)
        seed_everything(b.seed)
        m = adversarial_train(convnet(b.width, STANDINS[ds]), x, y, None, epochs=b.epochs, batch_size=b.batch_size, lr=b.lr).eval()
        with torch.no_grad(): print(ds, 'nominal clean', round(float((m(xt).argmax(1) == yt).float().mean()) * 100, 1), flush=True)
        for n in NORMS:
            accs = {f: round(apgd(m, xt, yt, n, f * per_pixel(ds, n), steps=S, loss=budget(ds, n)['loss'], seed=0).accuracy * 100, 1) for f in (1, 2, 4, 8)}
            rule = min([f for f, a in accs.items() if a <= 10], default=None)
            print(ds, n, 'per-pixel eps', round(per_pixel(ds, n), 4), 'robust % at ×1, ×2, ×4, ×8:', accs, '→ factor', rule, flush=True)
