"""Probe two threat models: θp and θq from scratch (width W, batch B, E epochs, N training images), then θp→q fine-tuned for 1
and for 4 epochs; prints clean and p / q robust accuracy (APGD 20 steps, 300 stand-in test images). An optional last
argument sets the training attack's steps (default: App. A.1's; probe4.py, that one change, was folded in here).

Measured (2026-11-23/24, issue 13) with `16 32 20 1000 cifar10 linf,l2`, `16 32 20 1000 imagenet linf,l2` and
`16 32 20 1000 imagenet linf,l2 10`: the "θ2 from scratch", "θ∞→2, 4 epochs" and "training attacks of 10 steps" rows of
the construction table in nbs/experiments/20_robust_fronts.ipynb, "Why finding (a) fails or holds" (e.g. CIFAR-10 θ2
25.3 / 44.0; ImageNet with 10-step attacks θ∞ 56.7 / 35.0). Nothing is written.

Usage: python bench/robust_construction/probe2.py W B E N cifar10|imagenet P,Q [training attack steps]"""
import sys, time, torch
torch.set_num_threads(1)
from fusion_nb.robust.zoo import standin, standin_attacks, ModelSpec, ZooBudget, train_model
from fusion_nb.robust.attacks import apgd
if {'-h', '--help'} & set(sys.argv[1:]): print(__doc__); sys.exit(0)   # after the imports: --help also checks that they resolve
W,B,E,N = map(int, sys.argv[1:5]); ds = sys.argv[5]; norms = sys.argv[6].split(',')
AS = int(sys.argv[7]) if len(sys.argv) > 7 else None   # training attack steps (None: App. A.1's)
x,y = standin(ds,'train',N,0); xt,yt = standin(ds,'test',300)
att = {a['norm']:a for a in standin_attacks(ds,steps=20)}
def ev(n,m):
    with torch.no_grad(): c=(m(xt).argmax(1)==yt).float().mean().item()
    r={k:round(apgd(m,xt,yt,k,a['eps'],steps=20,loss=a['loss']).accuracy,3) for k,a in att.items() if k in norms}
    print(n,'clean',round(c,3),r, flush=True)
bases={}
for p in norms:
    b = ZooBudget(n_train=N, width=W, epochs=E, batch_size=B, attack_steps=AS)
    t0=time.time(); bases[p]=train_model(ModelSpec('theta_'+p,(p,)),ds,x,y,b); print('base',p,round(time.time()-t0),'s',flush=True); ev('theta_'+p,bases[p])
p,q=norms[0],norms[1]
for F in (1,4):
    b = ZooBudget(n_train=N, width=W, epochs=E, finetune_epochs=F, batch_size=B, attack_steps=AS)
    m=train_model(ModelSpec(f'theta_{p}_to_{q}',(q,),'theta_'+p),ds,x,y,b,bases[p]); ev(f'theta_{p}_to_{q} F={F}',m)
