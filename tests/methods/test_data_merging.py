"Fisher merging and RegMean: the merge rules against closed forms, the statistics against naive loops, and end to end on the micro benchmark."
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fusion_nb.core import HyperparameterError, NonFiniteError
from fusion_nb.methods.registry import MERGE_METHODS, MergedStateDict
from fusion_nb.methods.fisher_merging import fisher_information, fisher_merge, fisher_merging, fisher_norm
from fusion_nb.methods.regmean import reduce_non_diagonal, regmean, regmean_grams, regmean_merge

D64 = torch.float64

def rand_gram(g, d=3, rows=6):
    a = torch.randn(rows, d, generator=g, dtype=D64)
    return a.T @ a / rows

# ---------------------------------------------------------------- RegMean rule

def test_regmean_one_expert_returns_it_for_any_gram():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, 3, generator=g, dtype=D64)
    for alpha in (0.0, 0.3, 0.95, 1.0):
        torch.testing.assert_close(regmean_merge([w], [rand_gram(g)], reduce_non_diagonal_ratio=alpha), w, rtol=0, atol=1e-10)

def test_regmean_identical_grams_give_the_average():
    g = torch.Generator().manual_seed(2)
    ws = [torch.randn(2, 3, generator=g, dtype=D64) for _ in range(4)]
    gram = rand_gram(g)
    torch.testing.assert_close(regmean_merge(ws, [gram] * 4), sum(ws) / 4, rtol=0, atol=1e-10)

def test_regmean_alpha_one_matches_explicit_inverse_3x3():
    g = torch.Generator().manual_seed(3)
    ws = [torch.randn(2, 3, generator=g, dtype=D64) for _ in range(3)]
    gs = [rand_gram(g) for _ in range(3)]
    assert all(torch.linalg.matrix_rank(G) == 3 for G in gs)
    explicit = (torch.linalg.inv(gs[0] + gs[1] + gs[2]) @ (gs[0] @ ws[0].T + gs[1] @ ws[1].T + gs[2] @ ws[2].T)).T
    torch.testing.assert_close(regmean_merge(ws, gs, reduce_non_diagonal_ratio=1.0), explicit, rtol=0, atol=1e-10)
    # the default α = 0.95 changes the answer
    assert not torch.allclose(regmean_merge(ws, gs), explicit, atol=1e-6)

def test_reduce_non_diagonal_scales_only_off_diagonals():
    G = torch.arange(1., 10.).reshape(3, 3)
    R = reduce_non_diagonal(G, 0.25)
    off = ~torch.eye(3, dtype=torch.bool)
    assert torch.equal(R.diagonal(), G.diagonal())
    assert torch.equal(R[off], 0.25 * G[off])
    with pytest.raises(HyperparameterError, match='reduce_non_diagonal_ratio'): reduce_non_diagonal(G, -0.1)

def test_regmean_alpha_zero_is_diagonal_weighted_average():
    g = torch.Generator().manual_seed(4)
    ws = [torch.randn(2, 3, generator=g, dtype=D64) for _ in range(2)]
    gs = [rand_gram(g) for _ in range(2)]
    d0, d1 = gs[0].diagonal(), gs[1].diagonal()
    torch.testing.assert_close(regmean_merge(ws, gs, reduce_non_diagonal_ratio=0.0), (ws[0] * d0 + ws[1] * d1) / (d0 + d1), rtol=0, atol=1e-10)

def test_regmean_grams_equal_direct_mean_gram():
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    xs = [torch.randn(4, 5, 3), torch.randn(1, 5, 3), torch.randn(3, 5, 3)]   # per token rows, unequal batches
    grams = regmean_grams(lin, lin, [(x, None) for x in xs])
    X = torch.cat([x.reshape(-1, 3) for x in xs]).double()
    torch.testing.assert_close(grams[''], X.T @ X / X.shape[0], rtol=1e-6, atol=1e-6)

def test_regmean_rejects_nan_gram():
    w = torch.eye(2, dtype=D64)
    with pytest.raises(NonFiniteError):
        regmean_merge([w, w], [torch.eye(2, dtype=D64), torch.full((2, 2), float('nan'), dtype=D64)])

# ---------------------------------------------------------------- Fisher rule

def test_fisher_merge_equal_fishers_is_average():
    g = torch.Generator().manual_seed(5)
    ps = [{'a': torch.randn(3, 2, generator=g, dtype=D64), 'b': torch.randn(4, generator=g, dtype=D64)} for _ in range(3)]
    f = {'a': torch.rand(3, 2, generator=g, dtype=D64), 'b': torch.rand(4, generator=g, dtype=D64)}
    for norm in (True, False):
        out = fisher_merge(ps, [f, f, f], normalize_fisher_weight=norm)
        for k in f: torch.testing.assert_close(out[k], sum(p[k] for p in ps) / 3, rtol=0, atol=1e-12)

def test_fisher_merge_zero_fisher_gets_only_the_floor():
    a, b = {'w': torch.tensor([1., -2., 4.], dtype=D64)}, {'w': torch.tensor([3., 5., 0.], dtype=D64)}
    fa, fb = {'w': torch.tensor([2., 0.5, 1.], dtype=D64)}, {'w': torch.zeros(3, dtype=D64)}
    eps = 0.1
    out = fisher_merge({'a': a, 'b': b}, {'a': fa, 'b': fb}, normalize_fisher_weight=False, minimal_fisher_weight=eps)['w']
    expected = ((fa['w'] + eps) * a['w'] + eps * b['w']) / (fa['w'] + 2 * eps)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    # without a floor a zero Fisher gives model b no weight at all
    out0 = fisher_merge([a, b], [fa, fb], normalize_fisher_weight=False, minimal_fisher_weight=0)['w']
    torch.testing.assert_close(out0, a['w'], rtol=0, atol=1e-12)

def test_fisher_merge_normalised_by_hand():
    # n_a = ‖(6, 8)‖ = 10, n_b = ‖(1, 0)‖ = 1 → c_a ∝ 1/10, c_b ∝ 1 (ε = 0)
    ta, tb = {'w': torch.tensor([2., -1.])}, {'w': torch.tensor([4., 3.])}
    Fa, Fb = {'w': torch.tensor([6., 8.])}, {'w': torch.tensor([1., 0.])}
    assert fisher_norm(Fa) == 10.0
    out = fisher_merge([ta, tb], [Fa, Fb], minimal_fisher_weight=0)['w']
    expected = torch.tensor([(0.6 * 2 + 1 * 4) / (0.6 + 1), (0.8 * -1 + 0 * 3) / (0.8 + 0)], dtype=D64)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    # with the floor, as FusionBench: c_i = 1/(n_i+ε) and F_i + ε
    e = 1e-3
    ca, cb = 1 / (10 + e), 1 / (1 + e)
    exp_e = (ca * (Fa['w'].double() + e) * ta['w'] + cb * (Fb['w'].double() + e) * tb['w']) / (ca * (Fa['w'].double() + e) + cb * (Fb['w'].double() + e))
    torch.testing.assert_close(fisher_merge([ta, tb], [Fa, Fb], minimal_fisher_weight=e)['w'], exp_e, rtol=0, atol=1e-12)
    # unnormalised, the big Fisher of model a dominates instead
    un = fisher_merge([ta, tb], [Fa, Fb], minimal_fisher_weight=0, normalize_fisher_weight=False)['w']
    torch.testing.assert_close(un, torch.tensor([(6 * 2 + 4) / 7, -1.], dtype=D64), rtol=0, atol=1e-12)

def test_fisher_merge_refuses_nan_and_bad_weights():
    p = {'w': torch.ones(2)}
    with pytest.raises(NonFiniteError): fisher_merge([p, p], [{'w': torch.ones(2)}, {'w': torch.tensor([1., float('nan')])}])
    with pytest.raises(HyperparameterError, match='minimal_fisher_weight'): fisher_merge([p, p], [p, p], minimal_fisher_weight=-1)
    with pytest.raises(HyperparameterError, match='fisher_weights'): fisher_merge([p, p], [p, p], fisher_weights=[1, 2, 3])

@pytest.mark.parametrize('per_example', ['vmap', 'loop'])
def test_fisher_information_equals_naive_loop(per_example):
    torch.manual_seed(0)
    lin = nn.Linear(6, 4)
    x, y = torch.randn(11, 6), torch.randint(0, 4, (11,))
    acc = {k: torch.zeros_like(v) for k, v in lin.named_parameters()}
    for xi, yi in zip(x, y):   # one backward pass per example
        lin.zero_grad()
        F.log_softmax(lin(xi[None]), -1)[0, yi].backward()
        for k, v in lin.named_parameters(): acc[k] += v.grad ** 2
    naive = {k: v / len(x) for k, v in acc.items()}
    params = {k: v.detach().clone() for k, v in lin.named_parameters()}
    fi = fisher_information(lambda p, xb: functional_call(lin, p, (xb,)), params, [(x[:5], y[:5]), (x[5:], y[5:])],
                            chunk_size=2, per_example=per_example)
    assert set(fi) == set(naive)
    for k in naive: torch.testing.assert_close(fi[k], naive[k], rtol=0, atol=1e-6)

def test_sampled_fisher_ignores_labels_and_is_seeded():
    torch.manual_seed(1)
    lin = nn.Linear(5, 3)
    params = {k: v.detach().clone() for k, v in lin.named_parameters()}
    fn = lambda p, xb: functional_call(lin, p, (xb,))
    x = torch.randn(9, 5)
    f1 = fisher_information(fn, params, [(x, torch.zeros(9, dtype=torch.long))], fisher='sampled', seed=7)
    f2 = fisher_information(fn, params, [(x, torch.full((9,), 2))], fisher='sampled', seed=7)
    f3 = fisher_information(fn, params, [(x, torch.zeros(9, dtype=torch.long))], fisher='sampled', seed=8)
    for k in f1: assert torch.equal(f1[k], f2[k])
    assert not torch.equal(f1['weight'], f3['weight'])

# ---------------------------------------------------------------- end to end on the micro benchmark

from conftest import MICRO_BENCH_TASKS
TASKS = MICRO_BENCH_TASKS   # the experts of the micro_pools fixture (conftest.py)

@pytest.fixture(scope='module')
def micro(micro_pools):
    from fusion_nb.methods.data import MergeData
    return {**micro_pools, 'data1': MergeData(micro_pools['models'], micro_pools['tasks'], seed=1)}

SMALL = {'fisher_merging': dict(num_fisher_examples=8, batch_size=4),
         'regmean': dict(num_regmean_examples=8, batch_size=4)}

@pytest.mark.parametrize('name', ['fisher_merging', 'regmean'])
def test_micro_keys_shapes_dtypes_finite_and_seeded(micro, name):
    from fusion_nb.merge import merge
    pre, experts = micro['pre'], micro['experts']
    out = merge(name, pre, experts, data=micro['data'], progress=False, **SMALL[name])
    assert isinstance(out, MergedStateDict) and out.info['method'] == name
    assert set(out) == set(pre)
    for k in pre:
        assert (tuple(out[k].shape), out[k].dtype) == tuple(pre.meta(k)), k
        assert out[k].device.type == 'cpu' and torch.isfinite(out[k]).all(), k
    again = MERGE_METHODS[name](pre, experts, data=micro['data'], progress=False, **SMALL[name])
    assert all(torch.equal(out[k], again[k]) for k in out)
    other = MERGE_METHODS[name](pre, experts, data=micro['data1'], progress=False, **SMALL[name])
    assert any(not torch.equal(out[k], other[k]) for k in out)   # another seed draws other examples

def test_micro_fisher_equals_rule_on_its_statistics(micro):
    data, experts = micro['data'], micro['experts']
    out = fisher_merging(micro['pre'], experts, data=data, progress=False, **SMALL['fisher_merging'])
    enc = data.encoder
    ps, fs = {}, {}
    for t in TASKS:
        p = {n: experts[t][n].float() for n, _ in enc.named_parameters()}
        ps[t], fs[t] = p, fisher_information(lambda q, x, t=t: data.logits(t, x, params=q), p, data.labelled(t, 8, 4))
    ref = fisher_merge(ps, fs)
    assert out.info['fisher_norms'] == pytest.approx({t: fisher_norm(fs[t]) for t in TASKS}, rel=1e-9)
    for k in ref: torch.testing.assert_close(out[k], ref[k].float(), rtol=1e-5, atol=1e-6)

def test_micro_regmean_equals_rule_on_its_statistics(micro):
    data, experts = micro['data'], micro['experts']
    out = regmean(micro['pre'], experts, data=data, progress=False, **SMALL['regmean'])
    enc, layer = data.encoder, 'encoder.layers.0.mlp.fc2'
    ws, gs = [], []
    for t in TASKS:
        p = {n: experts[t][n].float() for n, _ in enc.named_parameters()}
        gs.append(regmean_grams(enc, lambda x, t=t, p=p: data.logits(t, x, params=p), data.labelled(t, 8, 4), modules=[layer])[layer])
        ws.append(p[f'{layer}.weight'].double())
    torch.testing.assert_close(out[f'{layer}.weight'], regmean_merge(ws, gs).float(), rtol=1e-5, atol=1e-6)
    avg = sum(experts[t][f'{layer}.bias'] for t in TASKS) / 3
    torch.testing.assert_close(out[f'{layer}.bias'], avg, rtol=1e-6, atol=1e-6)
    # a single expert comes back
    solo = regmean(micro['pre'], {'mnist': experts['mnist']}, data=data, progress=False, **SMALL['regmean'])
    for k in solo: torch.testing.assert_close(solo[k], experts['mnist'][k], rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize('name,bad,match', [
    ('fisher_merging', dict(num_fisher_examples=0), 'num_fisher_examples'),
    ('fisher_merging', dict(batch_size=-1), 'batch_size'),
    ('fisher_merging', dict(minimal_fisher_weight=-1e-6), 'minimal_fisher_weight'),
    ('fisher_merging', dict(fisher='diagonal'), 'fisher'),
    ('fisher_merging', dict(fisher_weights=[1.0, 1.0]), 'fisher_weights'),
    ('regmean', dict(reduce_non_diagonal_ratio=1.01), 'reduce_non_diagonal_ratio'),
    ('regmean', dict(reduce_non_diagonal_ratio=-0.5), 'reduce_non_diagonal_ratio'),
    ('regmean', dict(num_regmean_examples=0), 'num_regmean_examples'),
])
def test_micro_bad_hyperparameters(micro, name, bad, match):
    with pytest.raises(HyperparameterError, match=match):
        MERGE_METHODS[name](micro['pre'], micro['experts'], data=micro['data'], progress=False, **bad)

@pytest.mark.parametrize('name', ['fisher_merging', 'regmean'])
def test_micro_needs_data_for_the_experts_tasks(micro, name):
    with pytest.raises(HyperparameterError, match='needs `data`'):
        MERGE_METHODS[name](micro['pre'], micro['experts'], progress=False)
    with pytest.raises(HyperparameterError, match='svhn'):
        MERGE_METHODS[name](micro['pre'], {'svhn': micro['experts']['mnist']}, data=micro['data'], progress=False)
