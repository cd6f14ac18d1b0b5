"""Are a zoo's bases converged? For each base θp of the zoo experiment 20 built (data/tiny/robust/DATASET, its budget
read from the manifest), fine-tune a control θp→p (the fine-tune recipe, against p again) and print θp, θp→p and every
θp→q under the three attacks (APGD 20 steps) on 300 test images, and θp's robust accuracy on 300 of its training images.
Usage: python bench/robust_construction/control.py [cifar10|imagenet]"""
import json, sys, torch
torch.set_num_threads(1)
from fusion_nb.robust.attacks import apgd
from fusion_nb.robust.zoo import ModelSpec, ZooBudget, load_zoo, model_name, standin, standin_attacks, train_model
from fusion_nb.tiny.zoo import deterministic
ds = sys.argv[1] if len(sys.argv) > 1 else 'cifar10'
folder = f'data/tiny/robust/{ds}'; man = json.load(open(f'{folder}/manifest.json')); b = ZooBudget(**man['budget'])
zoo = load_zoo(folder); x, y = standin(ds, 'train', b.n_train, b.seed); xt, yt = standin(ds, 'test', 300)
att = {a['norm']: a for a in standin_attacks(ds, steps=20)}
ev = lambda m, xx, yy: {k: round(apgd(m, xx, yy, k, a['eps'], steps=20, loss=a['loss'], seed=0).accuracy * 100, 1) for k, a in att.items()}
print(ds, 'budget', man['budget'], flush=True)
for p in [n.removeprefix('theta_') for n in zoo if n.startswith('theta_') and '_to_' not in n and n != 'theta_nominal']:
    base = zoo[f'theta_{p}']
    with deterministic(b.threads): ctrl = train_model(ModelSpec(model_name(p, p), (p,), f'theta_{p}'), ds, x, y, b, base)
    print(f'theta_{p} (test)', ev(base, xt, yt), '| on 300 training images', ev(base, x[:300], y[:300]), flush=True)
    print(f'theta_{p}_to_{p} (control)', ev(ctrl, xt, yt), flush=True)
    for n in [n for n in zoo if n.startswith(f'theta_{p}_to_') and '_eps' not in n]: print(n, ev(zoo[n], xt, yt), flush=True)
