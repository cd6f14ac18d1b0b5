"""Issue 24.1: the evaluation APGD vs `apgd_train` as training inputs, on a ConvNet trained 4 epochs (nominally) on 300 images
of the CIFAR-10 stand-in: per threat model, how many of 100 examples stay unperturbed and the mean cross-entropy of the
inputs each attack returns (about 10 s).

Measured 2026-11-26: the evaluation APGD left the examples misclassified at the clean image unperturbed and returned the
first misclassified point, not the highest loss; this is why the robust zoo trains on `apgd_train`
(nbs/robust/50_attacks.ipynb, "APGD for training"; nbs/experiments/20_robust_fronts.ipynb, "This run: the zoo retrained
with apgd_train"). Nothing is written.

Usage: python bench/robust_construction/train_attack.py"""
import time, torch, torch.nn.functional as F
from fusion_nb.robust.models import convnet, adversarial_train
from fusion_nb.robust.zoo import standin, standin_eps
from fusion_nb.robust.attacks import apgd, apgd_train, lp_norm
import sys
if {'-h', '--help'} & set(sys.argv[1:]): print(__doc__); sys.exit(0)   # after the imports: --help also checks that they resolve
torch.set_num_threads(1)
x, y = standin('cifar10', 'train', 300)
t = time.time(); m = adversarial_train(convnet(16), x, y, None, epochs=4, batch_size=32, seed=0)
print(f'nominal convnet, 4 epochs on 300 images: {time.time() - t:.0f}s')
xb, yb = x[:100], y[:100]
for n in ('linf', 'l2', 'l1'):
    e = standin_eps('cifar10', n)
    ev = apgd(m, xb, yb, n, e, steps=10, loss='ce'); tr = apgd_train(m, xb, yb, n, e, steps=10, loss='ce')
    with torch.no_grad(): ce = {k: float(F.cross_entropy(m(r.x_adv), yb)) for k, r in (('eval', ev), ('train', tr))}
    un = {k: int((lp_norm(r.x_adv - xb, n) == 0).sum()) for k, r in (('eval', ev), ('train', tr))}
    print(f'{n} eps={e:.4g}: unperturbed of 100: eval apgd {un["eval"]}, apgd_train {un["train"]}; mean CE of the training inputs: eval apgd {ce["eval"]:.3f}, apgd_train {ce["train"]:.3f}')
