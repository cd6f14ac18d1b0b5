"State-dict algebra against naive flattened-vector references on random state dicts; every error names its culprit."
import math, re

import numpy as np
import pytest
import torch

from fusion_nb.algebra import (LazyMap, TaskVector, check_compatible, check_finite, cosine, cosine_matrix, dot,
                               gram_matrix, is_mergeable, materialize, norm, tensor_meta)
from fusion_nb.core import IncompatibleModelsError, NonFiniteError

SHAPES = {'enc.0.weight': (7, 5), 'enc.0.bias': (7,), 'enc.1.weight': (3, 7), 'ln.weight': (3,), 'scalar': ()}
BUFFERS = {'embeddings.position_ids': lambda: torch.arange(6)[None], 'mask': lambda: torch.tensor([True, False])}

def rand_sd(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    sd = {k: torch.randn(s, generator=g).to(dtype) for k, s in SHAPES.items()}
    sd.update({k: f() for k, f in BUFFERS.items()})
    return sd

def flat(sd, keys=sorted(SHAPES)):
    "The naive reference: every floating tensor of `sd`, flattened and concatenated in float64."
    return torch.cat([sd[k].double().reshape(-1) for k in keys])

def naive_tau(pre, ft):
    "τ formed in the checkpoints' own dtype (as TaskVector does by default), then flattened in float64."
    return flat({k: ft[k] - pre[k] for k in SHAPES})

class Logged(dict):
    "A plain state dict that logs every tensor read and answers shapes from a 'header' (like LazyStateDict)."
    def __init__(self, d, name, log): super().__init__(d); self.name, self.log = name, log
    def __getitem__(self, k):
        self.log.append((self.name, k)); return super().__getitem__(k)
    def meta(self, k):
        v = super().__getitem__(k); return tuple(v.shape), v.dtype

# ---------------------------------------------------------------- arithmetic vs naive references

@pytest.mark.parametrize('seed', [0, 1, 2])
def test_arithmetic_matches_flat_vectors(seed):
    pre, fts = rand_sd(100 + seed), [rand_sd(seed * 10 + i) for i in range(4)]
    tvs = [TaskVector.from_models(pre, ft, f't{i}') for i, ft in enumerate(fts)]
    ref = [naive_tau(pre, ft) for ft in fts]
    # the task vector itself, and the mergeable keys only
    assert sorted(tvs[0]) == sorted(SHAPES)
    assert torch.allclose(flat(materialize(tvs[0])), ref[0], atol=1e-6)
    # + - neg * / sum
    assert torch.allclose(flat(materialize(tvs[0] + tvs[1])), ref[0] + ref[1], atol=1e-6)
    assert torch.allclose(flat(materialize(tvs[0] - tvs[1])), ref[0] - ref[1], atol=1e-6)
    assert torch.allclose(flat(materialize(-tvs[2])), -ref[2], atol=1e-6)
    assert torch.allclose(flat(materialize(tvs[2] * 1.5)), 1.5 * ref[2], atol=1e-5)
    assert torch.allclose(flat(materialize(1.5 * tvs[2])), 1.5 * ref[2], atol=1e-5)
    assert torch.allclose(flat(materialize(tvs[2] / 4)), ref[2] / 4, atol=1e-6)
    assert torch.allclose(flat(materialize(sum(tvs))), sum(ref), atol=1e-5)
    assert torch.allclose(flat(materialize(tvs[0].materialize())), ref[0], atol=1e-6)
    # task arithmetic: θ_pre + λ Σ τ, integer/bool buffers carried
    lam = 0.3
    merged = materialize((lam * sum(tvs)).apply_to(pre))
    assert list(merged) == list(pre)
    assert torch.allclose(flat(merged), flat(pre) + lam * sum(ref), atol=1e-5)
    merged2 = materialize(sum(tvs).apply_to(pre, scaling=lam))
    assert torch.allclose(flat(merged2), flat(merged), atol=1e-6)
    for k in BUFFERS: assert torch.equal(merged[k], pre[k]) and merged[k].dtype == pre[k].dtype
    # streaming reductions in float64
    assert math.isclose(dot(tvs[0], tvs[1]), float(ref[0] @ ref[1]), rel_tol=1e-9)
    assert math.isclose(norm(tvs[3]), float(ref[3].norm()), rel_tol=1e-9)
    c = float(torch.nn.functional.cosine_similarity(ref[0], ref[2], dim=0))
    assert math.isclose(cosine(tvs[0], tvs[2]), c, rel_tol=1e-9)
    # with τ formed in float64, everything agrees with the all-float64 reference
    t64 = [TaskVector.from_models(pre, ft, dtype=torch.float64) for ft in fts[:2]]
    r64 = [flat(ft) - flat(pre) for ft in fts[:2]]
    assert math.isclose(dot(t64[0], t64[1]), float(r64[0] @ r64[1]), rel_tol=1e-12)
    assert torch.allclose(flat(materialize((lam * sum(t64)).apply_to({k: v.double() for k, v in pre.items()}))),
                          flat(pre) + lam * sum(r64), rtol=0, atol=1e-12)

def test_gram_and_cosine_matrix_match_naive():
    pre = rand_sd(0)
    tvs = {f'task{i}': TaskVector.from_models(pre, rand_sd(i + 1), f'task{i}') for i in range(4)}
    F = torch.stack([naive_tau(pre, rand_sd(i + 1)) for i in range(4)])
    G = F @ F.T
    assert np.allclose(gram_matrix(tvs).values, G.numpy(), rtol=1e-9)
    C = G / (G.diagonal().sqrt()[:, None] * G.diagonal().sqrt()[None, :])
    cm = cosine_matrix(tvs)
    assert list(cm.index) == list(cm.columns) == list(tvs)
    assert np.allclose(cm.values, C.numpy(), rtol=1e-9)
    # a zero vector has cosine 0 with everything (and with itself)
    cm0 = cosine_matrix({'a': tvs['task0'], 'zero': 0 * tvs['task1']})
    assert cm0.loc['zero', 'a'] == 0 and cm0.loc['zero', 'zero'] == 0 and math.isclose(cm0.loc['a', 'a'], 1.0)

def test_dot_skips_integer_buffers_of_full_state_dicts():
    a, b = rand_sd(0), rand_sd(1)
    assert math.isclose(dot(a, b), float(flat(a) @ flat(b)), rel_tol=1e-9)
    assert math.isclose(norm(a), float(flat(a).norm()), rel_tol=1e-9)

def test_lambda_zero_and_identical_models():
    pre = rand_sd(0)
    tv = TaskVector.from_models(pre, pre)
    assert norm(tv) == 0 and cosine(tv, tv) == 0.0
    out = materialize(tv.apply_to(pre, 0.0))
    assert all(torch.equal(out[k], pre[k]) for k in pre)

def test_sum_of_one_and_scalar_types():
    pre, ft = rand_sd(0), rand_sd(1)
    tv = TaskVector.from_models(pre, ft, 'one')
    assert sum([tv]) is tv
    ref = naive_tau(pre, ft)
    for s in (2, 2.0, np.float32(2.0), np.float64(2.0), torch.tensor(2.0)):
        assert torch.allclose(flat(materialize(tv * s)), 2 * ref, atol=1e-6), type(s)
        assert torch.allclose(flat(materialize(s * tv)), 2 * ref, atol=1e-6), type(s)
    with pytest.raises(TypeError): tv * tv
    with pytest.raises(TypeError): tv * 'x'
    with pytest.raises(ZeroDivisionError, match="'one' divided by zero"): tv / 0

def test_learnable_lambda_gets_the_naive_gradient():
    pre, ft = rand_sd(0), rand_sd(1)
    lam = torch.tensor(0.3, requires_grad=True)
    merged = (lam * TaskVector.from_models(pre, ft)).apply_to(pre)
    sum(merged[k].sum() for k in SHAPES).backward()
    assert math.isclose(float(lam.grad), float(naive_tau(pre, ft).sum()), rel_tol=1e-5)

def test_half_precision_and_dtype_option():
    pre, ft = rand_sd(0, torch.float16), rand_sd(1, torch.float16)
    tv = TaskVector.from_models(pre, ft)
    assert tv.dtype('enc.0.weight') == torch.float16 and tv['enc.0.weight'].dtype == torch.float16
    tv32 = TaskVector.from_models(pre, ft, dtype=torch.float32)
    assert tv32.dtype('enc.0.weight') == torch.float32
    for k in SHAPES: assert torch.equal(tv32[k], ft[k].float() - pre[k].float())
    # applied to a float16 model, the result stays float16 (the pretrained model's dtype)
    out = materialize((0.5 * tv32).apply_to(pre))
    assert all(out[k].dtype == torch.float16 for k in SHAPES)
    # mixed-precision operands promote
    assert (tv + tv32).dtype('ln.weight') == torch.float32 == (tv + tv32)['ln.weight'].dtype

def test_from_state_dict_wraps_saved_vectors():
    pre, ft = rand_sd(0), rand_sd(1)
    saved = TaskVector.from_models(pre, ft).materialize()
    tv = TaskVector.from_state_dict({**saved, 'embeddings.position_ids': torch.arange(3)}, name='saved')
    assert sorted(tv) == sorted(SHAPES) and tv.name == 'saved'
    assert torch.allclose(flat(materialize(tv.apply_to(pre))), flat(ft), atol=1e-6)

# ---------------------------------------------------------------- laziness

def test_expressions_are_lazy_and_stream_key_by_key():
    log = []
    pre = Logged(rand_sd(0), 'pre', log)
    fts = [Logged(rand_sd(i + 1), f'ft{i}', log) for i in range(3)]
    expr = (0.3 * sum(TaskVector.from_models(pre, ft) for ft in fts)).apply_to(pre)
    check_compatible({'pre': pre, **{ft.name: ft for ft in fts}})      # metadata only
    assert log == []                                                  # building and checking read nothing
    keys = list(pre)
    for k in keys:
        expr[k]
        # one lookup reads that key only, and of every model that contributes to it
        assert {key for _, key in log} == {k}
        assert {n for n, _ in log} == ({'pre', 'ft0', 'ft1', 'ft2'} if k in SHAPES else {'pre'})
        log.clear()
    materialize(expr)
    order = [k for _, k in log]
    # materialize visits key after key: all reads of one key happen before the next key is touched
    assert [k for i, k in enumerate(order) if i == 0 or order[i - 1] != k] == keys

def test_lazy_map_meta_and_errors():
    calls = []
    lm = LazyMap(['x'], lambda k: calls.append(k) or torch.ones(2), name='demo', meta=lambda k: ((2,), torch.float32))
    assert tensor_meta(lm, 'x') == ((2,), torch.float32) and calls == []
    assert lm.shape('x') == (2,) and lm.dtype('x') == torch.float32 and calls == []
    with pytest.raises(KeyError, match="'y' is not a tensor of 'demo'"): lm['y']
    with pytest.raises(KeyError, match="'y' is not a tensor of 'demo'"): lm.meta('y')
    assert 'x' in lm and 'y' not in lm and len(lm) == 1

def test_is_mergeable():
    assert is_mergeable(torch.zeros(1)) and is_mergeable(torch.zeros(1, dtype=torch.bfloat16))
    assert is_mergeable(torch.float64)
    assert not is_mergeable(torch.arange(2)) and not is_mergeable(torch.zeros(1, dtype=torch.bool))
    assert not is_mergeable(torch.uint8)

# ---------------------------------------------------------------- errors name the culprit

@pytest.mark.parametrize('mutate,match', [
    (lambda sd: sd.pop('enc.0.bias'), r"model 'bad' is missing 1 tensor\(s\) that 'pretrained' has: 'enc.0.bias'"),
    (lambda sd: sd.__setitem__('extra', torch.zeros(1)), r"model 'bad' has 1 tensor\(s\) that 'pretrained' lacks: 'extra'"),
    (lambda sd: sd.__setitem__('ln.weight', torch.zeros(4)), r"tensor 'ln.weight': shape \[4\] in model 'bad' but \[3\] in 'pretrained'"),
    (lambda sd: sd.__setitem__('ln.weight', torch.zeros(1, 3)), r"tensor 'ln.weight': shape \[1, 3\] in model 'bad' but \[3\] in 'pretrained'"),
    (lambda sd: sd.__setitem__('ln.weight', torch.zeros(3, dtype=torch.bfloat16)),
     r"tensor 'ln.weight': dtype torch.bfloat16 in model 'bad' but torch.float32 in 'pretrained'"),
    (lambda sd: sd.__setitem__('embeddings.position_ids', torch.arange(6, dtype=torch.int32)[None]),
     r"tensor 'embeddings.position_ids': dtype torch.int32 in model 'bad'"),
])
def test_incompatible_models_name_model_and_tensor(mutate, match):
    bad = rand_sd(1); mutate(bad)
    with pytest.raises(IncompatibleModelsError, match=match):
        check_compatible({'pretrained': rand_sd(0), 'good': rand_sd(2), 'bad': bad})
    with pytest.raises(IncompatibleModelsError, match=match):
        TaskVector.from_models(rand_sd(0), bad, name='bad')

def test_many_missing_keys_are_counted():
    bad = {k: v for k, v in rand_sd(1).items() if k == 'scalar'}
    with pytest.raises(IncompatibleModelsError, match=r"model 'bad' is missing 6 tensor\(s\) .* … \(6 in all\)"):
        check_compatible({'pre': rand_sd(0), 'bad': bad})

def test_reference_model():
    a, b = rand_sd(0), rand_sd(1)
    b.pop('ln.weight')
    with pytest.raises(IncompatibleModelsError, match="model 'a' has 1 tensor\\(s\\) that 'b' lacks: 'ln.weight'"):
        check_compatible({'a': a, 'b': b}, reference='b')
    with pytest.raises(IncompatibleModelsError, match="reference model 'c' is not among"):
        check_compatible({'a': a, 'b': b}, reference='c')
    with pytest.raises(IncompatibleModelsError, match='no models'):
        check_compatible({})

@pytest.mark.parametrize('value,counts', [(float('nan'), '1 NaN and 0 Inf'), (float('inf'), '0 NaN and 1 Inf'),
                                          (float('-inf'), '0 NaN and 1 Inf')])
def test_non_finite_named(value, counts):
    bad = rand_sd(1); bad['enc.1.weight'][0, 0] = value
    with pytest.raises(NonFiniteError, match=f"model 'gtsrb': tensor 'enc.1.weight' holds {counts} value"):
        check_compatible({'pretrained': rand_sd(0), 'gtsrb': bad}, check_finite=True)
    check_compatible({'pretrained': rand_sd(0), 'gtsrb': bad})          # not looked for unless asked
    with pytest.raises(NonFiniteError, match=f"model 'svhn': tensor 'k' holds {counts}"):
        check_finite(bad['enc.1.weight'], 'svhn', 'k')
    # a NaN in the reference model is found too
    with pytest.raises(NonFiniteError, match="model 'pretrained': tensor 'enc.1.weight'"):
        check_compatible({'pretrained': bad, 'gtsrb': rand_sd(0)}, check_finite=True)

def test_check_finite_passes_finite_and_integer_tensors():
    t = torch.randn(3)
    assert check_finite(t, 'm', 'k') is t
    check_finite(torch.arange(3), 'm', 'k')
    check_finite(torch.zeros(0), 'm', 'k')

def test_task_vectors_of_different_models_do_not_combine():
    a = TaskVector.from_models(rand_sd(0), rand_sd(1), 'a')
    drop = lambda sd: {k: v for k, v in sd.items() if k != 'ln.weight'}
    b = TaskVector.from_models(drop(rand_sd(0)), drop(rand_sd(2)), 'b')
    for op in (lambda: a + b, lambda: a - b, lambda: b + a, lambda: dot(a, b), lambda: cosine(a, b),
               lambda: gram_matrix({'a': a, 'b': b})):
        with pytest.raises(IncompatibleModelsError, match="'(a|b)' and '(a|b)' have different tensors.*'ln.weight'"):
            op()

def test_shapes_that_would_broadcast_are_refused():
    a = TaskVector.from_models(rand_sd(0), rand_sd(1), 'a')
    wide = {k: v.unsqueeze(0) if k == 'ln.weight' else v for k, v in a.materialize().items()}
    b = TaskVector.from_state_dict(wide, 'wide')
    for what, op in [('task vector +', lambda: a + b), ('task vector -', lambda: a - b), ('dot', lambda: dot(a, b)),
                     ('cosine', lambda: cosine(a, b))]:
        with pytest.raises(IncompatibleModelsError, match=re.escape(what) + ": tensor 'ln.weight' has shape \\[3\\] in 'a' but \\[1, 3\\] in 'wide'"):
            op()
    with pytest.raises(IncompatibleModelsError, match="gram_matrix: tensor 'ln.weight' has shape \\[3\\] in 'a' but \\[1, 3\\] in 'wide'"):
        gram_matrix({'a': a, 'wide': b})
    # plain dicts have no name: the message says which operand
    wide_tensors = {k: v.unsqueeze(0) if k == 'ln.weight' else v for k, v in rand_sd(3).items()}
    with pytest.raises(IncompatibleModelsError, match="dot: tensor 'ln.weight' has shape \\[3\\] in 'left operand' but \\[1, 3\\] in 'right operand'"):
        dot(rand_sd(2), wide_tensors)

def test_apply_to_an_incompatible_model():
    tv = TaskVector.from_models(rand_sd(0), rand_sd(1), 'gtsrb')
    small = Logged({k: v for k, v in rand_sd(0).items() if k != 'enc.0.bias'}, 'small', [])
    with pytest.raises(IncompatibleModelsError, match="cannot apply 'gtsrb' to 'small': 'small' lacks 'enc.0.bias'"):
        tv.apply_to(small)
    other = Logged({**rand_sd(0), 'enc.0.bias': torch.zeros(8)}, 'other', [])
    with pytest.raises(IncompatibleModelsError, match=r"cannot apply 'gtsrb' to 'other': tensor 'enc.0.bias' has shape \[7\] in 'gtsrb' but \[8\] in 'other'"):
        tv.apply_to(other)
    assert small.log == [] and other.log == []       # refused from metadata, before reading any weight

# ---------------------------------------------------------------- non-finite inputs and device flow

@pytest.mark.parametrize('bad', [float('nan'), float('inf')])
def test_cosines_of_a_non_finite_vector_raise_naming_it(bad):
    pre, ok, broken = rand_sd(0), rand_sd(1), rand_sd(2)
    broken['enc.1.weight'][1, 2] = bad
    tv_ok, tv_bad = TaskVector.from_models(pre, ok, 'fine'), TaskVector.from_models(pre, broken, 'nan_expert')
    with pytest.raises(NonFiniteError, match="'nan_expert' has NaN or Inf"): cosine(tv_ok, tv_bad)
    with pytest.raises(NonFiniteError, match="'nan_expert' has NaN or Inf"): cosine(tv_bad, tv_ok)
    with pytest.raises(NonFiniteError, match="'nan_expert'"): cosine_matrix({'fine': tv_ok, 'nan_expert': tv_bad})
    with pytest.raises(NonFiniteError, match="'nan_expert'"): gram_matrix({'fine': tv_ok, 'nan_expert': tv_bad})
    assert cosine(tv_ok, 0 * tv_ok) == 0.0   # the zero vector is still cosine 0, not an error

def test_gram_and_cosine_accumulate_on_the_tensors_device():
    "On the meta device a CPU accumulator (the CUDA crash of issue 11) would raise; the sums must stay on meta."
    from fusion_nb.algebra import cosine_terms, gram_tensor
    vs = {n: {k: v.to('meta') for k, v in rand_sd(s).items()} for n, s in (('a', 0), ('b', 1), ('c', 2))}
    g = gram_tensor(vs)
    assert g.device.type == 'meta' and g.shape == (3, 3) and g.dtype == torch.float64
    assert cosine_terms(vs['a'], vs['b']).device.type == 'meta'

def test_gram_tensor_matches_naive_on_cpu():
    from fusion_nb.algebra import gram_tensor
    vs = {n: rand_sd(s) for n, s in (('a', 0), ('b', 1))}
    f = torch.stack([flat(v) for v in vs.values()])
    torch.testing.assert_close(gram_tensor(vs), f @ f.T)
