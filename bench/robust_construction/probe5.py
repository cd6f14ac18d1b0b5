"""Is θ∞ converged on the ImageNet stand-in? θ∞ from scratch (width 16, batch 32, 20 epochs, 1000 images) against the
θ∞→∞ control (4 more epochs against ℓ∞, the fine-tune recipe); prints clean and ℓ∞ / ℓ2 robust accuracy (APGD 20 steps,
300 test images). The first argument sets the training attack's steps (0: App. A.1's); two optional ones shrink the run
for a check (training images, epochs).

Measured (2026-11-24, issue 13) with `0`: the ImageNet "θ∞→∞ control (4 epochs, ℓ∞ again)" row of the construction table
in nbs/experiments/20_robust_fronts.ipynb (55.3 / 31.0 against θ∞'s 47.3 / 27.0: "4 more epochs against ℓ∞ alone added
8 points"), which led to 80 epochs (settings.ini, robust_epochs). Nothing is written.

Usage: python bench/robust_construction/probe5.py ATTACK_STEPS [N=1000] [EPOCHS=20]"""
import sys, time, torch
torch.set_num_threads(1)
from fusion_nb.robust.zoo import standin, standin_attacks, ModelSpec, ZooBudget, train_model
from fusion_nb.robust.attacks import apgd
if {'-h', '--help'} & set(sys.argv[1:]): print(__doc__); sys.exit(0)   # after the imports: --help also checks that they resolve
AS = int(sys.argv[1]) or None
N, E = (int(a) for a in (sys.argv[2:] + ['1000', '20'][len(sys.argv) - 2:])[:2])   # the measured run: 1000 images, 20 epochs
b = ZooBudget(n_train=N, width=16, epochs=E, finetune_epochs=4, batch_size=32, attack_steps=AS)
x,y = standin('imagenet','train',N,0); xt,yt = standin('imagenet','test',300)
att = {a['norm']:a for a in standin_attacks('imagenet',steps=20)}
def ev(n,m):
    with torch.no_grad(): c=(m(xt).argmax(1)==yt).float().mean().item()
    print(n,'clean',round(c,3),{k:round(apgd(m,xt,yt,k,a['eps'],steps=20,loss=a['loss']).accuracy,3) for k,a in att.items() if k!='l1'}, flush=True)
base=train_model(ModelSpec('theta_linf',('linf',)),'imagenet',x,y,b); ev('theta_linf',base)
ev('theta_linf_to_linf (control, 4 epochs)', train_model(ModelSpec('theta_linf_to_linf',('linf',),'theta_linf'),'imagenet',x,y,b,base))
