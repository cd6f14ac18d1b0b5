"Issue 24.1 measured: training inputs of the evaluation APGD vs apgd_train on a briefly trained ConvNet (CIFAR-10 stand-in)."
# run: PYTHONPATH=$PWD OMP_NUM_THREADS=1 python bench/robust_construction/train_attack.py  (about 10 s)
import time, torch, torch.nn.functional as F
from fusion_nb.robust.models import convnet, adversarial_train
from fusion_nb.robust.zoo import standin, standin_eps
from fusion_nb.robust.attacks import apgd, apgd_train, lp_norm
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
