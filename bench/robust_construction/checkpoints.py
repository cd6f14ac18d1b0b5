"""App. A.1's checkpoint selection, measured: models of a stand-in's robust zoo retrained (fine-tunes from their pinned base)
with every epoch's checkpoint kept, scored on validation images in the model's threat model, and attacked on test images.

    python bench/robust_construction/checkpoints.py cifar10 [val_images=300] [test_images=300] [steps=20] [names ...] [--epochs E]

Names: the zoo's models (default: its single-threat-model fine-tunes; a base such as theta_l1 is trained from scratch, its
`robust_epochs` with the step schedule, so it takes minutes).

`--epochs E` trains the fine-tunes E epochs instead of the profile's `robust_finetune_epochs`, and `--lr-scale F` every
model at F times its peak rate (the zoo's rate factors kept); with either the last epoch is not the pinned model, and is
attacked as it comes out (fine-tunes still start from the pinned bases).

Paper 002, App. A.1 (CIFAR-10): "We select checkpoints according to robustness on a validation set as suggested by [37]"
(Rice et al. 2020). The zoo keeps every model's last epoch (experiments 20 and 21 say so in their tables' titles). This
script asks what the paper's procedure would change, fine-tune by fine-tune: the validation robustness (APGD with App. A.1's
training steps, the fine-tune's own threat model, `val_images` of the stand-in's validation split) of each epoch's
checkpoint, the epoch selection picks (highest validation robustness; the last on ties), and that checkpoint's clean and
ℓ∞ / ℓ2 / ℓ1 robust accuracy on `test_images` test images (APGD `steps`, the experiment's losses and radii) beside the last
epoch's. The models are trained by the zoo's own `train_model`, each epoch's checkpoint kept by its `on_epoch` hook; the last
epoch is checked to equal the pinned model bit for bit, so the checkpoints are those of the zoo's own training.
Nothing is written. The zoo is data/tiny/robust/<dataset> (restored from pins/ when absent).

Measured 2026-12-04 on the pinned CIFAR-10 zoo of that day, θ1→2 at App. A.1's 0.5 (one thread, beside other jobs; quoted in nbs/experiments/20_robust_fronts.ipynb,
after "Why (check) fails on CIFAR-10"): `cifar10` (421 s): the last epoch equals the pinned model for all six fine-tunes;
selection keeps it for five, θ1→∞ epoch 3 of 4 (one validation image ahead); θ1→2's validation ℓ2 13.3, 37.0, 43.0, 45.3,
so it keeps the failing last epoch. `cifar10 theta_l1_to_l2 --epochs 10` (118 s): ℓ2 52.3 on test against θ1's 55.7.
`cifar10 --lr-scale 0.25` (1,026 s): θ1→2 at 0.125 moves (ℓ1 47.0 → 33.7, ℓ2 55.7 → 59.0), θ∞→2 at 0.025 no longer gains ℓ2
(62.3 → 62.0). `cifar10 theta_linf theta_l2 theta_l1`: θ∞ selected at epoch 59 of 80 (test ℓ∞ 51.0, as the last), θ2 at 54
(test ℓ2 65.7 against 67.0); θ1 stopped unfinished.
"""
import sys, time, torch
from dataclasses import replace
torch.set_num_threads(1)
from fusion_nb.reproduce.profiles import load_profile
from fusion_nb.robust import zoo as Z
from fusion_nb.robust.attacks import NORMS, apgd
from fusion_nb.robust.models import convnet, training_attacks
from fusion_nb.tiny.zoo import deterministic
if {'-h', '--help'} & set(sys.argv[1:]) or len(sys.argv) < 2: print(__doc__); sys.exit(0)   # after the imports: --help checks them

dataset, rest = sys.argv[1], sys.argv[2:]
def option(flag, kind):
    if flag not in rest: return None
    v = kind(rest.pop(rest.index(flag) + 1)); rest.remove(flag); return v
E, LRS = option('--epochs', int), option('--lr-scale', float)
nums = [a for a in rest if a.isdigit()]; only = [a for a in rest if not a.isdigit()]
NV, NT, S = (int(a) for a in (nums + ['300', '300', '20'][len(nums):])[:3])
P = load_profile('tiny'); b = Z.profile_budget(P.extra, dataset)
pinned_budget, b = b, replace(b, finetune_epochs=E or b.finetune_epochs, lr=b.lr * (LRS or 1))
specs = Z.zoo_specs(dataset, P.extra.get('robust_bases', 'linf l2 l1').split())
folder = Z.robust_zoo(Z.zoo_dir(P.root, 'tiny', dataset), dataset, specs, pinned_budget, progress=False)
one_threat = {s.name for s in specs if len(s.norms) == 1 and s.eps_factor == 1}   # scored in their own threat model
if (bad := [n for n in only if n not in one_threat]):
    sys.exit(f"not a model of the {dataset} zoo trained against one threat model at its radius: {', '.join(bad)}. Models: {', '.join(sorted(one_threat))}")
fts = [s for s in specs if s.name in (only or one_threat) and (only or s.start)]
x, y = Z.standin(dataset, 'train', b.n_train, b.seed)
xv, yv = Z.standin(dataset, 'validation', NV); xt, yt = Z.standin(dataset, 'test', NT)
test_attacks = {a['norm']: a for a in Z.standin_attacks(dataset, NORMS, steps=S)}

def score(m):
    "Clean and robust test accuracy (%)."
    with torch.no_grad(): out = {'clean': float((m(xt).argmax(1) == yt).float().mean()) * 100}
    for k, a in test_attacks.items(): out[k] = apgd(m, xt, yt, k, a['eps'], steps=S, loss=a['loss'], seed=0).accuracy * 100
    return {k: round(v, 1) for k, v in out.items()}

def train_with_checkpoints(spec, start):
    "train_model, the validation robustness of each epoch's checkpoint recorded (App. A.1's training attack, the model's own threat model)."
    eps = {n: Z.standin_eps(dataset, n) * spec.eps_factor for n in spec.norms}
    a = training_attacks(list(spec.norms), dataset, eps, b.attack_steps)[0]; val = []
    def record(epoch, model):
        rob = apgd(model.eval(), xv, yv, a['norm'], a['eps'], steps=a['steps'], loss=a['loss'], seed=0).accuracy * 100
        val.append((round(rob, 1), {k: v.clone() for k, v in model.state_dict().items()}))
    return Z.train_model(spec, dataset, x, y, b, start, on_epoch=record), val

t0 = time.time()
for s in fts:
    pinned = Z.load_zoo(folder, [n for n in (s.start, s.name) if n])
    with deterministic(b.threads): model, val = train_with_checkpoints(s, pinned[s.start] if s.start else None)
    same = 'not compared (--epochs / --lr-scale)' if E or LRS else all(torch.equal(v, pinned[s.name].state_dict()[k]) for k, v in model.state_dict().items())
    best = max(range(len(val)), key=lambda e: (val[e][0], e))
    p, q = (s.start or '').removeprefix('theta_'), s.norms[0]
    print(f'{s.name} (peak lr {Z.peak_lr(s, dataset, b.lr)}): last epoch equals the pinned model: {same}; '
          f'validation {q} robust by epoch {[v for v, _ in val]} → selected epoch {best + 1} of {len(val)}', flush=True)
    ck = convnet(b.width, Z.STANDINS[dataset]); ck.load_state_dict(val[best][1]); ck.eval()
    base, last, sel = score(pinned[s.start]) if s.start else None, score(model if E or LRS else pinned[s.name]), score(ck) if best < len(val) - 1 else None
    print((f'  base {base}\n' if base else '') + f'  last {last}' + (f'\n  selected {sel}' if sel else '  (selected = last)'), flush=True)
    chosen = sel or last
    if not s.start: continue
    print(f'  (check) with the selected checkpoint: {p} {base[p]} → {chosen[p]} (lost {base[p] - chosen[p]:+.1f}), '
          f'{q} {base[q]} → {chosen[q]} (gained {chosen[q] - base[q]:+.1f}); margin {2 * 100 / NT:.2f}', flush=True)
print(f'{len(fts)} models in {time.time() - t0:.0f} s ({NV} validation, {NT} test images, APGD {S} steps)')
