# control on the ImageNet stand-in: θ∞ continued with ℓ∞ (θ∞→∞, the fine-tune recipe) vs θ∞ — does more training alone raise ℓ∞ and ℓ2?
import sys, time, torch
torch.set_num_threads(1)
from fusion_nb.robust.zoo import standin, standin_attacks, ModelSpec, ZooBudget, train_model
from fusion_nb.robust.attacks import apgd
AS = int(sys.argv[1]) or None
b = ZooBudget(n_train=1000, width=16, epochs=20, finetune_epochs=4, batch_size=32, attack_steps=AS)
x,y = standin('imagenet','train',1000,0); xt,yt = standin('imagenet','test',300)
att = {a['norm']:a for a in standin_attacks('imagenet',steps=20)}
def ev(n,m):
    with torch.no_grad(): c=(m(xt).argmax(1)==yt).float().mean().item()
    print(n,'clean',round(c,3),{k:round(apgd(m,xt,yt,k,a['eps'],steps=20,loss=a['loss']).accuracy,3) for k,a in att.items() if k!='l1'}, flush=True)
base=train_model(ModelSpec('theta_linf',('linf',)),'imagenet',x,y,b); ev('theta_linf',base)
ev('theta_linf_to_linf (control, 4 epochs)', train_model(ModelSpec('theta_linf_to_linf',('linf',),'theta_linf'),'imagenet',x,y,b,base))
