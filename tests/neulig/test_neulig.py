"NeuLig (paper 001) on the micro project: both levels against the project's own evaluation code, batch independence, training, artefacts, bad inputs."
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from fusion_nb.core import HyperparameterError, IncompatibleModelsError
from fusion_nb.evaluation import ZeroShotClassifier, evaluate, image_loader, task_head
from fusion_nb.merge import MERGE_METHODS, merge, simple_average, ensemble
from fusion_nb.methods.data import MergeData
from fusion_nb.neulig.neulig import (CoopClassifier, consistency_table, neulig_records, train_portland, visible_count,
                                     visible_split, visible_stream)
from fusion_nb.neulig.portland import NeuLigModel, check_coopvec
from fusion_nb.pools import PRETRAINED, ModelPool, TaskPool
from fusion_nb.reproduce.profiles import load_profile

@pytest.fixture(scope='module')
def micro(micro_project):
    p = load_profile('micro-test', settings=micro_project/'settings.ini')
    models, tasks = ModelPool.from_profile(p), TaskPool.from_profile(p)
    data = MergeData(models, tasks, seed=0)
    pre, experts = models.vision_state(PRETRAINED), {t: models.vision_state(t) for t in p.tasks}
    x = next(iter(image_loader(tasks['colors'].load(), models.processor, 12)))['pixel_values']
    return dict(models=models, tasks=tasks, data=data, pre=pre, experts=experts, names=list(p.tasks), x=x)

def _model(micro, perturb=True, seed=0):
    "A NeuLig model whose Portland really depends on the input (its CoopVecs differ between samples)."
    torch.manual_seed(seed)   # Portland's hidden layer is drawn from the global generator: fix it, whatever ran before
    m = NeuLigModel(micro['pre'], micro['experts'], micro['models'].config)
    if perturb:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad(): m.portland.net[-1].weight.copy_(torch.randn(m.portland.net[-1].weight.shape, generator=g) * 0.3)   # input-dependent CoopVecs that do not saturate (×3 gave one-hot-like ones)
    return m

def _zeroshot(micro, encoders, task, combine='probs'):
    "The project's evaluation classifier (fusion_nb.evaluation), an independent code path."
    mp = micro['models']
    return ZeroShotClassifier(encoders, mp.clip.visual_projection, mp.clip.logit_scale, task_head(mp, micro['tasks'][task]), combine).eval()

# ---------------------------------------------------------------- one CoopVec, two levels, against independent code

@pytest.mark.parametrize('task', ['shapes', 'colors'])
def test_one_hot_coopvec_is_that_expert_for_merge_and_ensemble(micro, task):
    m, x = _model(micro), micro['x']
    for k, name in enumerate(m.names):
        onehot = F.one_hot(torch.tensor(k), len(m.names)).float()
        ref = _zeroshot(micro, micro['models'].vision_model(name), task)
        with torch.no_grad():
            want = ref(x)
            for level in ('merge', 'ensemble'):
                torch.testing.assert_close(CoopClassifier(m, micro['data'].heads, task, level, onehot)(x), want, atol=2e-4, rtol=1e-4)
            # per-sample one-hot CoopVecs too (the vmap path)
            torch.testing.assert_close(CoopClassifier(m, micro['data'].heads, task, 'merge', onehot.expand(len(x), -1))(x), want, atol=2e-4, rtol=1e-4)

def test_uniform_coopvec_is_simple_averaging_and_the_uniform_ensemble(micro):
    m, x, mp = _model(micro, perturb=False), micro['x'], micro['models']
    avg = mp.vision_model(simple_average(micro['pre'], micro['experts'], progress=False))
    members = [mp.vision_model(n) for n in m.names]
    with torch.no_grad():
        for task in micro['names']:
            heads = micro['data'].heads
            torch.testing.assert_close(CoopClassifier(m, heads, task, 'merge')(x), _zeroshot(micro, avg, task)(x), atol=2e-4, rtol=1e-4)
            # Ens. is the baselines' operator: the uniform CoopVec gives Simple Averaging's ensemble row, the mean of the logits (issue 25)
            torch.testing.assert_close(CoopClassifier(m, heads, task, 'ensemble')(x), _zeroshot(micro, members, task, 'logits')(x), atol=2e-4, rtol=1e-4)
            assert (CoopClassifier(m, heads, task, 'ensemble')(x) - _zeroshot(micro, members, task, 'probs')(x)).abs().max() > 1e-3   # not the probability mixture

def test_uniform_records_equal_evaluate_of_simple_average_and_ensemble(micro):
    "The same through the whole evaluation: neulig_records vs the project's evaluate() of the registry's methods."
    m = _model(micro, perturb=False)
    mine = neulig_records(m, micro['data'], batch_size=5, progress=False).set_index(['task', 'level', 'metric'])['value']
    ref = evaluate({'merge': simple_average(micro['pre'], micro['experts'], progress=False), 'ensemble': ensemble(micro['pre'], micro['experts'], combine='logits')},
                   micro['models'], micro['tasks'], batch_size=7, progress=False)
    ref = ref.rename(columns={'model': 'level'}).set_index(['task', 'level', 'metric'])['value']
    pd.testing.assert_series_equal(mine.sort_index(), ref.sort_index(), atol=1e-4, rtol=1e-4)

# ---------------------------------------------------------------- behaviour

def test_prediction_does_not_depend_on_batch_mates(micro):
    m, x = _model(micro), micro['x']
    c = m.coopvecs(x)
    assert (c - c[0]).abs().amax() > 1e-2, 'the CoopVecs must differ between samples for the check to bite'   # any two (the softmax saturates for some pairs)
    heads = micro['data'].heads
    with torch.no_grad():
        for level in ('merge', 'ensemble'):
            clf = CoopClassifier(m, heads, 'colors', level)
            full = clf(x)
            for i in (0, 5, 11): torch.testing.assert_close(clf(x[i:i + 1])[0], full[i], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(clf(torch.cat([x[6:], x[:6]]))[:6], full[6:], atol=1e-4, rtol=1e-4)
    a = neulig_records(m, micro['data'], batch_size=1, progress=False)['value']
    b = neulig_records(m, micro['data'], batch_size=12, progress=False)['value']
    torch.testing.assert_close(torch.tensor(a.values), torch.tensor(b.values), atol=1e-4, rtol=1e-4)

def test_merge_and_ensemble_agree_exactly_when_coopvecs_are_one_hot(micro):
    "The paper's mechanism: the same one-hot CoopVec makes both levels the same expert, so their gap is zero."
    m = _model(micro)
    with torch.no_grad(): m.portland.net[-1].bias.copy_(torch.tensor([1e4, 0.]))   # every sample to expert 0
    recs = neulig_records(m, micro['data'], progress=False).assign(row='one-hot')
    tab = consistency_table(recs)
    assert (tab.xs('Gap', axis=1, level=1) < 1e-9).all().all()

def test_training_registry_artefact_roundtrip(micro, tmp_path):
    f = tmp_path/'p.portland.safetensors'
    kw = dict(data=micro['data'], setting='supervised', steps=4, lr=5e-2, batch_size=3, log_every=2, progress=False)
    m1 = merge('neulig', micro['pre'], micro['experts'], save_to=f, **kw)
    info = m1.neulig_info
    assert len(info['losses']) == 4 and [h['step'] for h in info['maps']] == [0, 2, 4]
    assert m1.info['method'] == 'neulig' and m1.info['setting'] == 'supervised'
    assert info['visible'] == {t: 12 for t in micro['names']}   # MICRO_SPLITS train = 12
    assert any(p.abs().sum() > 0 for p in m1.portland.net[-1].parameters()), 'Portland was trained'
    m2 = merge('neulig', micro['pre'], micro['experts'], **kw)                 # same seed, same Portland
    for a, b in zip(m1.portland.parameters(), m2.portland.parameters()): torch.testing.assert_close(a, b)
    m3 = merge('neulig', micro['pre'], micro['experts'], data=micro['data'], load_from=f)   # no training
    x = micro['x']
    with torch.no_grad(): torch.testing.assert_close(m3.coopvecs(x), m1.coopvecs(x))
    pd.testing.assert_frame_equal(m3.coopvec_map, m1.coopvec_map, check_dtype=False, atol=1e-6, rtol=0)
    with pytest.raises(IncompatibleModelsError, match='trained for experts'):
        merge('neulig', micro['pre'], {'colors': micro['experts']['colors'], 'shapes': micro['experts']['shapes']}, data=micro['data'], load_from=f)

def test_visible_data_scale(micro):
    ds = visible_split(micro['tasks']['shapes'], 0.25, seed=0)
    assert len(ds) == 3 == visible_count(12, 0.25)
    assert len(visible_split(micro['tasks']['shapes'], 1.0)) == 12
    m = _model(micro, perturb=False)
    info = train_portland(m, micro['data'], data_scale=0.25, steps=1, batch_size=8, progress=False)
    assert info['visible'] == {t: 3 for t in micro['names']}
    assert all(len(f) == 3 for f in m.visible_features.values())   # the map is computed on the visible samples only
    # semi-supervised streams carry no labels at all
    batch = next(visible_stream(ds, micro['models'].processor, 2, labelled=False))
    assert isinstance(batch, torch.Tensor) and batch.shape[0] == 2

# ---------------------------------------------------------------- bad input, named

def test_bad_inputs_are_named(micro):
    pre, experts, data = micro['pre'], micro['experts'], micro['data']
    with pytest.raises(HyperparameterError, match="setting='unsupervised' is not one of"):
        merge('neulig', pre, experts, data=data, setting='unsupervised')
    for s in (0, -1, 1.5):
        with pytest.raises(HyperparameterError, match='data_scale'): merge('neulig', pre, experts, data=data, data_scale=s)
    with pytest.raises(HyperparameterError, match='expected length 2 \\(shapes, colors\\)'):
        check_coopvec([1/3] * 3, 2, ['shapes', 'colors'])
    m = _model(micro)
    with pytest.raises(HyperparameterError, match='expected length 2'):
        CoopClassifier(m, data.heads, 'colors', 'merge', torch.tensor([1.]))(micro['x'])
    other = {k: (torch.zeros(v.shape[0] * 2, *v.shape[1:]) if k.endswith('fc1.weight') else v) for k, v in experts['colors'].items()}
    with pytest.raises(IncompatibleModelsError, match='fc1.weight'):
        NeuLigModel(pre, {'shapes': experts['shapes'], 'colors': other}, micro['models'].config)
    with pytest.raises(HyperparameterError, match='needs `data`'): merge('neulig', pre, experts)
    assert MERGE_METHODS['neulig'].kind == 'data-based'

def test_balance_term_acts_only_in_the_semi_supervised_setting(micro):
    "The usage-balance term changes what semi-supervised training learns, and nothing in the supervised setting."
    def trained(setting, balance):
        torch.manual_seed(1)   # the same Portland initialisation for every call
        m = _model(micro, perturb=False)
        train_portland(m, micro['data'], setting=setting, balance=balance, steps=2, lr=5e-2, batch_size=4, progress=False)
        return torch.cat([p.detach().flatten() for p in m.portland.parameters()])
    assert (trained('semi-supervised', 0.0) - trained('semi-supervised', 5.0)).abs().max() > 1e-4
    torch.testing.assert_close(trained('supervised', 0.0), trained('supervised', 5.0))
    with pytest.raises(HyperparameterError, match='balance'): train_portland(_model(micro), micro['data'], balance=-1, steps=1)

# ---------------------------------------------------------------- Table s8: half-data experts and transfer

def test_half_zoo_halves_are_disjoint_cover_the_split_and_give_different_experts(micro, tmp_path):
    import json
    from fusion_nb.checkpoints import vision_state_dict
    from fusion_nb.neulig.half_zoo import HalfZooBudget, half_indices, half_zoo
    from fusion_nb.tiny.finetune import finetune_vision
    from fusion_nb.tiny.zoo import deterministic
    budget = HalfZooBudget(steps=2, lr=1e-2, batch_size=4)
    z = half_zoo(tmp_path/'halves', micro['models'], micro['tasks'], budget=budget, progress=False)
    man = json.loads((tmp_path/'halves'/'manifest.json').read_text())['experts']
    mp = micro['models']
    for t in micro['names']:
        task = micro['tasks'][t]
        train = task.load(split='train')
        idx = half_indices(len(train), budget.seed)
        a, b = set(idx['A'].tolist()), set(idx['B'].tolist())
        assert not a & b and a | b == set(range(len(train))) and len(a) == len(b) == len(train) // 2   # 12 samples: 6 + 6
        assert man[f'{t}_A']['half_size'] + man[f'{t}_B']['half_size'] == len(train)
        A, B = vision_state_dict(z['A'][t]), vision_state_dict(z['B'][t])
        assert any(not torch.equal(A[k], B[k]) for k in A.keys()), f'{t}: model-A and model-B are the same'
        # each expert saw its own half: fine-tuned here on that half, selected independently, it has the same weights
        with deterministic(budget.threads):
            mine = finetune_vision(mp.clip, mp.tokenizer, mp.processor, train.select(sorted(b)), task.class_names, task.templates,
                                   steps=2, lr=1e-2, batch_size=4, seed=budget.seed, device='cpu', progress=False).state_dict()
        assert all(torch.equal(mine[k], B[k]) for k in B.keys())

def test_transfer_portland_keeps_coopvecs_and_merges_the_other_experts(micro):
    from fusion_nb.neulig.neulig import transfer_portland
    from fusion_nb.neulig.portland import merge_with_coopvec
    src, x, mp = _model(micro), micro['x'], micro['models']
    g = torch.Generator().manual_seed(1)
    others = {t: {k: sd[k] + 0.05 * torch.randn(sd[k].shape, generator=g) if sd[k].is_floating_point() else sd[k] for k in sd.keys()}
              for t, sd in micro['experts'].items()}
    dst = transfer_portland(src, NeuLigModel(micro['pre'], others, mp.config))
    heads = micro['data'].heads
    with torch.no_grad():
        c = src.coopvecs(x)
        torch.testing.assert_close(dst.coopvecs(x), c)
        got = CoopClassifier(dst, heads, 'colors', 'merge')(x)
        for i in (0, 7):   # sample i: the *other* experts merged by its CoopVec, evaluated by the project's classifier
            ref = _zeroshot(micro, mp.vision_model(merge_with_coopvec(micro['pre'], others, c[i])), 'colors')(x[i:i + 1])[0]
            torch.testing.assert_close(got[i], ref, atol=2e-4, rtol=1e-4)
        ens = CoopClassifier(dst, heads, 'colors', 'ensemble')(x)
        logp = torch.stack([_zeroshot(micro, mp.vision_model(others[t]), 'colors')(x) for t in dst.names])   # (K, batch, classes)
        # Σₖ cₖ logitsₖ (log-probabilities differ from logits by a per-sample constant, which Σₖ cₖ = 1 keeps)
        torch.testing.assert_close(ens, (c.T[:, :, None] * logp).sum(0).log_softmax(-1), atol=2e-4, rtol=1e-4)
        assert (got - CoopClassifier(src, heads, 'colors', 'merge')(x)).abs().max() > 1e-4
    with pytest.raises(IncompatibleModelsError, match='trained for experts'):
        transfer_portland(src, NeuLigModel(micro['pre'], {'colors': others['colors'], 'shapes': others['shapes']}, mp.config))


# ---------------------------------------------------------------- Table s8 on the A halves (issue 25, item 7)

def test_portland_sees_only_the_given_training_rows(micro):
    "train_portland(subsets=...) draws its visible data from those rows only (Table s8: model-A's half), no other row."
    from fusion_nb.neulig.neulig import visible_split, train_portland
    task = micro['tasks']['colors']
    full = task.load(split='train')
    rows = list(range(0, len(full), 2))   # every other row, as a half would be
    vis = visible_split(task, 1.0, 0, rows)
    assert len(vis) == len(rows) and vis['label'] == [full[i]['label'] for i in rows]
    half = visible_split(task, 0.5, 0, rows)
    assert len(half) == round(len(rows) / 2)
    by_image = {full[i]['image'].tobytes(): i for i in range(len(full))}
    assert {by_image[im.tobytes()] for im in half['image']} <= set(rows)
    m = _model(micro, perturb=False)
    info = train_portland(m, micro['data'], steps=1, batch_size=2, progress=False, subsets={t: rows if t == 'colors' else [0, 1] for t in m.names})
    assert info['visible'] == {t: len(rows) if t == 'colors' else 2 for t in m.names}
    with pytest.raises(Exception, match='subsets has no training rows'): train_portland(m, micro['data'], steps=1, progress=False, subsets={'colors': rows})
    with pytest.raises(Exception, match='must be rows 0'): visible_split(task, 1.0, 0, [len(full)])
