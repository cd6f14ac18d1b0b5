"""End to end over fusion_nb.robust: robust models built on the CIFAR-10 stand-in by the zoo's one builder, souped in place, evaluated under attack."""
import json

import pytest
import torch

from fusion_nb.core import FusionError, HyperparameterError
from fusion_nb.robust.attacks import threat_models
from fusion_nb.robust.models import adversarial_train, cifar10_standin, convnet
from fusion_nb.robust.soups import SoupKitchen, evaluate_soups
from fusion_nb.robust.zoo import ModelSpec, ZooBudget, load_zoo, robust_zoo, zoo_specs
from fusion_nb.methods.soups import affine_grid

SPECS = [ModelSpec('theta_linf', ('linf',)), ModelSpec('theta_linf_to_l1', ('l1',), 'theta_linf'),
         ModelSpec('theta_l1', ('l1',)), ModelSpec('theta_l1_to_linf', ('linf',), 'theta_l1')]

@pytest.fixture(scope='module')
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp('robust') / 'models'
    return robust_zoo(out, 'cifar10', SPECS, ZooBudget(n_train=40, width=4, epochs=1, finetune_epochs=1, attack_steps=2, batch_size=20), progress=False)

def test_manifest_and_models(built):
    man = json.loads((built / 'manifest.json').read_text())
    assert list(man['models']) == ['theta_linf', 'theta_linf_to_l1', 'theta_l1', 'theta_l1_to_linf']
    assert man['eps'] == {'linf': 8 / 255, 'l2': 128 / 255, 'l1': 12.0}  # paper 002 §4, CIFAR-10 (the stand-in keeps them)
    assert not [p for p in built.iterdir() if p.name.endswith('.tmp')]  # written atomically: no temporary file left
    models = load_zoo(built)
    assert set(models) == set(man['models']) and all(not m.training for m in models.values())

def test_soups_of_a_model_and_its_finetuned_copy(built):
    "Paper 002 §4.2's soups of a base and its fine-tune, souped in place and attacked with the CIFAR-10 budgets."
    models = load_zoo(built)
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
    with pytest.raises(FusionError, match='no readable manifest.json'): load_zoo(tmp_path)
    with pytest.raises(HyperparameterError, match='bases is empty'): zoo_specs('cifar10', bases=())
