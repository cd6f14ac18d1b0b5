import sys, time, torch
torch.set_num_threads(1)
from fusion_nb.robust.zoo import standin, standin_attacks, ModelSpec, ZooBudget, train_model
from fusion_nb.robust.attacks import apgd
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
