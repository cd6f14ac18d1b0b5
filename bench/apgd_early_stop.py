#!/usr/bin/env python
"""APGD that stops stepping an example once it is misclassified (evaluation only), against APGD as it was before (commit
1fc7eeb, every example stepped to the end of the run): the time of experiment 20's attacks, and that nothing else changed.

    python bench/apgd_early_stop.py              # 3 soups × the three threat models, one thread, interleaved
    python bench/apgd_early_stop.py --soups 1

In evaluation an example misclassified at some iterate is settled (not robust; its adversarial input is that first
misclassified point), so `fusion_nb.robust.attacks._apgd_run` steps only the examples still robust. The workload is
experiment 20's inner loop on the tiny profile's CIFAR-10 stand-in zoo (the pins): APGD with the profile's steps in ℓ∞,
ℓ2 and ℓ1 on its `robust_eval_images` test images, in batches of 128, the examples classified correctly only. The
implementation before the change is read from git (`git show 1fc7eeb:fusion_nb/robust/attacks.py`) and imported beside
the package's. Prints the seconds of each, their ratio (now / before), whether every robust flag and adversarial input
is identical, and whether the training attack (`apgd_train`, which steps every example, as the robust zoo's recipe
needs) gives identical bytes on four batches of training images; exits 1 if anything differs.
"""
from __future__ import annotations
import argparse, importlib.util, subprocess, sys, tempfile, time
from pathlib import Path

import torch

from fusion_nb.reproduce.profiles import load_profile
from fusion_nb.robust import attacks as now
from fusion_nb.robust.paper_data import standin_set, to_input
from fusion_nb.robust.soups import SoupKitchen
from fusion_nb.robust.zoo import load_zoo, profile_budget, robust_zoo, standin, standin_attacks, zoo_dir, zoo_specs

REPO, BEFORE = Path(__file__).resolve().parents[1], '1fc7eeb'

def before_module():
    "The attacks module as it was at BEFORE, imported under another name (its relative imports made absolute)."
    src = subprocess.run(['git', 'show', f'{BEFORE}:fusion_nb/robust/attacks.py'], cwd=REPO, capture_output=True, text=True, check=True).stdout
    src = src.replace('from ..', 'from fusion_nb.').replace('from .', 'from fusion_nb.robust.')
    f = Path(tempfile.mkdtemp())/'attacks_before.py'; f.write_text(src)
    spec = importlib.util.spec_from_file_location('attacks_before', f); mod = importlib.util.module_from_spec(spec)
    sys.modules['attacks_before'] = mod; spec.loader.exec_module(mod)   # dataclasses look their module up there
    return mod

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--soups', type=int, default=3)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    old, P = before_module(), load_profile('tiny'); E = P.extra
    zoo = load_zoo(robust_zoo(zoo_dir(P.root, P.name, 'cifar10'), 'cifar10', zoo_specs('cifar10', E['robust_bases'].split()), profile_budget(E, 'cifar10'), progress=False))
    T = standin_set(*standin('cifar10', 'test', int(E['robust_eval_images'])))
    K = SoupKitchen(next(iter(zoo.values())), zoo)
    attacks = {t['norm']: dict(t, steps=int(E['robust_eval_steps'])) for t in standin_attacks('cifar10')}
    soups = [{'theta_linf': 1.0}, {'theta_linf': 0.5, 'theta_l2': 0.5}, {'theta_l1': 0.3, 'theta_l2': 0.7}][:a.soups]
    secs, out = {old: 0.0, now: 0.0}, {old: [], now: []}
    for w in soups:
        m = K.set({n: w.get(n, 0.0) for n in K.names})
        for norm, t in attacks.items():
            for mod in (old, now):   # interleaved: the machine's load moves both alike
                s = time.perf_counter()
                for i in range(0, len(T), 128):
                    x, y = to_input(T.x[i:i + 128], 'cpu'), T.y[i:i + 128]
                    with torch.no_grad(): ok = m(x).argmax(1) == y
                    r = mod.apgd(m, x[ok], y[ok], norm, t['eps'], steps=t['steps'], loss=t['loss'], largereps=t.get('largereps', False))
                    out[mod] += [r.robust, r.x_adv]
                secs[mod] += time.perf_counter() - s
    same_eval = all(torch.equal(p, q) for p, q in zip(out[old], out[now]))
    m, same_train = K.set({n: float(n == 'theta_linf') for n in K.names}), True
    for (norm, eps, loss), i in zip([('linf', 8/255, 'ce'), ('l2', 0.5, 'ce'), ('l1', 12.0, 'ce'), ('linf', 4/255, 'kl')], range(0, 256, 64)):
        x, y = to_input(T.x[i:i + 64], 'cpu'), T.y[i:i + 64]
        p, q = old.apgd_train(m, x, y, norm, eps, steps=10, loss=loss), now.apgd_train(m, x, y, norm, eps, steps=10, loss=loss)
        same_train &= torch.equal(p.x_adv, q.x_adv) and torch.equal(p.loss, q.loss) and torch.equal(p.robust, q.robust)
    print(f"experiment 20's attacks, {len(soups)} soup(s) × {len(attacks)} threat models on {len(T)} images: before {secs[old]:.1f} s, "
          f"now {secs[now]:.1f} s, ratio {secs[now] / secs[old]:.3f}")
    print(f"robust flags and adversarial inputs identical: {same_eval}; apgd_train (training) bytes identical: {same_train}")
    return 0 if same_eval and same_train else 1

if __name__ == '__main__': sys.exit(main())
