"""θ1→2 on the CIFAR-10 stand-in at App. A.1's peak rate for it (0.5) and at the other fine-tunes' 0.1, from the zoo's θ1
(data/tiny/robust/cifar10 as experiment 20 built it): ℓ1 / ℓ2 robust accuracy (APGD 20 steps, 300 test images) along
the front w·θ1 + (1 − w)·θ1→2. Usage: python bench/robust_construction/lr_theta_l1_to_l2.py"""
import json, torch
torch.set_num_threads(1)
from fusion_nb.robust import zoo
from fusion_nb.robust.attacks import apgd
from fusion_nb.robust.soups import SoupKitchen
from fusion_nb.tiny.zoo import deterministic
folder = 'data/tiny/robust/cifar10'; b = zoo.ZooBudget(**json.load(open(f'{folder}/manifest.json'))['budget'])
m = zoo.load_zoo(folder, ['theta_l1', 'theta_l1_to_l2']); x, y = zoo.standin('cifar10', 'train', b.n_train, b.seed); xt, yt = zoo.standin('cifar10', 'test', 300)
att = {a['norm']: a for a in zoo.standin_attacks('cifar10', ('l2', 'l1'), steps=20)}
ev = lambda net: {k: round(apgd(net, xt, yt, k, a['eps'], steps=20, loss=a['loss'], seed=0).accuracy * 100, 1) for k, a in att.items()}
spec = zoo.ModelSpec('theta_l1_to_l2', ('l2',), 'theta_l1')
zoo.FINETUNE_LR_SCALE = {}   # every fine-tune at the base rate 0.1
with deterministic(b.threads): low = zoo.train_model(spec, 'cifar10', x, y, b, m['theta_l1'])
for name, ft in (('peak 0.5 (the zoo)', m['theta_l1_to_l2']), ('peak 0.1', low)):
    k = SoupKitchen(m['theta_l1'], {'theta_l1': m['theta_l1'], 'theta_l1_to_l2': ft})
    print(name, {w: ev(k.set({'theta_l1': w, 'theta_l1_to_l2': 1 - w})) for w in (1.0, 0.75, 0.5, 0.25, 0.0)}, flush=True)
