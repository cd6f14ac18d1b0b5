"""fusion_nb.robust.zoo and the MAX / SAT training of fusion_nb.robust.models: behaviour, caching, bad input."""
import json

import pytest
import torch
import torch.nn.functional as F

import fusion_nb.robust.models as M
import fusion_nb.robust.zoo as Z
from fusion_nb.core import FusionError, HyperparameterError, UnknownNameError
from fusion_nb.robust.models import adversarial_train, convnet, perturb_batch, training_attacks
from fusion_nb.robust.zoo import STANDIN_RADIUS_SCALE, ModelSpec, ZooBudget, load_zoo, robust_zoo, standin, standin_eps, zoo_specs

TINY = ZooBudget(n_train=24, width=4, epochs=1, finetune_epochs=1, attack_steps=1, batch_size=12)

def count_attacks(monkeypatch):
    calls = []
    real = M.apgd_train
    def spy(model, x, y, norm, eps, **kw): calls.append((norm, len(x))); return real(model, x, y, norm, eps, **kw)
    monkeypatch.setattr(M, 'apgd_train', spy)
    return calls

@pytest.mark.parametrize('combine,per_batch', [('max', 2), ('sat', 1)])
def test_max_attacks_every_threat_model_sat_one(monkeypatch, combine, per_batch):
    calls = count_attacks(monkeypatch)
    x, y = standin('cifar10', 'train', 24)
    adversarial_train(convnet(4), x, y, ('linf', 'l1'), combine=combine, epochs=2, batch_size=12, attack_steps=1)
    assert len(calls) == 4 * per_batch and all(n == 12 for _, n in calls)   # 2 epochs × 2 batches
    if combine == 'max': assert [c[0] for c in calls] == ['linf', 'l1'] * 4
    else: assert {c[0] for c in calls} <= {'linf', 'l1'}

def test_sat_draws_both_threat_models(monkeypatch):
    calls = count_attacks(monkeypatch)
    x, y = standin('cifar10', 'train', 40)
    adversarial_train(convnet(4), x, y, ('linf', 'l2'), combine='sat', epochs=10, batch_size=10, attack_steps=1)
    drawn = [c[0] for c in calls]
    assert len(drawn) == 40 and 8 <= drawn.count('linf') <= 32   # uniform over 40 draws: both, neither dominating

def test_max_takes_each_examples_worst():
    model = convnet(4, 12).eval(); x, y = standin('imagenet', 'train', 16)
    atk = training_attacks(['l2', 'l1'], 'imagenet', eps={'l2': 0.5, 'l1': 5.0}, attack_steps=2)
    out = perturb_batch(model, x, y, atk, 'max', seed=3)
    each = [perturb_batch(model, x, y, [a], seed=3) for a in atk]
    with torch.no_grad(): ce = torch.stack([F.cross_entropy(model(e), y, reduction='none') for e in each])
    for i in range(len(y)): assert torch.equal(out[i], each[int(ce[:, i].argmax())][i])
    with torch.no_grad(): assert (F.cross_entropy(model(out), y, reduction='none') >= ce.max(0).values - 1e-6).all()

def test_single_norm_training_unchanged_by_sequence_form():
    "A one-element sequence of threat models is the same training as the threat model itself."
    x, y = standin('cifar10', 'train', 24)
    torch.manual_seed(0); a = adversarial_train(convnet(4), x, y, 'linf', epochs=1, batch_size=12, attack_steps=1)
    torch.manual_seed(0); b = adversarial_train(convnet(4), x, y, ['linf'], combine='sat', epochs=1, batch_size=12, attack_steps=1)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))

def test_standin_radii():
    # ImageNet: the same perturbation per pixel, then ×8 so that an ℓ∞-trained stand-in model keeps about half its clean
    # accuracy under attack, as the paper's ImageNet models do (53_zoo's rule, step 3; ×4 broke only a nominal model)
    assert STANDIN_RADIUS_SCALE == {'cifar10': 1, 'imagenet': 8}
    assert standin_eps('imagenet', 'linf') == pytest.approx(8 * 4 / 255)
    assert standin_eps('imagenet', 'l2') == pytest.approx(8 * 4 * 32 / 224)          # ℓ2 scales with √d
    assert standin_eps('imagenet', 'l1') == pytest.approx(8 * 255 * (32 / 224) ** 2)  # ℓ1 with d
    assert standin_eps('cifar10', 'l1') == 12.0 and standin_eps('cifar10', 'linf') == pytest.approx(8 / 255)

def test_radii_are_part_of_the_recipe(monkeypatch):
    import fusion_nb.robust.zoo as Z
    specs, b = Z.zoo_specs('imagenet')[:2], ZooBudget()
    before = Z._recipes('imagenet', specs, b)
    monkeypatch.setitem(Z.STANDIN_RADIUS_SCALE, 'imagenet', 2)
    after = Z._recipes('imagenet', specs, b)
    assert all(before[n] != after[n] for n in before)   # other radii: a stale cached model is retrained

def test_specs_cover_the_paper():
    c = {s.name for s in zoo_specs('cifar10', ('linf', 'l2', 'l1'))}
    assert {f'theta_{p}_to_{q}' for p in ('linf', 'l2', 'l1') for q in ('linf', 'l2', 'l1') if p != q} <= c   # Fig. 1, 3, 10
    assert {'max_linf_l2', 'sat_linf_l1', 'max_l2_l1', 'max_linf_l2_l1'} <= c
    i = {s.name: s for s in zoo_specs('imagenet', ('l2',))}   # ImageNet: ℓ∞ base only, whatever is asked
    assert 'theta_l2' not in i and {'theta_linf_to_nominal', 'theta_nominal', 'theta_linf_to_linf_eps2', 'theta_linf_to_l1_eps4'} <= set(i)
    assert i['theta_linf_to_l2_eps2'].eps_factor == 0.5 and i['theta_nominal'].norms == ()

def test_zoo_cached_and_incremental(tmp_path, monkeypatch):
    specs = [ModelSpec('theta_linf', ('linf',)), ModelSpec('theta_linf_to_nominal', (), 'theta_linf')]
    z = robust_zoo(tmp_path/'z', 'imagenet', specs, TINY, progress=False)
    trained = []   # one adversarial_train call per model trained (train_model itself is part of the recipe's code digest)
    real = Z.adversarial_train
    monkeypatch.setattr(Z, 'adversarial_train', lambda model, *a, **k: trained.append(1) or real(model, *a, **k))
    robust_zoo(z, 'imagenet', specs, TINY, progress=False)
    assert len(trained) == 0                                        # cached
    robust_zoo(z, 'imagenet', specs + [ModelSpec('theta_linf_to_l2', ('l2',), 'theta_linf')], TINY, progress=False)
    assert len(trained) == 1                                        # only the new one
    before = (z/'theta_linf.safetensors').read_bytes()
    (z/'theta_linf.safetensors').unlink()
    robust_zoo(z, 'imagenet', specs, TINY, progress=False)
    assert len(trained) == 2                                        # the lost model only: its fine-tunes' recipes still hold ...
    assert (z/'theta_linf.safetensors').read_bytes() == before      # ... because the same recipe gives the same weights
    man = json.loads((z/'manifest.json').read_text())
    assert man['eps']['l2'] == pytest.approx(8 * 4 / 7) and man['classes'] == 12   # per pixel, ×8 (STANDIN_RADIUS_SCALE)
    assert list(load_zoo(z)) == ['theta_linf', 'theta_linf_to_nominal']   # the manifest lists the last call's models

def test_bad_input(tmp_path):
    with pytest.raises(UnknownNameError, match="unknown dataset 'svhn'"): zoo_specs('svhn')
    with pytest.raises(HyperparameterError, match='declared twice'):
        robust_zoo(tmp_path/'z', 'cifar10', [ModelSpec('a'), ModelSpec('a')], TINY)
    with pytest.raises(FusionError, match='no readable manifest'): load_zoo(tmp_path)
    x, y = standin('cifar10', 'train', 8)
    with pytest.raises(HyperparameterError, match='one radius for 2 threat models'):
        adversarial_train(convnet(4), x, y, ('linf', 'l2'), eps=0.1, epochs=1)
    with pytest.raises(UnknownNameError, match="unknown combine 'mean'"):
        adversarial_train(convnet(4), x, y, ('linf', 'l2'), combine='mean', epochs=1, batch_size=8, attack_steps=1)

def test_training_inputs_are_eq2s_maximiser():
    "Issue 24.1: every training example is attacked (the misclassified ones too) and carries the highest-loss iterate."
    model = convnet(4).eval(); x, y = standin('cifar10', 'train', 16)
    with torch.no_grad(): wrong = model(x).argmax(1) != y
    assert wrong.any()
    for a in training_attacks(['linf', 'l2', 'l1'], attack_steps=3):
        xa = perturb_batch(model, x, y, [a])
        assert ((xa - x).flatten(1).abs().amax(1) > 0).all(), a['norm']   # the evaluation attack left `wrong` at x
        with torch.no_grad(): ce_adv, ce = (F.cross_entropy(model(v), y, reduction='none') for v in (xa, x))
        assert (ce_adv >= ce - 1e-6).all()   # the highest-loss iterate is never below the clean start

def test_nominal_ingredient_gets_its_100_epochs(monkeypatch):
    "Issue 24.4: θ∞→nominal was fine-tuned on the robust fine-tunes' short schedule; §5 / App. A.1 give it 100 epochs."
    seen = {}
    monkeypatch.setattr(Z, 'adversarial_train', lambda model, x, y, norm, **kw: seen.setdefault(norm, kw['epochs']) and model)
    b = ZooBudget(n_train=4, width=2, epochs=3, finetune_epochs=2, batch_size=4)
    specs = {s.name: s for s in zoo_specs('imagenet')}
    x, y = torch.rand(4, 3, 32, 32), torch.zeros(4, dtype=torch.long)
    Z.train_model(specs['theta_linf_to_nominal'], 'imagenet', x, y, b, start=convnet(2, 12))
    Z.train_model(specs['theta_linf_to_l2'], 'imagenet', x, y, b, start=convnet(2, 12))
    Z.train_model(specs['theta_linf'], 'imagenet', x, y, b)
    assert seen == {None: 100, ('l2',): 2, ('linf',): 3}
