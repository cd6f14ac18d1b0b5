# cost and effect of App. A.2's strong protocol (robust_simplex_attack = strong) on the tiny CIFAR-10 zoo, one soup (θ∞ alone and the 1/3 soup)
import time, torch
torch.set_num_threads(1)
from fusion_nb.robust.zoo import load_zoo, standin, standin_attacks
from fusion_nb.robust.attacks import apgd, budget, NORMS
from fusion_nb.robust.soups import SoupKitchen
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
