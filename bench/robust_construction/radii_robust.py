"""The ImageNet stand-in's radius rule on adversarially trained models (issue 48, item 2; notebook 20's proposal).

Paper 002's ImageNet ℓ∞-robust models keep about half of their clean accuracy under the ℓ∞ attack at ε∞ = 4/255
(RobustBench, AutoAttack: ViT-B/16 of Mo et al. 2022 34.40 of 68.38 = 0.50; ResNet-50 of Salman et al. 2020 34.96 of
64.02 = 0.55; paper 002's own ViT-B/16 is 76.88 % clean, Table 1, its robust accuracy only in Fig. 2). The stand-in's θ∞,
trained and attacked at ×4 the per-pixel radius, keeps about nine tenths, so a fine-tune to another threat model keeps
θ∞'s ℓ∞ robustness and the fronts have nothing to trade. Two measurements:

    python bench/robust_construction/radii_robust.py zoo [images=300] [steps=20]
        the tiny ImageNet zoo as built (data/tiny/robust/imagenet, restored from pins/ when absent): clean and
        robust accuracy of θ∞, θ∞→2, θ∞→1 at the zoo's radii, and of θ∞ at 1.5, 2, 3, 4 × those radii
    python bench/robust_construction/radii_robust.py train F [F …] [--images 300] [--steps 20]
        θ∞ trained from scratch with the tiny zoo's budget at F × the per-pixel radius (the zoo: F = 8, before
        issue 48 F = 4), and its θ∞→2 fine-tune: clean, ℓ∞, ℓ2 robust accuracy at that radius, and ℓ∞ robust / clean

    python bench/robust_construction/radii_robust.py cost OLD_DIR [images=300] [steps=20]
        what the radii cost experiment 20: the seconds of its attacks (ℓ∞, ℓ2, ℓ1 APGD on the test images) on θ∞,
        θ∞→2 and θ∞→1 of the zoo as built (×8) against the same models of another zoo (OLD_DIR holds their
        .safetensors, e.g. the ×4 pins: `git show 51e28c8:pins/tiny/robust/imagenet/theta_linf.safetensors`), each
        attacked at its own zoo's radii, alternating, twice; ratio new / old

Nothing is written (the `zoo` mode restores the pinned zoo under data/tiny when it is absent, as experiment 20 would).
Measured 2026-12-02 (one thread, beside other jobs): `zoo 300 20` on the ×4 zoo (θ∞ 95.7 % clean, 88.7 % ℓ∞: 0.93) and
on the ×8 zoo (θ∞ 93.0 % clean, 60.7 % ℓ∞: 0.65); `train 16` (θ∞ 73.3 % clean, 0.3 % ℓ∞: 0.00; 155 s);
`cost <×4 pins> 300 20`: the ×8 zoo's attacks take 58.7 s against the ×4 zoo's 73.1 s (0.80: more examples fall early).
Results: nbs/robust/53_zoo.ipynb (the rule) and nbs/experiments/20_robust_fronts.ipynb (the claims table).
Those runs trained θ∞ for 80 epochs; since 2026-12-04 the ImageNet stand-in's budget is 160 (`robust_epochs_imagenet`),
which `train` now uses."""
import sys, time, torch
torch.set_num_threads(1)
from fusion_nb.core import seed_everything
from fusion_nb.reproduce.profiles import load_profile
from fusion_nb.robust import zoo as Z
from fusion_nb.robust.attacks import NORMS, apgd
from fusion_nb.tiny.zoo import deterministic
if {'-h', '--help'} & set(sys.argv[1:]) or len(sys.argv) < 2: print(__doc__); sys.exit(0)   # after the imports: --help checks them

def opt(name, default):
    "`--name value` from argv (removed), else `default`."
    if f'--{name}' in sys.argv: i = sys.argv.index(f'--{name}'); v = sys.argv[i + 1]; del sys.argv[i:i + 2]; return int(v)
    return default

def measure(model, xt, yt, scale, steps, norms=NORMS):
    "Clean and robust accuracy (%) of `model` at `scale` × the stand-in's radii (relative to the module's present scale)."
    with torch.no_grad(): clean = float((model(xt).argmax(1) == yt).float().mean()) * 100
    r = {'clean': round(clean, 1)}
    for a in Z.standin_attacks('imagenet', norms, steps=steps, eps_factor=scale):
        r[a['norm']] = round(apgd(model, xt, yt, a['norm'], a['eps'], steps=steps, loss=a['loss'], seed=0).accuracy * 100, 1)
    return r

mode = sys.argv[1]
N, S = opt('images', 300), opt('steps', 20)
xt, yt = Z.standin('imagenet', 'test', N)
P = load_profile('tiny')
b = Z.profile_budget(P.extra, 'imagenet')
if mode == 'zoo':
    N, S = (int(a) for a in (sys.argv[2:] + ['300', '20'][len(sys.argv) - 2:])[:2])
    xt, yt = Z.standin('imagenet', 'test', N)
    folder = Z.robust_zoo(Z.zoo_dir(P.root, 'tiny', 'imagenet'), 'imagenet', Z.zoo_specs('imagenet'), b, progress=False)
    zoo = Z.load_zoo(folder, ['theta_linf', 'theta_linf_to_l2', 'theta_linf_to_l1', 'theta_nominal'])
    print('radius factor per pixel', Z.STANDIN_RADIUS_SCALE['imagenet'], '| eps', {n: round(Z.standin_eps('imagenet', n), 4) for n in NORMS}, flush=True)
    for n, m in zoo.items(): print(n, 'at the zoo radii:', measure(m, xt, yt, 1.0, S), flush=True)
    for f in (1.5, 2, 3, 4):
        r = measure(zoo['theta_linf'], xt, yt, f, S, ['linf'])
        print(f'theta_linf at {f} x the zoo radii:', r, '| linf / clean', round(r['linf'] / r['clean'], 2), flush=True)
elif mode == 'train':
    factors = [float(f) for f in sys.argv[2:]]
    x, y = Z.standin('imagenet', 'train', b.n_train, b.seed)
    base = Z.STANDIN_RADIUS_SCALE['imagenet']
    for f in factors:
        Z.STANDIN_RADIUS_SCALE['imagenet'] = f   # standin_eps reads it: training and attack radii both at f × per pixel
        with deterministic(1):
            t0 = time.time(); t = Z.train_model(Z.ModelSpec('theta_linf', ('linf',)), 'imagenet', x, y, b).eval(); t_theta = time.time() - t0
            t0 = time.time(); t2 = Z.train_model(Z.ModelSpec('theta_linf_to_l2', ('l2',), 'theta_linf'), 'imagenet', x, y, b, t).eval(); t_ft = time.time() - t0
        r, r2 = measure(t, xt, yt, 1.0, S, ['linf', 'l2']), measure(t2, xt, yt, 1.0, S, ['linf', 'l2'])
        print(f'factor {f}: theta_linf {r} linf/clean {r["linf"] / r["clean"]:.2f} ({t_theta:.0f} s) | theta_linf_to_l2 {r2} ({t_ft:.0f} s)', flush=True)
    Z.STANDIN_RADIUS_SCALE['imagenet'] = base
elif mode == 'cost':
    from pathlib import Path
    from safetensors.torch import load_file
    old_dir, N, S = Path(sys.argv[2]), *(int(a) for a in (sys.argv[3:] + ['300', '20'][len(sys.argv) - 3:])[:2])
    xt, yt = Z.standin('imagenet', 'test', N)
    names = ['theta_linf', 'theta_linf_to_l2', 'theta_linf_to_l1']
    new = Z.load_zoo(Z.robust_zoo(Z.zoo_dir(P.root, 'tiny', 'imagenet'), 'imagenet', Z.zoo_specs('imagenet'), b, progress=False), names)
    old = {n: Z.convnet(b.width, Z.STANDINS['imagenet']) for n in names}
    for n, m in old.items(): m.load_state_dict(load_file(str(old_dir/f'{n}.safetensors'))); m.eval()
    scale, seconds = Z.STANDIN_RADIUS_SCALE['imagenet'], {'old': 0.0, 'new': 0.0}
    old_scale = 4.0   # the zoo before issue 48
    for rep in range(2):
        for which, zoo, f in (('old', old, old_scale / scale), ('new', new, 1.0)):
            t0 = time.time()
            for m in zoo.values(): measure(m, xt, yt, f, S)
            seconds[which] += time.time() - t0
    print({k: round(v, 1) for k, v in seconds.items()}, 'new / old', round(seconds['new'] / seconds['old'], 2), flush=True)
else: print(__doc__); sys.exit(2)
