"""Probe a construction of the robust zoo: θ∞ from scratch (width W, batch B, E epochs, N training images), then θ∞→2 and
θ∞→∞ (the control: the fine-tune recipe against ℓ∞ again) fine-tuned for F epochs; prints each model's clean accuracy,
ℓ∞ / ℓ2 robust accuracy (APGD 20 steps, 300 stand-in test images) and θ∞'s ℓ∞ robustness on 300 of its training images.

Measured (2026-11-23/24, issue 13; committed 2026-11-24) with `16 32 20 1 1000` (this folder's README recorded only these
arguments; F = 4 gives the 4-epoch rows): the CIFAR-10 rows of the construction table in
nbs/experiments/20_robust_fronts.ipynb, "Why finding (a) fails or holds" (e.g. width 16: θ∞ 34.7 / 46.7, θ∞→2 after
1 epoch 33.7 / 47.3); the width-8, batch-128 rows and "θ∞ 24 % ℓ∞-robust on its own training images" are its output at
those sizes (settings.ini's comment on robust_width). Nothing is written.

Usage: python bench/robust_construction/probe.py W B E F N [cifar10|imagenet]"""
import sys, time, torch
torch.set_num_threads(1)
from fusion_nb.robust.zoo import standin, standin_attacks, ModelSpec, ZooBudget, train_model
from fusion_nb.robust.attacks import apgd
if {'-h', '--help'} & set(sys.argv[1:]): print(__doc__); sys.exit(0)   # after the imports: --help also checks that they resolve
W,B,E,F,N = map(int, sys.argv[1:6]); ds = sys.argv[6] if len(sys.argv) > 6 else 'cifar10'
b = ZooBudget(n_train=N, width=W, epochs=E, finetune_epochs=F, batch_size=B)
x,y = standin(ds,'train',N,0); xt,yt = standin(ds,'test',300)
att = {a['norm']:a for a in standin_attacks(ds,steps=20)}
def ev(n,m):
    with torch.no_grad(): c=(m(xt).argmax(1)==yt).float().mean().item()
    r={k:round(apgd(m,xt,yt,k,a['eps'],steps=20,loss=a['loss']).accuracy,3) for k,a in att.items() if k!='l1'}
    rt=round(apgd(m,x[:300],y[:300],'linf',att['linf']['eps'],steps=10,loss='ce').accuracy,3)
    print(n,'clean',round(c,3),r,'train-linf',rt, flush=True)
t0=time.time(); base=train_model(ModelSpec('theta_linf',('linf',)),ds,x,y,b); print('base',round(time.time()-t0),'s',flush=True); ev('theta_linf',base)
for q in ('l2','linf'):
    t0=time.time(); m=train_model(ModelSpec('theta_linf_to_'+q,(q,),'theta_linf'),ds,x,y,b,base); print('ft',q,round(time.time()-t0),'s'); ev('theta_linf_to_'+q,m)
