# probe a benchmark construction: width W, batch B, E epochs from scratch, fine-tunes of F epochs
import sys, time, torch
torch.set_num_threads(1)
from fusion_nb.robust.zoo import standin, standin_attacks, ModelSpec, ZooBudget, train_model
from fusion_nb.robust.attacks import apgd
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
