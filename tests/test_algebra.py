"State-dict algebra against naive flattened-vector references on random state dicts."
import math
import pytest, torch
from fusion_nb.algebra import TaskVector, check_compatible, cosine, dot, materialize, norm
from fusion_nb.core import IncompatibleModelsError, NonFiniteError

SHAPES = {'enc.0.weight': (7, 5), 'enc.0.bias': (7,), 'enc.1.weight': (3, 7), 'ln.weight': (3,)}

def rand_sd(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    sd = {k: torch.randn(s, generator=g).to(dtype) for k, s in SHAPES.items()}
    sd['embeddings.position_ids'] = torch.arange(6)[None]
    return sd

def flat(sd): return torch.cat([sd[k].double().flatten() for k in sorted(SHAPES)])

@pytest.mark.parametrize('seed', [0, 1, 2])
def test_arithmetic_matches_flat_vectors(seed):
    pre, fts = rand_sd(100 + seed), [rand_sd(seed * 10 + i) for i in range(4)]
    tvs = [TaskVector.from_models(pre, ft, f't{i}') for i, ft in enumerate(fts)]
    # τ is formed in the checkpoints' float32, then compared in float64
    ref = [torch.cat([(ft[k] - pre[k]).double().flatten() for k in sorted(SHAPES)]) for ft in fts]
    lam = 0.3
    merged = materialize((lam * sum(tvs)).apply_to(pre))
    assert torch.allclose(flat(merged), flat(pre) + lam * sum(ref), atol=1e-5)
    assert torch.equal(merged['embeddings.position_ids'], pre['embeddings.position_ids'])
    assert torch.allclose(flat(materialize(tvs[0] - tvs[1])), ref[0] - ref[1], atol=1e-6)
    assert torch.allclose(flat(materialize(-tvs[2] / 2)), -ref[2] / 2, atol=1e-6)
    assert math.isclose(dot(tvs[0], tvs[1]), float(ref[0] @ ref[1]), rel_tol=1e-9)
    assert math.isclose(norm(tvs[3]), float(ref[3].norm()), rel_tol=1e-9)
    c = float(ref[0] @ ref[2] / (ref[0].norm() * ref[2].norm()))
    assert math.isclose(cosine(tvs[0], tvs[2]), c, rel_tol=1e-9)

def test_lambda_zero_and_identical_models():
    pre = rand_sd(0)
    tv = TaskVector.from_models(pre, pre)
    assert norm(tv) == 0 and cosine(tv, tv) == 0.0
    out = materialize(tv.apply_to(pre, 0.0))
    assert all(torch.equal(out[k], pre[k]) for k in pre)

@pytest.mark.parametrize('mutate,match', [
    (lambda sd: sd.pop('enc.0.bias'), "model 'bad' is missing 1 tensor.*'enc.0.bias'"),
    (lambda sd: sd.__setitem__('extra', torch.zeros(1)), "model 'bad' has 1 tensor.*'extra'"),
    (lambda sd: sd.__setitem__('ln.weight', torch.zeros(4)), "tensor 'ln.weight': shape \\[4\\] in model 'bad'"),
    (lambda sd: sd.__setitem__('ln.weight', torch.zeros(3, dtype=torch.bfloat16)), "tensor 'ln.weight': dtype torch.bfloat16 in model 'bad'"),
])
def test_incompatible_models_name_model_and_tensor(mutate, match):
    bad = rand_sd(1); mutate(bad)
    with pytest.raises(IncompatibleModelsError, match=match):
        check_compatible({'pretrained': rand_sd(0), 'bad': bad})
    with pytest.raises(IncompatibleModelsError):
        TaskVector.from_models(rand_sd(0), bad, name='bad')

@pytest.mark.parametrize('value,kind', [(float('nan'), 'NaN'), (float('inf'), 'Inf')])
def test_non_finite_named(value, kind):
    bad = rand_sd(1); bad['enc.1.weight'][0, 0] = value
    with pytest.raises(NonFiniteError, match=f"model 'gtsrb': tensor 'enc.1.weight' holds .*{kind}" if kind == 'NaN' else "holds 0 NaN and 1 Inf"):
        check_compatible({'pretrained': rand_sd(0), 'gtsrb': bad}, check_finite=True)

def test_task_vectors_of_different_models_do_not_add():
    a = TaskVector.from_models(rand_sd(0), rand_sd(1), 'a')
    other = {k: v for k, v in rand_sd(2).items() if k != 'ln.weight'}
    b = TaskVector.from_models({k: v for k, v in rand_sd(0).items() if k != 'ln.weight'}, other, 'b')
    with pytest.raises(IncompatibleModelsError, match="'a' and 'b' have different tensors"):
        a + b
