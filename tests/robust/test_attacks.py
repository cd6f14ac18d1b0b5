"""Integration and bad-input tests of fusion_nb.robust.attacks (paper 002's attacks), beyond the notebook's own."""
import math

import pytest
import torch
from torch import nn

from fusion_nb.core import FusionError, HyperparameterError, UnknownNameError
from fusion_nb.robust.attacks import (BUDGETS, NORMS, apgd, budget, lp_norm, pgd, project_l1, robust_accuracy,
                                      threat_models)

def convnet(classes=10, seed=0):
    "A small conv net with BatchNorm (in eval mode), on 3×8×8 images."
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, classes))
    net.train(); net(torch.rand(32, 3, 8, 8))  # non-trivial running statistics
    return net.eval()

@pytest.fixture(scope='module')
def batch():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(12, 3, 8, 8, generator=g)
    net = convnet()
    with torch.no_grad(): y = net(x).argmax(1)  # every example correct clean: all get attacked
    return net, x, y

def test_budgets_are_the_papers():
    "ε of paper 002 §4, steps and losses of App. A.1/A.2."
    eps = {(d, n): BUDGETS.loc[(d, n), 'eps'] for d, n in BUDGETS.index}
    assert eps == {('cifar10', 'linf'): 8 / 255, ('cifar10', 'l2'): 128 / 255, ('cifar10', 'l1'): 12.0,
                   ('imagenet', 'linf'): 4 / 255, ('imagenet', 'l2'): 4.0, ('imagenet', 'l1'): 255.0}
    assert [a['loss'] for a in threat_models('cifar10')] == ['dlr', 'dlr', 'ce']
    assert {a['steps'] for a in threat_models('imagenet')} == {40}
    assert [(a['steps'], a['restarts'], a['loss']) for a in threat_models('cifar10', 'strong')] == \
        [(100, 5, 'dlr-targeted'), (100, 5, 'dlr-targeted'), (100, 5, 'ce')]
    assert [a['steps'] for a in threat_models('imagenet', 'train')] == [2, 2, 20]
    assert {a['loss'] for a in threat_models('imagenet', 'train')} == {'kl'}

@pytest.mark.parametrize('norm', NORMS)
@pytest.mark.parametrize('loss', ['ce', 'dlr', 'dlr-targeted'])
def test_apgd_stays_in_threat_model(batch, norm, loss):
    net, x, y = batch
    eps = {'linf': 8 / 255, 'l2': 0.5, 'l1': 4.0}[norm]
    r = apgd(net, x, y, norm, eps, steps=5, loss=loss, restarts=2)
    assert (lp_norm(r.x_adv - x, norm) <= eps * (1 + 1e-5)).all()
    assert r.x_adv.min() >= 0 and r.x_adv.max() <= 1
    fooled = ~r.robust
    with torch.no_grad(): assert (net(r.x_adv[fooled]).argmax(1) != y[fooled]).all()  # reported adversarial examples are real
    assert all(p.grad is None for p in net.parameters()) and not net.training  # the model is left as it was

def test_attacks_are_deterministic_given_seed(batch):
    net, x, y = batch
    a, b = apgd(net, x, y, 'l1', 4.0, steps=4, seed=3), apgd(net, x, y, 'l1', 4.0, steps=4, seed=3)
    assert torch.equal(a.x_adv, b.x_adv) and torch.equal(a.robust, b.robust)

def test_misclassified_examples_are_not_robust_and_not_attacked(batch):
    net, x, y = batch
    wrong = (y + 1) % 10
    r = apgd(net, x, wrong, 'linf', 8 / 255, steps=3)
    assert not r.robust.any() and torch.equal(r.x_adv, x) and r.accuracy == 0.0

def test_l1_projection_on_images_against_bisection():
    "Batched sort-based projection vs a per-example bisection on λ, at CIFAR-10's ε₁ = 12 where the box binds."
    g = torch.Generator().manual_seed(5)
    x = torch.rand(3, 3, 32, 32, generator=g).double()
    d = torch.randn(3, 3, 32, 32, generator=g).double()
    p = project_l1(x, d, 12.0)
    for xi, di, pi in zip(x.flatten(1), d.flatten(1), p.flatten(1)):
        cap = torch.where(di >= 0, 1 - xi, xi)
        lo, hi = 0.0, float(di.abs().max())
        for _ in range(100):
            mid = (lo + hi) / 2
            if float(torch.minimum((di.abs() - mid).clamp_min(0), cap).sum()) > 12.0: lo = mid
            else: hi = mid
        ref = torch.minimum((di.abs() - hi).clamp_min(0), cap) * di.sign()
        assert torch.allclose(pi, ref, atol=1e-8)
        assert abs(float(pi.abs().sum()) - 12.0) < 1e-6  # the budget is used up exactly
        assert ((xi + pi) >= 0).all() and ((xi + pi) <= 1).all()

def test_apgd_at_least_as_strong_as_pgd_on_average():
    "On a few random small nets, APGD's mean CE at 10 steps is at least PGD's (Croce & Hein 2020, Fig. 2)."
    wins = 0
    for seed in range(3):
        net = convnet(seed=seed); x = torch.rand(16, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad(): y = net(x).argmax(1)
        ra, rp = apgd(net, x, y, 'linf', 2 / 255, steps=10, loss='ce'), pgd(net, x, y, 'linf', 2 / 255, steps=10, loss='ce')
        both = ra.robust & rp.robust
        wins += ra.accuracy <= rp.accuracy and float(ra.loss[both].mean()) >= float(rp.loss[both].mean()) - 1e-6
    assert wins >= 2

def test_union_with_paper_budgets(batch):
    net, x, y = batch
    atk = [dict(a, steps=3, restarts=1) for a in threat_models('cifar10')]
    r = robust_accuracy(net, x, y, atk, batch_size=5)
    f = r['flags']
    assert torch.equal(f['union'], f['clean'] & f['linf'] & f['l2'] & f['l1'])
    assert r['union'] <= min(r['linf'], r['l2'], r['l1']) <= r['clean'] == 1.0

@pytest.mark.parametrize('call, exc, msg', [
    (lambda n, x, y: apgd(n, x, y, 'l0', 1.0), UnknownNameError, "unknown norm 'l0'"),
    (lambda n, x, y: apgd(n, x, y, 'linf', -1.0), HyperparameterError, 'eps=-1.0 is not a valid attack radius'),
    (lambda n, x, y: pgd(n, x, y, 'l2', float('inf')), HyperparameterError, 'is not a valid attack radius'),
    (lambda n, x, y: apgd(n, x * 2, y, 'linf', 0.1), FusionError, 'inputs must lie in [0, 1]'),
    (lambda n, x, y: apgd(n, x, y[:2], 'linf', 0.1), FusionError, 'must be a batch of the same length'),
    (lambda n, x, y: apgd(n, x, y, 'linf', 0.1, loss='cw'), UnknownNameError, "unknown attack loss 'cw'"),
    (lambda n, x, y: apgd(n, x, y, 'linf', 0.1, restarts=0), HyperparameterError, 'restarts=0 is out of range'),
    (lambda n, x, y: apgd(n, x, y, 'linf', 0.1, loss='kl', steps=1) and budget('svhn', 'linf'), UnknownNameError, "no budget for dataset 'svhn'"),
    (lambda n, x, y: apgd(n, x, y, 'linf', 0.1), FusionError, 'model must be callable'),
    # issue 26 item 5: a negative step and a top-k outside (0, 1] were accepted (robust accuracy 0.625 where it is 0.0)
    (lambda n, x, y: pgd(n, x, y, 'linf', 0.1, step_size=-0.01), HyperparameterError, 'step_size=-0.01 is out of range'),
    (lambda n, x, y: pgd(n, x, y, 'l1', 1.0, topk=0), HyperparameterError, 'topk=0 is out of range'),
    (lambda n, x, y: pgd(n, x, y, 'l1', 1.0, topk=2), HyperparameterError, 'topk=2 is out of range'),
    (lambda n, x, y: pgd(n, x, y, 'l1', 1.0, topk=-1), HyperparameterError, 'topk=-1 is out of range'),
    # issue 24 item 6: no attacks meant CIFAR-10's radii, silently
    (lambda n, x, y: robust_accuracy(n, x, y), HyperparameterError, 'needs the attacks'),
])
def test_bad_input(batch, call, exc, msg):
    net, x, y = batch
    model = 'not a model' if 'callable' in msg else net
    with pytest.raises(exc, match=None) as e: call(model, x, y)
    assert msg in str(e.value)

def test_dlr_needs_three_classes():
    net = convnet(classes=2); x = torch.rand(4, 3, 8, 8)
    with pytest.raises(HyperparameterError, match='DLR loss needs at least 3 classes; the model has 2'):
        apgd(net, x, torch.zeros(4, dtype=torch.long), 'linf', 0.1, loss='dlr')
