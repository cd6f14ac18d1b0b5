"Paper 001's Mer./Ens./Gap (fusion_nb.neulig.merge_vs_ensemble): ensembles checked against a naive loop over the members, per-sample weights, one-hot weights, bad input, experiment 01."
import os, subprocess, sys
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from fusion_nb.core import FusionError, HyperparameterError, NonFiniteError
from fusion_nb.evaluation import ImageTransform, ZeroShotClassifier, evaluate, task_head
from fusion_nb.merge import merge
from fusion_nb.methods.data import MergeData
from fusion_nb.neulig.merge_vs_ensemble import (RoutedClassifier, gap_table, merge_ensemble_gap, output_ensemble, output_weights,
                                                 printable_gap_table)
from fusion_nb.methods.registry import OutputWeights
from fusion_nb.methods.we_moe import _layers
from fusion_nb.pools import PRETRAINED, ModelPool, TaskPool
from fusion_nb.reproduce.profiles import load_profile
from conftest import PAPERMILL

TASKS = ['shapes', 'colors']

@pytest.fixture(scope='module')
def pool(micro_project):
    torch.set_num_threads(1)
    p = load_profile('micro-test', settings=micro_project/'settings.ini')
    models, tasks = ModelPool.from_profile(p), TaskPool.from_profile(p)
    pre, experts = models.vision_state(PRETRAINED), {t: models.vision_state(t) for t in TASKS}
    data = MergeData(models, tasks, seed=0)
    moe = merge('weight_ensembling_moe', pre, experts, data=data, steps=0, progress=False)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():   # routers that really depend on the input (untrained ones output ≈ 0.3 everywhere)
        for layer in _layers(moe):
            for q in layer.mlp.router.parameters(): q.add_(torch.randn(q.shape, generator=g))
    results = {'simple_average': merge('simple_average', pre, experts, progress=False),
               'task_arithmetic': merge('task_arithmetic', pre, experts, scaling_factor=[0.7, 0.2], progress=False),
               'ties_merging': merge('ties_merging', pre, experts, progress=False),
               'layer_wise_adamerging': merge('layer_wise_adamerging', pre, experts, data=data, steps=2, lr=5e-2, batch_size=4, progress=False),
               'weight_ensembling_moe': moe}
    records = merge_ensemble_gap(results, models, tasks, batch_size=5, progress=False)
    return dict(models=models, tasks=tasks, pre=pre, experts=experts, results=results, records=records)

def split(pool, task):
    ds = pool['tasks'][task].load(max_samples=0, seed=0)
    b = ImageTransform(pool['models'].processor)(ds[:len(ds)])
    return b['pixel_values'], b['label']

def logits_by_hand(pool, model, task, x):
    "One member's logits, from its own encoder: projection, normalisation, zero-shot head, logit scale."
    enc = model if isinstance(model, torch.nn.Module) else pool['models'].vision_model(model)
    clip = pool['models'].clip
    z = clip.visual_projection(enc(pixel_values=x).pooler_output)
    return clip.logit_scale.exp() * F.normalize(z, dim=-1) @ task_head(pool['models'], pool['tasks'][task]).T

def scores(logits, y):
    return float((logits.argmax(-1) == y).double().mean()), float(F.cross_entropy(logits.double(), y))

def measured(pool, method, task, measure):
    r = pool['records']
    r = r[(r['method'] == method) & (r['task'] == task) & (r['measure'] == measure)].set_index('metric')['value']
    return float(r['accuracy']), float(r['loss'])

@pytest.mark.parametrize('method,weights', [
    ('simple_average', lambda pool: ({t: 0.5 for t in TASKS}, 0.0)),
    ('task_arithmetic', lambda pool: ({'shapes': 0.7, 'colors': 0.2}, 1 - 0.9)),
    ('layer_wise_adamerging', lambda pool: (dict(zip(TASKS, pool['results']['layer_wise_adamerging'].info['coefficients'].double().mean(1).tolist())), None))])
def test_ensemble_matches_a_naive_loop(pool, method, weights):
    w, w0 = weights(pool)
    w0 = 1 - sum(w.values()) if w0 is None else w0
    if method == 'layer_wise_adamerging':   # the check has teeth: the learned coefficients moved away from their 0.3 start
        assert max(abs(v - 0.3) for v in w.values()) > 1e-3
    for t in TASKS:
        x, y = split(pool, t)
        with torch.no_grad():
            logits = w0 * logits_by_hand(pool, pool['pre'], t, x) + sum(v * logits_by_hand(pool, pool['experts'][n], t, x) for n, v in w.items())
            merged = logits_by_hand(pool, pool['results'][method], t, x)
        acc, loss = measured(pool, method, t, 'Ens.')
        assert acc == pytest.approx(scores(logits, y)[0], abs=1e-12) and loss == pytest.approx(scores(logits, y)[1], rel=1e-4)
        assert measured(pool, method, t, 'Mer.')[0] == pytest.approx(scores(merged, y)[0], abs=1e-12)

def test_per_sample_ensemble_matches_an_image_by_image_loop(pool):
    moe = pool['results']['weight_ensembling_moe']
    for t in TASKS:
        x, y = split(pool, t)
        rows, spread = [], []
        with torch.no_grad():
            for i in range(len(x)):
                r = moe.routing_weights(x[i:i + 1]).mean(1)[0].double()
                spread.append(r)
                l = (1 - r.sum()) * logits_by_hand(pool, pool['pre'], t, x[i:i + 1]).double()
                rows.append(l + sum(r[k] * logits_by_hand(pool, pool['experts'][n], t, x[i:i + 1]).double() for k, n in enumerate(TASKS)))
        assert torch.stack(spread).std(0).max() > 1e-3   # the weights really differ from image to image
        acc, loss = measured(pool, 'weight_ensembling_moe', t, 'Ens.')
        want = scores(torch.cat(rows), y)
        assert acc == pytest.approx(want[0], abs=1e-12) and loss == pytest.approx(want[1], rel=1e-4)

def routed_classifier(pool, task, weights):
    spec = output_ensemble(pool['pre'], pool['experts'], weights)
    clip = pool['models'].clip
    return RoutedClassifier([ZeroShotClassifier(m if isinstance(m, torch.nn.Module) else pool['models'].vision_model(m), clip.visual_projection,
                                                clip.logit_scale, task_head(pool['models'], pool['tasks'][task])) for m in spec.members.values()],
                            spec.per_sample, spec.combine)

def test_a_prediction_does_not_depend_on_its_batch_mates(pool):
    clf = routed_classifier(pool, 'shapes', output_weights('weight_ensembling_moe', pool['results']['weight_ensembling_moe'], TASKS))
    x, _ = split(pool, 'shapes')
    xc, _ = split(pool, 'colors')
    with torch.no_grad():
        alone, in_batch = clf(x[2:3])[0], clf(x)[2]
        with_others = clf(torch.cat([xc[:4], x[2:3]]))[-1]
    torch.testing.assert_close(in_batch, alone, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(with_others, alone, rtol=1e-4, atol=1e-4)

def test_one_hot_weights_give_that_expert(pool):
    fixed = output_ensemble(pool['pre'], pool['experts'], OutputWeights({'shapes': 0.0, 'colors': 1.0}))
    r = evaluate({'ens': fixed, 'expert': 'colors'}, pool['models'], pool['tasks'], TASKS, batch_size=5, progress=False).set_index(['model', 'task', 'metric'])['value']
    routed = routed_classifier(pool, 'colors', OutputWeights(per_sample=lambda x: torch.tensor([[0.0, 0.0, 1.0]]).expand(len(x), 3)))
    x, y = split(pool, 'colors')
    with torch.no_grad(): want = logits_by_hand(pool, pool['experts']['colors'], 'colors', x)
    for t in TASKS:
        assert r['ens', t, 'accuracy'] == r['expert', t, 'accuracy'] and r['ens', t, 'loss'] == pytest.approx(r['expert', t, 'loss'], rel=1e-5)
    with torch.no_grad(): torch.testing.assert_close(routed(x), want.log_softmax(-1), rtol=1e-4, atol=1e-4)

def test_bad_weights_are_named(pool):
    pre, experts = pool['pre'], pool['experts']
    with pytest.raises(HyperparameterError, match='output weights has 3 values for 2 experts'): output_ensemble(pre, experts, OutputWeights([0.3, 0.3, 0.3]))
    with pytest.raises(HyperparameterError, match=r"output weights must be finite numbers; got \{'colors': nan"): output_ensemble(pre, experts, OutputWeights([0.3, float('nan')]))
    with pytest.raises(HyperparameterError, match=r"unknown: \['svhn'\], missing: \['colors'\]"): output_ensemble(pre, experts, OutputWeights({'shapes': 1.0, 'svhn': 0.0}))
    with pytest.raises(HyperparameterError, match='needs non-negative weights'): output_ensemble(pre, experts, OutputWeights([0.7, 0.7]), combine='probs')
    with pytest.raises(HyperparameterError, match=r'scaling_factor\[0\]=nan'): output_weights('task_arithmetic', pool['results']['task_arithmetic'], TASKS, {'scaling_factor': [float('nan'), 0.3]})
    x, _ = split(pool, 'shapes')
    with pytest.raises(FusionError, match=r'expected \(batch, members\) = \(12, 3\)'):
        routed_classifier(pool, 'shapes', OutputWeights(per_sample=lambda x: torch.ones(len(x), 2)))(x)
    with pytest.raises(NonFiniteError, match=r'samples \[0\]'):
        routed_classifier(pool, 'shapes', OutputWeights(per_sample=lambda x: torch.tensor([[float('nan'), 0, 1]] + [[0, 0, 1.]] * (len(x) - 1))))(x)

def test_gap_table(pool):
    t = gap_table(pool['records'], TASKS)
    for m in ['simple_average', 'task_arithmetic', 'layer_wise_adamerging', 'weight_ensembling_moe']:
        for c in TASKS: assert t.loc[m, (c, 'Gap')] == pytest.approx(abs(t.loc[m, (c, 'Mer.')] - t.loc[m, (c, 'Ens.')]))
        assert t.loc[m, ('Avg.', 'Gap')] == pytest.approx(abs(t.loc[m, ('Avg.', 'Mer.')] - t.loc[m, ('Avg.', 'Ens.')]))
        assert t.loc[m, ('Avg.', 'Ens.')] == pytest.approx(sum(t.loc[m, (c, 'Ens.')] for c in TASKS) / 2)
    p = printable_gap_table(t)
    assert p.loc['ties_merging', ('shapes', 'Ens.')] == '–' and p.loc['pretrained', ('Avg.', 'Gap')] == ''
    assert list(t.index) == ['pretrained', 'finetuned', *pool['results']]

def test_experiment_01_reports_ens_and_gap(micro_project, tmp_path):
    out = tmp_path/'01'
    args = [*PAPERMILL, str(micro_project/'nbs'/'experiments'/'01_multi_task_merging.ipynb'), str(tmp_path/'run.ipynb'),
            '-k', 'python3', '-p', 'profile', 'micro-test', '-p', 'output_dir', str(out)]
    r = subprocess.run(args, env={**os.environ, 'FUSION_NB_ROOT': str(micro_project)}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    table = pd.read_csv(out/'table.csv', index_col=0)
    assert list(table.columns) == [*TASKS, 'Avg.', 'Ens. (Avg.)', 'Gap (Avg.)']
    for m in ['Simple Averaging', 'Task Arithmetic', 'Model Stock']:
        assert table.loc[m, 'Gap (Avg.)'] == pytest.approx(abs(table.loc[m, 'Avg.'] - table.loc[m, 'Ens. (Avg.)']))
    assert table[['Ens. (Avg.)', 'Gap (Avg.)']].loc[['Pre-trained', 'Ties-Merging', 'DARE (TA)', 'DELLA']].isna().all().all()
    rec = pd.read_csv(out/'results.csv')
    ens = rec[(rec['measure'] == 'Ens.') & (rec['metric'] == 'accuracy')]
    assert set(ens['method']) == {'simple_average', 'task_arithmetic', 'model_stock'}
    gaps = pd.read_csv(out/'table_merge_vs_ensemble.csv', index_col=0, header=[0, 1])
    assert gaps.loc['Ties-Merging', ('Avg.', 'Ens.')] == '–'
