"""What each fine-tune of a robust zoo as built does to robustness: the property paper 002's (check) rows rely on (issue 48).

    python bench/robust_construction/moves.py cifar10 [images=300] [steps=20]

For every base θp and fine-tune θp→q of the stand-in's zoo (data/tiny/robust/<dataset>, restored from pins/ when absent, as
experiment 20 would): clean accuracy and ℓ∞ / ℓ2 / ℓ1 robust accuracy (APGD with the experiment's losses and radii), then per
fine-tune what (check) asks (p-robustness lost, q-robustness gained, each against the 0.7-point margin) and how close the
fine-tune's q-robustness comes to the base trained against q from scratch (θq, where the zoo has it): paper 002 (§3, after
Croce & Hein 2022, its [6]) builds its fronts on fine-tunes that become robust in the new threat model within a few epochs.
Each base's own-threat robust / clean is printed too (RobustBench, CIFAR-10 ResNet-50 of Engstrom et al. 2019: ℓ∞ 8/255
49.25 of 87.03 = 0.57, ℓ2 0.5 69.24 of 90.83 = 0.76; model_info/cifar10/{Linf,L2}/Engstrom2019Robustness.json).
Nothing is written. Measured 2026-12-03 on the pinned zoo (`cifar10 300 20`, 44 s, one thread, beside a zoo build): θ∞ 0.63, θ2 0.76,
θ1 0.67 own-threat robust / clean; five fine-tunes move (check)'s way and come within 2.0–6.3 points of the from-scratch base,
θ1→2 (App. A.1's peak rate 0.5) loses clean 70.3 → 57.3, ℓ1 47.0 → 30.7 and ℓ2 55.7 → 43.0 (θ2 67.0). Quoted in
nbs/experiments/20_robust_fronts.ipynb (why (check) fails on CIFAR-10)."""
import sys, time, torch
torch.set_num_threads(1)
from fusion_nb.reproduce.profiles import load_profile
from fusion_nb.robust import zoo as Z
from fusion_nb.robust.attacks import NORMS, apgd
if {'-h', '--help'} & set(sys.argv[1:]) or len(sys.argv) < 2: print(__doc__); sys.exit(0)   # after the imports: --help checks them

dataset = sys.argv[1]
N, S = (int(a) for a in (sys.argv[2:] + ['300', '20'][len(sys.argv) - 2:])[:2])
P = load_profile('tiny'); b = Z.profile_budget(P.extra, dataset)
xt, yt = Z.standin(dataset, 'test', N)
specs = Z.zoo_specs(dataset, P.extra.get('robust_bases', 'linf l2 l1').split())   # the bases the profile trains, as experiment 20
folder = Z.robust_zoo(Z.zoo_dir(P.root, 'tiny', dataset), dataset, specs, b, progress=False)
names = [s.name for s in specs if s.name.startswith('theta_') and '_eps' not in s.name and 'nominal' not in s.name]
zoo = Z.load_zoo(folder, names)
attacks = {a['norm']: a for a in Z.standin_attacks(dataset, NORMS, steps=S)}
t0, acc = time.time(), {}
for n, m in zoo.items():
    with torch.no_grad(): acc[n] = {'clean': float((m(xt).argmax(1) == yt).float().mean()) * 100}
    for k, a in attacks.items(): acc[n][k] = apgd(m, xt, yt, k, a['eps'], steps=S, loss=a['loss'], seed=0).accuracy * 100
    print(n, {k: round(v, 1) for k, v in acc[n].items()}, flush=True)
print(f'{len(zoo)} models attacked in {time.time() - t0:.0f} s ({N} images, APGD {S} steps); eps', {k: round(a["eps"], 4) for k, a in attacks.items()})
margin = 2 * 100 / N + 1e-3   # experiment 20's: more than two of the N images (0.67 points at 300)
for p in NORMS:
    if f'theta_{p}' in acc: print(f'theta_{p}: own-threat robust / clean {acc[f"theta_{p}"][p] / acc[f"theta_{p}"]["clean"]:.2f}')
for n in names:
    if '_to_' not in n: continue
    p, q = n.removeprefix('theta_').split('_to_'); a, f = acc[f'theta_{p}'], acc[n]
    lost, gained = a[p] - f[p], f[q] - a[q]
    scratch = f"; θ{q} from scratch {acc[f'theta_{q}'][q]:.1f} (fine-tune − scratch {f[q] - acc[f'theta_{q}'][q]:+.1f})" if f'theta_{q}' in acc else ''
    print(f"θ{p}→{q}: {p} {a[p]:.1f} → {f[p]:.1f} (lost {lost:+.1f}), {q} {a[q]:.1f} → {f[q]:.1f} (gained {gained:+.1f}), "
          f"clean {a['clean']:.1f} → {f['clean']:.1f}{scratch} | (check) {'holds' if lost > margin and gained > margin else 'fails'}")
