"""Integration and bad-input tests of fusion_nb.robust.soups (paper 002 §4's soups, fast), beyond the notebook's own."""
import random

import pandas as pd
import pytest
import torch
from torch import nn

import fusion_nb.robust.soups as soups
from fusion_nb.core import HyperparameterError, IncompatibleModelsError, UnknownNameError
from fusion_nb.methods.soups import affine_grid, weighted_average
from fusion_nb.robust.soups import SoupKitchen, evaluate_soups
from conftest import bench_module


def net(seed=0, width=6):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.Flatten(), nn.Linear(width * 8 * 8, 4))
    m.train(); m(torch.rand(8, 3, 8, 8)); return m.eval()

@pytest.fixture(scope='module')
def four():
    return {f'theta{i}': net(i).state_dict() for i in range(4)}

def test_grid_of_paper_against_naive_sums(four):
    "20 soups drawn from paper 002's four-model grid (weights in [-0.4, 1.4], step 0.2): state dict and logits."
    kitchen = SoupKitchen(net(9), four)
    x = torch.rand(5, 3, 8, 8)
    for w in random.Random(0).sample(affine_grid(4), 20):
        m = kitchen.set(w)
        ref = net(9); ref.load_state_dict(weighted_average(None, four, weights=w, progress=False)); ref.eval()
        for k, v in ref.state_dict().items():
            assert torch.allclose(m.state_dict()[k].double(), v.double(), atol=1e-5), k
        with torch.no_grad(): assert torch.allclose(m(x), ref(x), atol=1e-4)
        naive = {k: sum(wi * four[n][k].double() for wi, n in zip(w, four)) for k in four['theta0'] if four['theta0'][k].is_floating_point()}
        for k, v in naive.items(): assert torch.allclose(m.state_dict()[k].double(), v, atol=1e-5), k  # Σ wᵢ θᵢ by hand

def test_ingredients_as_modules_and_tied_weights():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__(); self.emb = nn.Linear(4, 4, bias=False); self.head = nn.Linear(4, 4, bias=False); self.head.weight = self.emb.weight
        def forward(self, x): return self.head(self.emb(x))
    a, b = Tied(), Tied()
    k = SoupKitchen(Tied(), [a, b])
    m = k.set([0.25, 0.75])
    assert m.head.weight is m.emb.weight  # still tied
    assert torch.allclose(m.emb.weight, 0.25 * a.emb.weight + 0.75 * b.emb.weight)
    assert k.names == ['model_0', 'model_1']

def test_refusals(four):
    k = SoupKitchen(net(), four)
    with pytest.raises(HyperparameterError, match=r'sum to 1.2, not 1'): k.set([0.3, 0.3, 0.3, 0.3])
    with pytest.raises(HyperparameterError, match='not all finite'): k.set([float('inf'), 0, 0, 0])
    with pytest.raises(IncompatibleModelsError, match="'wide'"): SoupKitchen(net(), {**four, 'wide': net(width=7).state_dict()})
    sd = dict(four['theta0']); sd.pop('4.bias')
    with pytest.raises(IncompatibleModelsError, match="'short'"): SoupKitchen(net(), {'a': four['theta1'], 'short': sd})
    x, y = torch.rand(3, 3, 8, 8), torch.zeros(3, dtype=torch.long)
    with pytest.raises(UnknownNameError, match="unknown norm 'l3'"): evaluate_soups(k, [(1, 0, 0, 0)], x, y, [dict(norm='l3', eps=1)])
    for eps in (0, -1, float('nan')):
        with pytest.raises(HyperparameterError, match='not a valid attack radius'): evaluate_soups(k, [(1, 0, 0, 0)], x, y, [dict(norm='l2', eps=eps)])
    with pytest.raises(HyperparameterError, match="unknown: \\['nope'\\]"):
        evaluate_soups(k, [{'theta0': 1, 'theta1': 0, 'theta2': 0, 'nope': 0}], x, y, progress=False)

def test_repeated_soups_evaluated_once_and_csv(four, tmp_path, monkeypatch):
    calls = []
    real = soups.robust_accuracy
    monkeypatch.setattr(soups, 'robust_accuracy', lambda *a, **kw: calls.append(1) or real(*a, **kw))
    k = SoupKitchen(net(), four)
    x = torch.rand(6, 3, 8, 8)
    with torch.no_grad(): y = k.set([0.25] * 4)(x).argmax(1)
    grid = [(1, 0, 0, 0), (0.25, 0.25, 0.25, 0.25), (1, 0, 0, 0), {'theta0': 0.25, 'theta1': 0.25, 'theta2': 0.25, 'theta3': 0.25}]
    df = evaluate_soups(k, grid, x, y, [dict(norm='linf', eps=1 / 255, steps=2)], out=tmp_path / 'grid.csv', progress=False)
    assert len(calls) == 2 and len(df) == 4
    assert df.iloc[1]['clean'] == 1.0 and df.iloc[0].tolist() == df.iloc[2].tolist()
    assert pd.read_csv(tmp_path / 'grid.csv').shape == (4, 4 + 3)  # weights, clean, linf, union
    assert not [p for p in tmp_path.iterdir() if p.name.startswith('.')]  # no temporary file left behind

def test_throughput_bench_smoke(capsys):
    mod = bench_module('soup_throughput')
    t = mod.main(['--soups', '4', '--images', '4', '--batch', '4', '--repeat', '1', '--naive-soups', '2', '--width', '4'])
    assert set(t) == {'bare', 'inplace', 'naive', 'set', 'build'} and all(v > 0 for v in t.values())
    assert 'passes per soup' in capsys.readouterr().out

def test_fig8_selection_breaks_ties_at_random():
    "Issue 24.5: with tied soups, argmax took the first in grid order (the most extrapolated) in every trial."
    import numpy as np
    from fusion_nb.robust.soups import pick_best
    rng = np.random.default_rng(1)
    acc = np.array([0.8, 0.8, 0.6, 0.8])
    picks = [pick_best(acc, rng) for _ in range(200)]
    assert {j for j, _ in picks} == {0, 1, 3} and {t for _, t in picks} == {3}
    assert sum(j == 0 for j, _ in picks) < 120   # argmax's grid order: 200 of 200
