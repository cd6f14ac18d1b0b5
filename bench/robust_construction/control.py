# control: continue θ∞ with the SAME threat model (θ∞→∞, the fine-tune recipe) and compare with θ∞→2
import time, torch
torch.set_num_threads(1)
from fusion_nb.robust.zoo import load_zoo, standin, standin_attacks, standin_eps, ModelSpec, ZooBudget, train_model
from fusion_nb.robust.attacks import apgd
import json
folder='data/tiny/robust/cifar10'
zoo=load_zoo(folder, ['theta_linf','theta_linf_to_l2'])
man=json.load(open(folder+'/manifest.json')); b=ZooBudget(**man['budget'])
x,y=standin('cifar10','train',b.n_train,b.seed)
t0=time.time()
ctrl=train_model(ModelSpec('theta_linf_to_linf',('linf',),'theta_linf'),'cifar10',x,y,b,zoo['theta_linf'])
print('control trained', time.time()-t0)
xt,yt=standin('cifar10','test',300)
att={a['norm']:a for a in standin_attacks('cifar10',steps=20)}
for n,m in [('theta_linf',zoo['theta_linf']),('theta_linf_to_l2',zoo['theta_linf_to_l2']),('theta_linf_to_linf(ctrl)',ctrl)]:
    with torch.no_grad(): c=(m(xt).argmax(1)==yt).float().mean().item()
    r={k:apgd(m,xt,yt,k,a['eps'],steps=20,loss=a['loss']).accuracy for k,a in att.items() if k!='l1'}
    print(n,'clean',round(c,3),r, flush=True)
# train accuracy under attack of base (fit?)
m=zoo['theta_linf']
with torch.no_grad(): print('train clean', (m(x).argmax(1)==y).float().mean().item())
print('train linf', apgd(m,x[:300],y[:300],'linf',att['linf']['eps'],steps=10,loss='ce').accuracy)
