"""Training-free merge methods against independent naive computations, edge cases, bad input and streaming.

The references below are written separately from the methods: they flatten every floating-point tensor
of a state dict into one vector with `torch.cat` (float64) and apply each paper's formula there.
"""
import itertools, math, weakref
from collections.abc import Mapping

import numpy as np
import pytest
import torch
from torch import nn

from fusion_nb.core import HyperparameterError, IncompatibleModelsError, NonFiniteError, UnknownNameError
from fusion_nb.merge import (MERGE_METHODS, merge, simple_average, weighted_average, uniform_soup, greedy_soup,
                             soup_grid_search, affine_grid, task_arithmetic, ties_merging, ties_thresholds,
                             dare_task_arithmetic, dare_ties, della, model_stock, slerp, wise_ft, ensemble, is_ensemble)
from fusion_nb.methods.registry import merge_streaming, tensor_generator

# ---------------------------------------------------------------- fixtures and references

SHAPES = {'embeddings.patch_embedding.weight': (6, 3, 2, 2), 'encoder.layers.0.self_attn.k_proj.weight': (7, 6),
          'encoder.layers.0.self_attn.k_proj.bias': (7,), 'encoder.layers.0.layer_norm1.weight': (6,),
          'logit_scale_like': ()}


def make_pool(n=3, seed=0, noise=0.2, shared=0.0):
    "pretrained + n experts; `shared` adds a common component to every task vector."
    g = torch.Generator().manual_seed(seed)
    pre = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    pre['embeddings.position_ids'] = torch.arange(4).unsqueeze(0)
    common = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    experts = {}
    for i in range(n):
        e = {k: pre[k] + noise * torch.randn(s, generator=g) + shared * common[k] for k, s in SHAPES.items()}
        e['embeddings.position_ids'] = pre['embeddings.position_ids'].clone()
        experts[f'task{i}'] = e
    return pre, experts


FLOAT_KEYS = list(SHAPES)


def vec(sd):
    return torch.cat([sd[k].double().reshape(-1) for k in FLOAT_KEYS])


def taus(pre, experts):
    "Task vectors as the methods compute them (in the models' own precision), then widened to float64."
    return torch.stack([torch.cat([(e[k] - pre[k]).double().reshape(-1) for k in FLOAT_KEYS]) for e in experts.values()])


def slices():
    out, start = {}, 0
    for k in FLOAT_KEYS:
        n = math.prod(SHAPES[k]); out[k] = slice(start, start + n); start += n
    return out


def naive_ties(pre, experts, lam, k, scope, disjoint, T=None):
    T = taus(pre, experts) if T is None else T
    if scope == 'model':
        m = math.ceil(k * T.shape[1] / 100)
        thr = T.abs().sort(dim=1, descending=True).values[:, m - 1:m]
    else:
        thr = torch.empty_like(T)
        for key, sl in slices().items():
            n = sl.stop - sl.start; m = math.ceil(k * n / 100)
            thr[:, sl] = T[:, sl].abs().sort(dim=1, descending=True).values[:, m - 1:m]
    trimmed = torch.where(T.abs() >= thr, T, torch.zeros_like(T))
    total = trimmed.sum(0)
    sign = torch.where(total >= 0, 1.0, -1.0).double()
    agree = (torch.sign(trimmed) == sign)
    s = (trimmed * agree).sum(0)
    merged = s / agree.sum(0).clamp(min=1) if disjoint == 'mean' else s
    return vec(pre) + lam * merged


def close(a, b, tol=1e-5):
    a, b = (vec(x) if isinstance(x, Mapping) else x for x in (a, b))
    assert torch.allclose(a.double(), b.double(), atol=tol, rtol=0), float((a.double() - b.double()).abs().max())


# ---------------------------------------------------------------- averaging and soups

def test_simple_and_weighted_average():
    pre, ex = make_pool(3)
    close(simple_average(pre, ex, progress=False), sum(vec(e) for e in ex.values()) / 3)
    close(uniform_soup(None, ex, progress=False), sum(vec(e) for e in ex.values()) / 3)
    w = [1.6, -0.4, -0.2]  # affine with extrapolation (negative weights)
    res = weighted_average(pre, ex, weights=w, progress=False)
    close(res, sum(wi * vec(e) for wi, e in zip(w, ex.values())))
    assert res.info['affine']
    close(weighted_average(pre, ex, weights={'task2': 2, 'task0': 2, 'task1': 0}, normalize=True, progress=False),
          (vec(ex['task0']) + vec(ex['task2'])) / 2)
    assert torch.equal(res['embeddings.position_ids'], pre['embeddings.position_ids'])


def test_soup_edge_cases():
    pre, ex = make_pool(2)
    assert torch.equal(vec(simple_average(pre, {'a': ex['task0']}, progress=False)), vec(ex['task0']))
    close(simple_average(pre, {'a': ex['task1'], 'b': ex['task1']}, progress=False), vec(ex['task1']))
    with pytest.raises(HyperparameterError, match='simple_average needs at least 1 expert'):
        simple_average(pre, {})
    with pytest.raises(HyperparameterError, match='weights has 1 values for 2 experts'):
        weighted_average(pre, ex, weights=[1.0])
    with pytest.raises(HyperparameterError, match='sum to 0'):
        weighted_average(pre, ex, weights=[1, -1], normalize=True)


def test_greedy_soup_hand_worked():
    # score: minus the distance to the average of a and b; a ranks first; c only hurts
    pool = {'c': {'w': torch.tensor([9., 9.])}, 'b': {'w': torch.tensor([0., 4.])}, 'a': {'w': torch.tensor([2., 1.])}}
    target = torch.tensor([1., 2.5])
    scores = {'a': -1.0, 'b': -1.5, 'c': -20.0}  # given on the same scale as `score`
    calls = []
    def score(sd):
        calls.append(sd['w'].clone()); return -float((sd['w'] - target).norm())
    res = greedy_soup(None, pool, score, scores=scores, progress=False)
    assert res.info['ingredients'] == ['a', 'b']
    assert torch.allclose(res['w'], target)
    assert len(calls) == 2  # (a+b) and (a+b+c): individual scores were given
    assert [h['accepted'] for h in res.info['history']] == [True, True, False]
    # strictly better only: an ingredient that leaves the score unchanged is rejected
    flat_score = greedy_soup(None, pool, lambda sd: 0.0, scores={'a': 0.0, 'b': -1.0, 'c': -2.0}, progress=False)
    assert flat_score.info['ingredients'] == ['a']


def test_affine_grid_and_grid_search():
    g = affine_grid(4)  # paper 002: weights in [-0.4, 1.4], step 0.2
    brute = [w for w in itertools.product([round(-0.4 + 0.2 * i, 10) for i in range(10)], repeat=4) if abs(sum(w) - 1) < 1e-9]
    assert sorted(g) == sorted(tuple(x + 0.0 for x in w) for w in brute)
    pool = {'a': {'w': torch.tensor([1., 0., 0.])}, 'b': {'w': torch.tensor([0., 1., 0.])}, 'c': {'w': torch.tensor([0., 0., 1.])}}
    target = torch.tensor([-0.4, 0.2, 1.2])
    res = soup_grid_search(None, pool, lambda sd: -float((sd['w'] - target).norm()), progress=False)
    assert res.info['best_weights'] == pytest.approx({'a': -0.4, 'b': 0.2, 'c': 1.2})
    assert len(res.info['results']) == len(affine_grid(3))
    with pytest.raises(HyperparameterError, match='does not divide 1'):
        affine_grid(2, step=0.3)


# ---------------------------------------------------------------- task arithmetic

@pytest.mark.parametrize('lam', [0.0, 0.3, 1.0, -0.5])
def test_task_arithmetic(lam):
    pre, ex = make_pool(4, seed=1)
    close(task_arithmetic(pre, ex, scaling_factor=lam, progress=False), vec(pre) + lam * taus(pre, ex).sum(0))


def test_task_arithmetic_edges():
    pre, ex = make_pool(2, seed=2)
    assert torch.equal(vec(task_arithmetic(pre, ex, scaling_factor=0.0, progress=False)), vec(pre))
    close(task_arithmetic(pre, {'one': ex['task0']}, scaling_factor=1.0, progress=False), vec(ex['task0']))
    close(task_arithmetic(pre, {'a': ex['task1'], 'b': ex['task1']}, progress=False), vec(pre) + 0.6 * (vec(ex['task1']) - vec(pre)))
    with pytest.raises(HyperparameterError, match='empty pool'):
        task_arithmetic(pre, {})


# ---------------------------------------------------------------- TIES

@pytest.mark.parametrize('scope,disjoint,k', [(s, d, k) for s in ['model', 'tensor'] for d in ['mean', 'sum'] for k in [20, 7.5, 100]])
def test_ties_against_naive(scope, disjoint, k):
    pre, ex = make_pool(4, seed=3)
    close(ties_merging(pre, ex, k=k, trim_scope=scope, disjoint=disjoint, scaling_factor=0.3, progress=False),
          naive_ties(pre, ex, 0.3, k, scope, disjoint))


def test_ties_threshold_is_exact_kth_largest():
    pre, ex = make_pool(3, seed=4)
    # ties and zeros: one expert equal to the pretrained model on some tensors, repeated magnitudes in another
    ex['task1']['encoder.layers.0.layer_norm1.weight'] = pre['encoder.layers.0.layer_norm1.weight'].clone()
    ex['task2']['encoder.layers.0.self_attn.k_proj.bias'] = pre['encoder.layers.0.self_attn.k_proj.bias'] + 0.5
    T = taus(pre, ex).float()
    for k in [1, 20, 50, 90, 100]:
        thr = ties_thresholds(pre, ex, k, progress=False)
        m = math.ceil(k * T.shape[1] / 100)
        for i, name in enumerate(ex):
            assert thr[name] == T[i].abs().sort(descending=True).values[m - 1].item(), (k, name)


def test_ties_float64_models():
    "float64 checkpoints: the whole-model threshold is selected on float64 bits (four passes) and stays exact."
    pre, ex = make_pool(3, seed=19)
    pre = {k: v.double() if v.is_floating_point() else v for k, v in pre.items()}
    ex = {n: {k: v.double() if v.is_floating_point() else v for k, v in e.items()} for n, e in ex.items()}
    T = taus(pre, ex)
    thr = ties_thresholds(pre, ex, 35, progress=False)
    m = math.ceil(35 * T.shape[1] / 100)
    assert [thr[n] for n in ex] == [T[i].abs().sort(descending=True).values[m - 1].item() for i in range(3)]
    res = ties_merging(pre, ex, k=35, progress=False)
    assert res['encoder.layers.0.layer_norm1.weight'].dtype == torch.float64
    close(res, naive_ties(pre, ex, 0.3, 35, 'model', 'mean'), tol=1e-12)


def test_ties_edges():
    pre, ex = make_pool(3, seed=5)
    assert torch.equal(vec(ties_merging(pre, ex, scaling_factor=0.0, progress=False)), vec(pre))
    close(ties_merging(pre, {'one': ex['task0']}, k=100, scaling_factor=1.0, progress=False), vec(ex['task0']))
    same = ties_merging(pre, {'a': ex['task1'], 'b': ex['task1'], 'c': ex['task1']}, k=40, scaling_factor=1.0, progress=False)
    close(same, naive_ties(pre, {'a': ex['task1']}, 1.0, 40, 'model', 'mean'))
    # precomputed thresholds give the same merge
    thr = ties_thresholds(pre, ex, 20, progress=False)
    assert torch.equal(vec(ties_merging(pre, ex, thresholds=thr, progress=False)), vec(ties_merging(pre, ex, progress=False)))


@pytest.mark.parametrize('k', [0, -5, 100.01, float('nan')])
def test_ties_bad_k(k):
    pre, ex = make_pool(2)
    with pytest.raises(HyperparameterError, match=r'k=') as e:
        ties_merging(pre, ex, k=k)
    assert 'out of range' in str(e.value)


def test_ties_bad_choices():
    pre, ex = make_pool(2)
    with pytest.raises(HyperparameterError, match='trim_scope'):
        ties_merging(pre, ex, trim_scope='row')
    with pytest.raises(HyperparameterError, match='disjoint'):
        ties_merging(pre, ex, disjoint='max')
    with pytest.raises(HyperparameterError, match='empty pool'):
        ties_merging(pre, {})


# ---------------------------------------------------------------- DARE

def dare_masked(pre, experts, p, seed):
    "Task vectors with the documented masks: rand(shape, tensor_generator(seed, 'dare', name, key)) >= p."
    out = []
    for name, e in experts.items():
        m = torch.cat([(torch.rand(SHAPES[k], generator=tensor_generator(seed, 'dare', name, k)) >= p).reshape(-1) for k in FLOAT_KEYS])
        out.append((vec(e) - vec(pre)) * m / (1 - p))
    return torch.stack(out)


def test_dare_task_arithmetic():
    pre, ex = make_pool(3, seed=6)
    close(dare_task_arithmetic(pre, ex, p=0.6, scaling_factor=0.4, seed=9, progress=False),
          vec(pre) + 0.4 * dare_masked(pre, ex, 0.6, 9).sum(0))
    # p = 0 is task arithmetic
    close(dare_task_arithmetic(pre, ex, p=0.0, scaling_factor=0.3, progress=False), vec(pre) + 0.3 * taus(pre, ex).sum(0))


def test_dare_structure_without_the_rule():
    "Each entry of a one-expert DARE merge is θ0 (dropped) or θ0 + λτ/(1-p) (kept); about 1-p are kept."
    torch.manual_seed(0)
    pre = {'w': torch.randn(200, 100)}
    ex = {'a': {'w': pre['w'] + torch.randn(200, 100)}}
    res = dare_task_arithmetic(pre, ex, p=0.7, scaling_factor=1.0, seed=3, progress=False)['w']
    tau = ex['a']['w'] - pre['w']
    kept = torch.isclose(res, pre['w'] + tau / 0.3, atol=1e-5)
    dropped = torch.isclose(res, pre['w'], atol=1e-6)
    assert bool((kept | dropped).all())
    assert abs(kept.float().mean().item() - 0.3) < 0.02


def test_dare_seeds():
    pre, ex = make_pool(3, seed=7)
    a = vec(dare_task_arithmetic(pre, ex, seed=1, progress=False))
    assert torch.equal(a, vec(dare_task_arithmetic(pre, ex, seed=1, progress=False)))
    assert not torch.equal(a, vec(dare_task_arithmetic(pre, ex, seed=2, progress=False)))
    b = vec(dare_ties(pre, ex, seed=1, progress=False))
    assert torch.equal(b, vec(dare_ties(pre, ex, seed=1, progress=False)))
    assert not torch.equal(b, vec(dare_ties(pre, ex, seed=2, progress=False)))


@pytest.mark.parametrize('scope', ['model', 'tensor'])
def test_dare_ties(scope):
    pre, ex = make_pool(3, seed=8)
    T = dare_masked(pre, ex, 0.3, 4)
    close(dare_ties(pre, ex, p=0.3, seed=4, k=25, scaling_factor=0.5, trim_scope=scope, disjoint='sum', progress=False),
          naive_ties(pre, ex, 0.5, 25, scope, 'sum', T=T))
    close(dare_ties(pre, ex, p=0.0, k=25, scaling_factor=0.5, trim_scope=scope, disjoint='mean', progress=False),
          naive_ties(pre, ex, 0.5, 25, scope, 'mean'))


@pytest.mark.parametrize('p', [1.0, 1.5, -0.01])
def test_dare_bad_p(p):
    pre, ex = make_pool(2)
    for fn in (dare_task_arithmetic, dare_ties):
        with pytest.raises(HyperparameterError, match=r'p=.*out of range'):
            fn(pre, ex, p=p)


# ---------------------------------------------------------------- DELLA

def della_probs(t, density, eps):
    "Row-wise rank-based keep probabilities, computed by sorting (rows: first dim, rest flattened)."
    rows = t.reshape(t.shape[0], -1) if t.dim() >= 2 else t.reshape(1, -1)
    n = rows.shape[1]
    if n == 1: return torch.full(t.shape, density, dtype=t.dtype)
    p = torch.empty_like(rows)
    for i in range(rows.shape[0]):
        order = np.argsort(rows[i].abs().numpy(), kind='stable')
        p[i, torch.from_numpy(order)] = torch.tensor([density - eps + 2 * eps * r / (n - 1) for r in range(n)], dtype=t.dtype)
    return p.reshape(t.shape)


def naive_della(pre, ex, density, eps, lam, seed):
    rows = []
    for name, e in ex.items():
        parts = []
        for k in FLOAT_KEYS:
            t = (e[k] - pre[k]).float(); p = della_probs(t, density, eps)
            keep = torch.rand(t.shape, generator=tensor_generator(seed, 'della', name, k)) < p
            parts.append((t * keep / p).double().reshape(-1))
        rows.append(torch.cat(parts))
    T = torch.stack(rows)
    sign = torch.where(T.sum(0) >= 0, 1.0, -1.0).double()
    agree = torch.sign(T) == sign
    return vec(pre) + lam * (T * agree).sum(0) / agree.sum(0).clamp(min=1)


@pytest.mark.parametrize('density,eps,lam', [(0.7, 0.07, 1.1), (0.5, 0.45, 0.4), (0.3, 0.0, 1.0)])
def test_della_against_naive(density, eps, lam):
    pre, ex = make_pool(3, seed=9)
    close(della(pre, ex, density=density, epsilon=eps, scaling_factor=lam, seed=2, progress=False),
          naive_della(pre, ex, density, eps, lam, 2))


def test_della_edges_and_seeds():
    pre, ex = make_pool(3, seed=10)
    T = taus(pre, ex)
    sign = torch.where(T.sum(0) >= 0, 1.0, -1.0).double(); agree = torch.sign(T) == sign
    close(della(pre, ex, density=1.0, epsilon=0.0, scaling_factor=1.0, progress=False),
          vec(pre) + (T * agree).sum(0) / agree.sum(0).clamp(min=1))
    assert torch.equal(vec(della(pre, ex, scaling_factor=0.0, progress=False)), vec(pre))
    a = vec(della(pre, ex, seed=1, progress=False))
    assert torch.equal(a, vec(della(pre, ex, seed=1, progress=False)))
    assert not torch.equal(a, vec(della(pre, ex, seed=2, progress=False)))


def test_della_keep_frequency_follows_rank():
    pre = {'w': torch.zeros(1, 400)}
    ex = {'a': {'w': torch.linspace(0.01, 4, 400).reshape(1, 400)}}
    kept = torch.stack([della(pre, ex, density=0.5, epsilon=0.4, scaling_factor=1.0, seed=s, progress=False)['w'] != 0
                        for s in range(200)]).float().mean(0)[0]
    assert abs(kept[:100].mean().item() - 0.2) < 0.05 and abs(kept[-100:].mean().item() - 0.8) < 0.05


@pytest.mark.parametrize('kw,msg', [(dict(density=0.0), 'density=0.0'), (dict(density=1.2), 'density=1.2'),
                                    (dict(epsilon=-0.1), 'epsilon=-0.1'), (dict(density=0.9, epsilon=0.2), 'epsilon=0.2 with density=0.9')])
def test_della_bad(kw, msg):
    pre, ex = make_pool(2)
    with pytest.raises(HyperparameterError, match=msg):
        della(pre, ex, **kw)


# ---------------------------------------------------------------- Model Stock

def naive_model_stock(pre, ex, reduction):
    out = {}
    k = len(ex)
    for key in FLOAT_KEYS:
        P = pre[key].double().numpy().ravel()
        E = [e[key].double().numpy().ravel() for e in ex.values()]
        D = [x - P for x in E]
        cos = [D[i] @ D[j] / (np.linalg.norm(D[i]) * np.linalg.norm(D[j])) for i in range(k) for j in range(i + 1, k)]
        c = np.mean(cos) if reduction == 'cosine' else np.cos(np.mean(np.arccos(np.clip(cos, -1, 1))))
        den = 1 + (k - 1) * c  # a scalar tensor's task vectors have cos = ±1: at cos = -1/(k-1) the spec keeps θ0
        t = 0.0 if abs(den) < 1e-12 else k * c / den
        out[key] = torch.from_numpy(t * np.mean(E, axis=0) + (1 - t) * P)
    return torch.cat([out[k] for k in FLOAT_KEYS])


@pytest.mark.parametrize('n,reduction', [(2, 'cosine'), (2, 'angle'), (4, 'cosine'), (4, 'angle')])
def test_model_stock(n, reduction):
    pre, ex = make_pool(n, seed=11, shared=0.3)
    close(model_stock(pre, ex, reduction=reduction, progress=False), naive_model_stock(pre, ex, reduction))


def test_model_stock_edges():
    pre, ex = make_pool(3, seed=12, shared=0.3)
    close(model_stock(pre, {'a': ex['task0'], 'b': ex['task0']}, progress=False), vec(ex['task0']))
    a = model_stock(pre, {'a': ex['task0'], 'b': ex['task1']}, reduction='cosine', progress=False)
    b = model_stock(pre, {'a': ex['task0'], 'b': ex['task1']}, reduction='angle', progress=False)
    close(a, vec(b))
    assert model_stock(pre, ex, reduction='cosine', progress=False).info['ratios'] != model_stock(pre, ex, reduction='angle', progress=False).info['ratios']
    with pytest.raises(HyperparameterError, match="model_stock needs at least 2 expert"):
        model_stock(pre, {'a': ex['task0']})


# ---------------------------------------------------------------- SLERP and WiSE-FT

def naive_slerp(a, b, t):
    out = []
    for k in FLOAT_KEYS:
        A, B = a[k].double().numpy().ravel(), b[k].double().numpy().ravel()
        c = A @ B / (np.linalg.norm(A) * np.linalg.norm(B))
        if abs(c) > 0.9995: out.append((1 - t) * A + t * B); continue
        w = np.arccos(c)
        out.append((np.sin((1 - t) * w) * A + np.sin(t * w) * B) / np.sin(w))
    return torch.from_numpy(np.concatenate(out))


@pytest.mark.parametrize('t', [0.0, 0.2, 0.5, 1.0])
def test_slerp(t):
    _, ex = make_pool(2, seed=13, noise=2.0)
    close(slerp(None, ex, t=t, progress=False), naive_slerp(ex['task0'], ex['task1'], t))


@pytest.mark.parametrize('n', [0, 1, 3])
def test_slerp_needs_two(n):
    pre, ex = make_pool(3)
    with pytest.raises(HyperparameterError, match=f'slerp merges exactly 2 expert.*got {n}'):
        slerp(pre, dict(list(ex.items())[:n]))


def test_slerp_bad_t():
    pre, ex = make_pool(2)
    with pytest.raises(HyperparameterError, match='t=1.1'):
        slerp(pre, ex, t=1.1)


@pytest.mark.parametrize('alpha', [0.0, 0.5, 0.9, 1.0])
def test_wise_ft(alpha):
    pre, ex = make_pool(1, seed=14)
    close(wise_ft(pre, ex, alpha=alpha, progress=False), (1 - alpha) * vec(pre) + alpha * vec(ex['task0']))


def test_wise_ft_bad():
    pre, ex = make_pool(2)
    with pytest.raises(HyperparameterError, match='wise_ft merges exactly 1 expert'):
        wise_ft(pre, ex)
    with pytest.raises(HyperparameterError, match='alpha=1.5'):
        wise_ft(pre, {'a': ex['task0']}, alpha=1.5)


# ---------------------------------------------------------------- ensemble, facade, registry

def test_ensemble_spec():
    pre, ex = make_pool(2)
    spec = merge('ensemble', pre, ex)
    assert is_ensemble(spec) and set(spec.members) == set(ex)
    z = {'task0': torch.tensor([[2.0, 0.0]]), 'task1': torch.tensor([[0.0, 2.0]])}
    p = (z['task0'].softmax(-1) + z['task1'].softmax(-1)) / 2
    assert torch.allclose(spec.combine_outputs(z).softmax(-1), p)


def test_facade_and_registry():
    pre, ex = make_pool(2)
    with pytest.raises(UnknownNameError, match="unknown merge method 'tie_merging'"):
        merge('tie_merging', pre, ex)
    with pytest.raises(HyperparameterError, match="no hyperparameter"):
        merge('ties_merging', pre, ex, threshold=20)
    expected = {'simple_average', 'weighted_average', 'linear', 'uniform_soup', 'greedy_soup', 'soup_grid_search',
                'task_arithmetic', 'ties_merging', 'dare', 'dare_task_arithmetic', 'dare_ties', 'della', 'model_stock',
                'slerp', 'wise_ft', 'ensemble', 'ties'}
    assert expected <= set(MERGE_METHODS.names())
    close(merge('ties_merging', pre, ex, k=30, progress=False), naive_ties(pre, ex, 0.3, 30, 'model', 'mean'))


# ---------------------------------------------------------------- errors on bad models

def test_non_finite_names_model_and_key():
    pre, ex = make_pool(2)
    ex['task1']['encoder.layers.0.self_attn.k_proj.bias'][3] = float('nan')
    for fn in (task_arithmetic, ties_merging, simple_average, model_stock):
        with pytest.raises(NonFiniteError, match=r"model 'task1': tensor 'encoder.layers.0.self_attn.k_proj.bias' holds 1 NaN"):
            fn(pre, ex, progress=False)


def test_incompatible_models():
    pre, ex = make_pool(2)
    ex['task0']['encoder.layers.0.self_attn.k_proj.weight'] = torch.zeros(7, 5)
    with pytest.raises(IncompatibleModelsError, match='k_proj.weight'):
        task_arithmetic(pre, ex, progress=False)
    _, ex2 = make_pool(2)
    del ex2['task1']['encoder.layers.0.layer_norm1.weight']
    with pytest.raises(IncompatibleModelsError, match='layer_norm1.weight'):
        ties_merging(pre, ex2, progress=False)


def test_modules_and_half_precision():
    torch.manual_seed(0)
    base, a, b = nn.Linear(4, 3), nn.Linear(4, 3), nn.Linear(4, 3)
    res = task_arithmetic(base, {'a': a, 'b': b}, scaling_factor=0.5, progress=False)
    want = {k: base.state_dict()[k] + 0.5 * (a.state_dict()[k] - base.state_dict()[k] + b.state_dict()[k] - base.state_dict()[k]) for k in res}
    for k in res: assert torch.allclose(res[k], want[k], atol=1e-6)
    half = {k: v.half() for k, v in base.state_dict().items()}
    out = simple_average(half, {'a': half}, progress=False)
    assert all(v.dtype == torch.float16 for v in out.values())


# ---------------------------------------------------------------- streaming: one tensor per model

class Counting(Mapping):
    "A state dict that hands out fresh copies and records reads and the most copies alive at once."
    def __init__(self, sd):
        self.sd, self.live, self.peak, self.reads = sd, 0, 0, {}
    def __getitem__(self, key):
        t = self.sd[key].clone()
        self.live += 1; self.peak = max(self.peak, self.live); self.reads[key] = self.reads.get(key, 0) + 1
        weakref.finalize(t, self._release)
        return t
    def _release(self): self.live -= 1
    def __iter__(self): return iter(self.sd)
    def __len__(self): return len(self.sd)
    def shape(self, key): return self.sd[key].shape
    def dtype(self, key): return self.sd[key].dtype


CALLS = {
    'task_arithmetic': lambda p, e: task_arithmetic(p, e, progress=False),
    'ties_model': lambda p, e: ties_merging(p, e, trim_scope='model', progress=False),
    'ties_tensor': lambda p, e: ties_merging(p, e, trim_scope='tensor', progress=False),
    'dare_ties': lambda p, e: dare_ties(p, e, progress=False),
    'dare_ta': lambda p, e: dare_task_arithmetic(p, e, progress=False),
    'della': lambda p, e: della(p, e, progress=False),
    'model_stock': lambda p, e: model_stock(p, e, progress=False),
    'simple_average': lambda p, e: simple_average(p, e, progress=False),
    'weighted_average': lambda p, e: weighted_average(p, e, weights=[0.5, 0.7, -0.2], progress=False),
    'slerp': lambda p, e: slerp(p, dict(list(e.items())[:2]), progress=False),
    'wise_ft': lambda p, e: wise_ft(p, dict(list(e.items())[:1]), progress=False),
    # beyond paper 000 (issue 28)
    'breadcrumbs': lambda p, e: MERGE_METHODS['breadcrumbs'](p, e, density=0.5, progress=False),
    'breadcrumbs_ties': lambda p, e: MERGE_METHODS['breadcrumbs_ties'](p, e, density=0.5, progress=False),
    'dare_linear': lambda p, e: MERGE_METHODS['dare_linear'](p, e, density=0.5, progress=False),
    'della_linear': lambda p, e: MERGE_METHODS['della_linear'](p, e, density=0.5, progress=False),
    'sce': lambda p, e: MERGE_METHODS['sce'](p, e, select_topk=0.5, progress=False),
    'nuslerp': lambda p, e: MERGE_METHODS['nuslerp'](p, dict(list(e.items())[:2]), progress=False),
    'multislerp': lambda p, e: MERGE_METHODS['multislerp'](p, e, progress=False),
    'karcher': lambda p, e: MERGE_METHODS['karcher'](p, e, progress=False),
    'consensus_ta': lambda p, e: MERGE_METHODS['consensus_ta'](p, e, progress=False),
    'consensus_ties': lambda p, e: MERGE_METHODS['consensus_ties'](p, e, progress=False),
    'pcb_model': lambda p, e: MERGE_METHODS['pcb_merging'](p, e, progress=False),
    'pcb_tensor': lambda p, e: MERGE_METHODS['pcb_merging'](p, e, scope='tensor', progress=False),
}


@pytest.mark.parametrize('name', list(CALLS))
def test_streaming_holds_one_tensor_per_model(name):
    pre, ex = make_pool(3, seed=15)
    cp, ce = Counting(pre), {n: Counting(e) for n, e in ex.items()}
    res = CALLS[name](cp, ce)
    used = dict(list(ce.items())[:{'slerp': 2, 'nuslerp': 2, 'wise_ft': 1}.get(name, len(ce))])
    assert cp.peak <= 1 and all(c.peak <= 1 for c in used.values()), (cp.peak, [c.peak for c in used.values()])
    # and the merge equals the one computed from the plain dicts
    close(res, vec(CALLS[name](pre, ex)), tol=1e-6)


def test_ties_whole_model_threshold_takes_three_streaming_reads():
    "Two radix-selection passes plus the merge pass, each reading every floating tensor once per expert."
    pre, ex = make_pool(3, seed=16)
    ce = {n: Counting(e) for n, e in ex.items()}
    ties_merging(pre, ce, trim_scope='model', progress=False)
    for c in ce.values():
        assert c.reads == {k: 3 for k in FLOAT_KEYS}
        assert c.peak == 1


def test_merge_streaming_reads_each_key_once():
    pre, ex = make_pool(2, seed=17)
    cp, ce = Counting(pre), {n: Counting(e) for n, e in ex.items()}
    merge_streaming(cp, ce, lambda key, p, ts: p, progress=False)
    assert cp.reads == {k: 1 for k in pre}  # buffers are carried from the pretrained model
    assert all(c.reads == {k: 1 for k in FLOAT_KEYS} for c in ce.values())


def test_lazy_safetensors_end_to_end(tmp_path):
    import fusion_nb.checkpoints as checkpoints   # the project's own module: a broken import must fail, not skip
    from safetensors.torch import save_file
    pre, ex = make_pool(3, seed=18)
    save_file({k: v.contiguous() for k, v in pre.items()}, str(tmp_path / 'pre.safetensors'))
    for n, e in ex.items(): save_file({k: v.contiguous() for k, v in e.items()}, str(tmp_path / f'{n}.safetensors'))
    lazy_pre = checkpoints.LazyStateDict(tmp_path / 'pre.safetensors')
    lazy_ex = {n: checkpoints.LazyStateDict(tmp_path / f'{n}.safetensors') for n in ex}
    close(ties_merging(lazy_pre, lazy_ex, progress=False), naive_ties(pre, ex, 0.3, 20, 'model', 'mean'))
    close(task_arithmetic(lazy_pre, lazy_ex, progress=False), vec(pre) + 0.3 * taus(pre, ex).sum(0))


# ---------------------------------------------------------------- mergekit's names mean mergekit's methods (issue 25, item 10)

def _mergekit_ties(pre, experts, density):
    "mergekit's `ties` by hand: per tensor keep the int(density·n) largest |τ| (topk), sign of the sum (0 → +), disjoint mean."
    out = {}
    for key, p in pre.items():
        if not p.is_floating_point(): out[key] = p; continue
        taus = torch.stack([e[key] - p for e in experts.values()]).reshape(len(experts), -1).double()
        k = max(1, int(density * taus.shape[1]))
        keep = torch.zeros_like(taus).scatter_(1, taus.abs().topk(k, dim=1).indices, 1.)
        tr = taus * keep
        sign = torch.where(tr.sum(0) >= 0, 1., -1.).double()
        agree = (tr.sign() == sign)
        out[key] = p.double() + ((tr * agree).sum(0) / agree.sum(0).clamp(min=1)).view(p.shape)
    return out


def test_ties_keeps_int_density_n_as_mergekit():
    pre, ex = make_pool(3, seed=3)
    sizes = {v.numel() for v in pre.values() if v.is_floating_point()}
    assert any(math.ceil(0.2 * n) != int(0.2 * n) for n in sizes)  # the pool has tensors where ⌈⌉ and int() differ
    for k in (20, 30, 55):
        got = merge('ties', pre, ex, k=k, progress=False)
        want = _mergekit_ties(pre, ex, k / 100)
        for key in want:
            if pre[key].is_floating_point(): assert torch.allclose(got[key].double(), want[key], atol=1e-6), (k, key)
    ceil = merge('ties', pre, ex, k=20, rounding='ceil', progress=False)  # ties_merging's count (paper 000) differs
    assert any(not torch.allclose(ceil[k_].double(), v, atol=1e-6) for k_, v in _mergekit_ties(pre, ex, .2).items() if pre[k_].is_floating_point())
    assert MERGE_METHODS['ties_merging'].defaults().get('rounding', 'ceil') == 'ceil'


def test_linear_is_mergekits_normalised_linear():
    pre, ex = make_pool(2, seed=4)
    w = {'task0': 1.0, 'task1': 3.0}
    got = merge('linear', None, ex, weights=w, progress=False)
    raw = weighted_average(None, ex, weights=w, progress=False)  # paper 002's soup: no normalisation
    for key, v in pre.items():
        if not v.is_floating_point(): continue
        by_hand = (1 * ex['task0'][key] + 3 * ex['task1'][key]) / 4
        assert torch.allclose(got[key], by_hand, atol=1e-6)
        assert torch.allclose(raw[key], 1 * ex['task0'][key] + 3 * ex['task1'][key], atol=1e-6)
    assert MERGE_METHODS['linear'].name == 'linear' and MERGE_METHODS['weighted_average'].name == 'weighted_average'
