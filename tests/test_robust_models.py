"""End to end over fusion_nb.robust: robust models built on the CIFAR-10 stand-in, souped in place, evaluated under attack."""
import json

import pytest
import torch

from fusion_nb.core import FusionError, HyperparameterError
from fusion_nb.robust.attacks import threat_models
from fusion_nb.robust.models import adversarial_train, build_robust_models, cifar10_standin, convnet, load_robust_models
from fusion_nb.robust.soups import SoupKitchen, evaluate_soups
from fusion_nb.methods.soups import affine_grid

@pytest.fixture(scope='module')
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp('robust') / 'models'
    return build_robust_models(out, bases=('linf', 'l1'), targets=('linf', 'l1'), n_train=40, n_test=20, width=4, epochs=1,
                               finetune_epochs=1, attack_steps=2, eval_steps=2, batch_size=20, progress=False)

def test_manifest_and_models(built):
    man = json.loads((built / 'manifest.json').read_text())
    assert list(man['models']) == ['theta_linf', 'theta_linf_to_l1', 'theta_l1', 'theta_l1_to_linf']
    assert man['eps'] == {'linf': 8 / 255, 'l2': 128 / 255, 'l1': 12.0}  # paper 002 §4, CIFAR-10
    assert not [p for p in built.parent.iterdir() if p.name.startswith('.')]  # written atomically: no temporary folder left
    models = load_robust_models(built)
    assert set(models) == set(man['models']) and all(not m.training for m in models.values())

def test_soups_of_a_model_and_its_finetuned_copy(built):
    "Paper 002 §4.2's three-model simplex (here two bases), souped in place and attacked with the CIFAR-10 budgets."
    models = load_robust_models(built)
    pair = {n: models[n] for n in ('theta_linf', 'theta_linf_to_l1')}
    kitchen = SoupKitchen(convnet(4), pair)
    x, y = cifar10_standin('test', 10)
    atk = [dict(a, steps=2) for a in threat_models('cifar10')]
    df = evaluate_soups(kitchen, affine_grid(2, 0, 1, 0.5), x, y, atk, union_only=True, progress=False)
    assert df[['theta_linf', 'theta_linf_to_l1']].values.tolist() == [[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]]
    assert (df.union <= df.clean).all()
    with torch.no_grad():  # the endpoints are the saved models themselves
        assert df.clean.iloc[2] == float((models['theta_linf'](x).argmax(1) == y).float().mean())

def test_bad_input(tmp_path):
    x, y = cifar10_standin('train', 8)
    with pytest.raises(HyperparameterError, match='not a valid attack radius'):
        adversarial_train(convnet(4), x, y, 'l2', eps=0.0, epochs=1, batch_size=8)
    with pytest.raises(FusionError, match='has no manifest.json'): load_robust_models(tmp_path)
    with pytest.raises(HyperparameterError, match='bases is empty'): build_robust_models(tmp_path / 'x', bases=[])
