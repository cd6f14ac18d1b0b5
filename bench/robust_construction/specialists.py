"""Are the stand-ins' threat models distinct at given radius factors? Trains the tiny profile's bases and fine-tunes
(width 16, batch 32, 20 + 4 epochs, 1000 images, App. A.1's training attacks) with each radius multiplied by a factor
and prints every model's robust accuracy under the three attacks (APGD 20 steps) and the θp↔θp→q fronts at w = 1, .5, 0.
Usage: python bench/robust_construction/specialists.py DATASET 'linf=2 l2=2 l1=1' [test images=300] [width=16] [bases=linf,l2,l1] [fronts=1] [epochs=20] [control=0]
(factors multiply fusion_nb.robust.zoo.standin_eps as it is in the package)

Measured (2026-11-24, issue 13): nbs/experiments/20_robust_fronts.ipynb, "80 epochs": three changes that did not make θ2
more ℓ2-robust than θ∞ — doubling the ℓ∞ and ℓ2 radii (`'linf=2 l2=2'`: θ∞ / θ2 ℓ2 28.7 / 29.0 %), width 32 (48.3 / 47.3 %),
a class-correlated grating (TEXTURE=6,…/7,…; at 80 epochs θ∞ more ℓ2-robust than θ2, 67.0 / 61.0 % and 68.3 / 64.0 %) —
so none was adopted. Nothing is written."""
import sys, time, torch
torch.set_num_threads(1)
from fusion_nb.robust import zoo
from fusion_nb.robust.attacks import NORMS, apgd, budget
from fusion_nb.robust.soups import SoupKitchen
from fusion_nb.tiny.zoo import deterministic
if {'-h', '--help'} & set(sys.argv[1:]): print(__doc__); sys.exit(0)   # after the imports: --help also checks that they resolve
ds, fac = sys.argv[1], {k: float(v) for k, v in (a.split('=') for a in sys.argv[2].split())}
N = int(sys.argv[3]) if len(sys.argv) > 3 else 300
W = int(sys.argv[4]) if len(sys.argv) > 4 else 16
BASES = sys.argv[5].split(',') if len(sys.argv) > 5 else None
FRONTS = int(sys.argv[6]) if len(sys.argv) > 6 else 1
EPOCHS = int(sys.argv[7]) if len(sys.argv) > 7 else 20
CONTROL = int(sys.argv[8]) if len(sys.argv) > 8 else 0   # also θp→p: 4 more epochs against p (is the base converged?)
_eps = zoo.standin_eps
zoo.standin_eps = lambda d, n, side=32: _eps(d, n, side) * fac.get(n, 1.0)   # train_model reads the module's standin_eps
eps = {n: zoo.standin_eps(ds, n) for n in NORMS}; print(ds, 'radii', {n: round(e, 4) for n, e in eps.items()}, flush=True)
b = zoo.ZooBudget(batch_size=32, width=W, epochs=EPOCHS)
x, y = zoo.standin(ds, 'train', b.n_train); xt, yt = zoo.standin(ds, 'test', N)
import os, math
if os.environ.get('TEXTURE'):   # a class-correlated grating over the image: amplitude a (of 255), cue probability p, cycles per image f
    a, pc, f = (float(v) for v in os.environ['TEXTURE'].split(','))
    def texture(x, y, seed):
        g = torch.Generator().manual_seed(seed); k = int(y.max()) + 1
        cls = torch.where(torch.rand(len(y), generator=g) < pc, y, torch.randint(k, (len(y),), generator=g))
        th = cls.float() * math.pi / k; ph = torch.rand(len(y), generator=g) * 2 * math.pi
        i, j = torch.meshgrid(torch.arange(32.), torch.arange(32.), indexing='ij')
        wave = torch.sin(2 * math.pi * f * (i[None] * torch.cos(th)[:, None, None] + j[None] * torch.sin(th)[:, None, None]) / 32 + ph[:, None, None])
        return (x + a / 255 * wave[:, None]).clamp(0, 1)
    x, xt = texture(x, y, 1), texture(xt, yt, 2)
    print('texture', a, pc, f, flush=True)
def ev(m):
    return {n: round(apgd(m.eval(), xt, yt, n, e, steps=20, loss=budget(ds, n)['loss'], seed=0).accuracy * 100, 1) for n, e in eps.items()}
bases = BASES or (NORMS if ds == 'cifar10' else ('linf',))
models, res = {}, {}
with deterministic(1):
    for p in bases:
        t0 = time.time(); models[f'theta_{p}'] = zoo.train_model(zoo.ModelSpec(f'theta_{p}', (p,)), ds, x, y, b)
        res[f'theta_{p}'] = ev(models[f'theta_{p}']); print(f'theta_{p}', round(time.time() - t0), 's', res[f'theta_{p}'], flush=True)
    for p in bases:
        for q in ([p] if CONTROL else []) + [n for n in NORMS if n != p]:
            s = zoo.ModelSpec(zoo.model_name(p, q), (q,), f'theta_{p}')
            models[s.name] = zoo.train_model(s, ds, x, y, b, models[f'theta_{p}']); res[s.name] = ev(models[s.name]); print(s.name, res[s.name], flush=True)
    for p in bases if FRONTS else ():
        for q in NORMS:
            if q == p: continue
            a, c = f'theta_{p}', zoo.model_name(p, q); k = SoupKitchen(models[a], {a: models[a], c: models[c]})
            print('front', a, '→', c, {w: ev(k.set({a: w, c: 1 - w})) for w in (0.75, 0.5, 0.25)}, flush=True)
