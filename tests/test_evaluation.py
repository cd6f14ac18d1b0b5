"Zero-shot heads, classifiers, ensembles and `evaluate` on the micro project, against naive per-sample computations."
import math, os, subprocess, sys

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fusion_nb.core import FusionError, HyperparameterError, NonFiniteError, UnknownNameError
from fusion_nb.evaluation import ZeroShotClassifier, evaluate, image_loader, task_head, zeroshot_head
from fusion_nb.pools import PRETRAINED, ModelPool, TaskPool
from fusion_nb.reproduce.profiles import load_profile
from conftest import PAPERMILL

@pytest.fixture(scope='module')
def pools(micro_project):
    p = load_profile('micro-test', settings=micro_project/'settings.ini')
    return p, ModelPool.from_profile(p), TaskPool.from_profile(p)

# ---------------------------------------------------------------- naive references

def naive_head(mp, class_names, templates):
    "Per class: embed each prompt alone, normalise, average, normalise."
    rows = []
    with torch.no_grad():
        for c in class_names:
            embs = []
            for t in templates:
                e = mp.clip.text_projection(mp.clip.text_model(**mp.tokenizer([t.format(c)], return_tensors='pt')).pooler_output)[0]
                embs.append(e / e.norm())
            m = torch.stack(embs).mean(0)
            rows.append(m / m.norm())
    return torch.stack(rows)

def naive_features(mp, encoder, image):
    "Preprocess one image, encode, project (unnormalised)."
    px = mp.processor(images=[image.convert('RGB')], return_tensors='pt')['pixel_values']
    with torch.no_grad(): return mp.clip.visual_projection(encoder(pixel_values=px).pooler_output)[0]

def naive_eval(mp, task, encoders, combine='probs', ds=None):
    "Accuracy and mean cross-entropy, one image at a time, of one encoder or a uniform ensemble."
    encoders = encoders if isinstance(encoders, list) else [encoders]
    head, s = naive_head(mp, task.class_names, task.templates), mp.clip.logit_scale.exp().item()
    ds = ds if ds is not None else task.load()
    correct, loss = 0, 0.0
    for ex in ds:
        zs = [naive_features(mp, e, ex['image']) for e in encoders]
        if combine == 'features':
            z = sum(zs) / len(zs); probs = torch.softmax(s * (z / z.norm()) @ head.T, -1)
        elif combine == 'logits':
            probs = torch.softmax(sum(s * (z / z.norm()) @ head.T for z in zs) / len(zs), -1)
        else:
            probs = sum(torch.softmax(s * (z / z.norm()) @ head.T, -1) for z in zs) / len(zs)
        correct += int(probs.argmax() == ex['label'])
        loss -= math.log(float(probs[ex['label']]))
    return correct / len(ds), loss / len(ds)

def value(rec, model, task, metric):
    return float(rec.query('model == @model and task == @task and metric == @metric')['value'].item())

# ---------------------------------------------------------------- heads

def test_head_equals_naive_per_class_computation(pools):
    _, mp, tp = pools
    for t in tp.names:
        task = tp[t]
        for bs in (1, 3, 256):
            h = zeroshot_head(mp.clip, mp.tokenizer, task.class_names, task.templates, batch_size=bs)
            torch.testing.assert_close(h, naive_head(mp, task.class_names, task.templates), atol=1e-5, rtol=1e-5)
    two = ['a photo of a {}.', 'a drawing of a {}.']
    torch.testing.assert_close(zeroshot_head(mp.clip, mp.tokenizer, ['red', 'blue'], two), naive_head(mp, ['red', 'blue'], two),
                               atol=1e-5, rtol=1e-5)
    assert not any(p.grad is not None for p in mp.clip.parameters())

def test_head_is_computed_once_per_task(pools):
    "The second head of a task runs no text forward pass, and is the caller's own tensor with the same values."
    _, mp, tp = pools
    first, calls = task_head(mp, tp['colors']), []
    hook = mp.clip.text_model.register_forward_hook(lambda *a: calls.append(1))
    try: again = task_head(mp, tp['colors'])
    finally: hook.remove()
    assert calls == [] and torch.equal(first, again) and first.data_ptr() != again.data_ptr()
    assert first.shape == (4, mp.clip.config.projection_dim)

def test_head_needs_names_and_templates(pools):
    _, mp, _ = pools
    with pytest.raises(FusionError, match='got 0 names and 1 templates'): zeroshot_head(mp.clip, mp.tokenizer, [], ['{}'])
    with pytest.raises(FusionError, match='got 2 names and 0 templates'): zeroshot_head(mp.clip, mp.tokenizer, ['a', 'b'], [])

# ---------------------------------------------------------------- combine modes on a hand-built case

class Fixed(nn.Module):
    "A stand-in encoder whose pooled output is a fixed vector."
    def __init__(self, v): super().__init__(); self.v = nn.Parameter(torch.tensor(v))
    def forward(self, pixel_values):
        return type('Out', (), {'pooler_output': self.v.expand(len(pixel_values), -1)})()

def test_combine_modes_on_hand_built_case():
    # z1 = (3, 0), z2 = (0, 1); identity projection and head; logit scale s = e^0 = 1
    encs, x = [Fixed([3.0, 0.0]), Fixed([0.0, 1.0])], torch.zeros(1, 3, 2, 2)
    clf = lambda combine, w=None: ZeroShotClassifier(encs, nn.Identity(), torch.tensor(0.0), torch.eye(2), combine, w)(x).exp()[0]
    e = math.e
    p1, p2 = torch.tensor([e / (e + 1), 1 / (e + 1)]), torch.tensor([1 / (e + 1), e / (e + 1)])
    torch.testing.assert_close(clf('probs'), (p1 + p2) / 2)                      # = (0.5, 0.5)
    torch.testing.assert_close(clf('logits'), torch.tensor([0.5, 0.5]))         # softmax(0.5, 0.5)
    # features: mean (1.5, 0.5), normalised (3, 1)/√10: the larger feature dominates
    a = 3 / math.sqrt(10) - 1 / math.sqrt(10)
    torch.testing.assert_close(clf('features'), torch.tensor([1 / (1 + math.exp(-a)), 1 / (1 + math.exp(a))]))
    assert clf('features')[0] > 0.6
    # weights: probs normalised, logits as given
    torch.testing.assert_close(clf('probs', [3, 1]), 0.75 * p1 + 0.25 * p2)
    torch.testing.assert_close(clf('logits', [2, -1]), torch.softmax(torch.tensor([2.0, -1.0]), 0))
    with pytest.raises(HyperparameterError, match="combine='mean'"): clf('mean')
    with pytest.raises(HyperparameterError, match='must be non-negative'): clf('probs', [1, -1])
    with pytest.raises(HyperparameterError, match='expected 2 finite numbers'): clf('logits', [1, float('nan')])

# ---------------------------------------------------------------- evaluate against naive loops

def test_evaluate_matches_naive_loop(pools):
    _, mp, tp = pools
    rec = evaluate({'pre': PRETRAINED, 'ex': 'shapes'}, mp, tp, batch_size=5, progress=False)
    assert list(rec.columns) == ['model', 'task', 'metric', 'value'] and len(rec) == 2 * 2 * 2
    assert set(rec['metric']) == {'accuracy', 'loss'}
    for name, enc in [('pre', mp.vision_model(PRETRAINED)), ('ex', mp.vision_model('shapes'))]:
        for t in tp.names:      # 'shapes' images are greyscale, 'colors' RGB
            acc, loss = naive_eval(mp, tp[t], enc)
            assert value(rec, name, t, 'accuracy') == pytest.approx(acc, abs=1e-12)
            assert value(rec, name, t, 'loss') == pytest.approx(loss, rel=1e-4)

def test_subsets_and_workers(pools):
    _, mp, tp = pools
    rec = evaluate({'ex': 'colors'}, mp, tp, tasks=['colors'], max_samples=5, seed=7, batch_size=2, progress=False)
    acc, loss = naive_eval(mp, tp['colors'], mp.vision_model('colors'), ds=tp['colors'].load(max_samples=5, seed=7))
    assert value(rec, 'ex', 'colors', 'accuracy') == pytest.approx(acc) and value(rec, 'ex', 'colors', 'loss') == pytest.approx(loss, rel=1e-4)
    two = evaluate({'ex': 'colors'}, mp, tp, tasks=['colors'], max_samples=5, seed=7, batch_size=2, num_workers=1, progress=False)
    pd.testing.assert_frame_equal(rec, two)

def test_loader_batches_match_processor(pools):
    _, mp, tp = pools
    ds = tp['shapes'].load()
    batches = list(image_loader(ds, mp.processor, batch_size=5))
    assert [len(b['label']) for b in batches] == [5, 5, 2]
    px = torch.cat([b['pixel_values'] for b in batches])
    ref = mp.processor(images=[im.convert('RGB') for im in ds['image']], return_tensors='pt')['pixel_values']
    torch.testing.assert_close(px, ref)
    assert torch.cat([b['label'] for b in batches]).tolist() == ds['label']

def test_rows_given_as_modules_and_state_dicts_equal_pool_names(pools):
    _, mp, tp = pools
    sd = {k: v.clone() for k, v in mp.vision_state('colors').items()}
    a = evaluate({'x': 'colors'}, mp, tp, progress=False)
    b = evaluate({'x': mp.vision_model('colors')}, mp, tp, progress=False)
    c = evaluate({'x': sd}, mp, tp, progress=False)
    pd.testing.assert_frame_equal(a, b); pd.testing.assert_frame_equal(a, c)

def test_per_model_tasks_and_key_columns(pools):
    _, mp, tp = pools
    rec = evaluate({'ft:shapes': 'shapes', 'pre': PRETRAINED}, mp, tp, tasks={'ft:shapes': ['shapes'], 'pre': tp.names},
                   progress=False, columns={'method': 'm', 'hparams': '{}'})
    assert list(rec.columns) == ['model', 'task', 'metric', 'value', 'method', 'hparams']
    assert sorted(rec.query("model == 'ft:shapes'")['task'].unique()) == ['shapes']
    assert len(rec) == (1 + 2) * 2 and (rec['method'] == 'm').all()
    with pytest.raises(FusionError, match=r"missing \['pre'\], unknown \[\]"):
        evaluate({'ft:shapes': 'shapes', 'pre': PRETRAINED}, mp, tp, tasks={'ft:shapes': ['shapes']}, progress=False)
    with pytest.raises(FusionError, match=r"extra columns \['task'\] would overwrite"):
        evaluate({'x': 'shapes'}, mp, tp, columns={'task': 1}, progress=False)

# ---------------------------------------------------------------- ensembles

def test_ensemble_of_one_and_of_copies_equal_the_encoder(pools):
    _, mp, tp = pools
    single = evaluate({'x': 'shapes'}, mp, tp, progress=False)
    for combine in ['probs', 'logits', 'features']:
        one = evaluate({'x': ['shapes']}, mp, tp, combine=combine, progress=False)
        same = evaluate({'x': ['shapes', 'shapes', mp.vision_model('shapes')]}, mp, tp, combine=combine, progress=False)
        pd.testing.assert_frame_equal(one, single, atol=1e-5, rtol=1e-5)
        pd.testing.assert_frame_equal(same, single, atol=1e-5, rtol=1e-5)

@pytest.mark.parametrize('combine', ['probs', 'logits', 'features'])
def test_ensemble_of_two_matches_naive(pools, combine):
    _, mp, tp = pools
    encs = [mp.vision_model('shapes'), mp.vision_model('colors')]
    rec = evaluate({'ens': ['shapes', 'colors']}, mp, tp, tasks=['colors'], combine=combine, progress=False)
    acc, loss = naive_eval(mp, tp['colors'], encs, combine)
    assert value(rec, 'ens', 'colors', 'accuracy') == pytest.approx(acc)
    assert value(rec, 'ens', 'colors', 'loss') == pytest.approx(loss, rel=1e-4)

def test_combine_modes_differ_on_real_encoders(pools):
    _, mp, tp = pools
    losses = {c: value(evaluate({'e': [PRETRAINED, 'colors']}, mp, tp, tasks=['colors'], combine=c, progress=False), 'e', 'colors', 'loss')
              for c in ['probs', 'logits', 'features']}
    assert len({round(v, 6) for v in losses.values()}) == 3, losses

def test_ensemble_method_spec_is_evaluated_like_a_list(pools):
    from fusion_nb.merge import merge
    _, mp, tp = pools
    spec = merge('ensemble', mp.vision_state(PRETRAINED), {t: mp.vision_state(t) for t in ['shapes', 'colors']})
    a = evaluate({'e': spec}, mp, tp, progress=False)
    b = evaluate({'e': ['shapes', 'colors']}, mp, tp, combine=spec.combine, progress=False)
    pd.testing.assert_frame_equal(a, b, atol=1e-5, rtol=1e-5)

# ---------------------------------------------------------------- layouts and bad input

def test_old_layout_evaluates_identically(micro_project, pools):
    _, mp, tp = pools
    mp_old = ModelPool.from_profile(load_profile('micro-test-old-layout', settings=micro_project/'settings.ini'))
    a = evaluate({'p': PRETRAINED, 'e': 'colors', 'ens': ['shapes', 'colors']}, mp, tp, progress=False)
    b = evaluate({'p': PRETRAINED, 'e': 'colors', 'ens': ['shapes', 'colors']}, mp_old, tp, progress=False)
    pd.testing.assert_frame_equal(a, b)

def test_bad_names_fail_before_evaluating(pools):
    _, mp, tp = pools
    with pytest.raises(UnknownNameError, match="unknown model 'cars'"): evaluate({'x': 'cars'}, mp, tp, progress=False)
    with pytest.raises(UnknownNameError, match="unknown model 'cars'"): evaluate({'x': ['shapes', 'cars']}, mp, tp, progress=False)
    with pytest.raises(UnknownNameError, match="unknown task 'cars'"): evaluate({'x': PRETRAINED}, mp, tp, tasks=['cars'], progress=False)
    with pytest.raises(HyperparameterError, match="combine='vote'"): evaluate({'x': PRETRAINED}, mp, tp, combine='vote', progress=False)
    with pytest.raises(FusionError, match="row 'x': cannot evaluate a float"): evaluate({'x': 1.0}, mp, tp, progress=False)

def test_non_finite_model_is_named(pools):
    _, mp, tp = pools
    sd = {k: v.clone() for k, v in mp.vision_state('shapes').items()}
    sd['post_layernorm.weight'][:] = float('nan')
    with pytest.raises(NonFiniteError, match="model 'broken' on task 'shapes': the cross-entropy is nan"):
        evaluate({'broken': sd}, mp, tp, tasks=['shapes'], progress=False)

def test_individual_experiment_runs_with_papermill(micro_project, tmp_path):
    out = tmp_path/'out'
    env = {**os.environ, 'FUSION_NB_ROOT': str(micro_project)}
    r = subprocess.run([*PAPERMILL, str(micro_project/'nbs'/'experiments'/'00_individual.ipynb'),
                        str(tmp_path/'run.ipynb'), '-k', 'python3', '-p', 'profile', 'micro-test', '-p', 'output_dir', str(out)],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    table = pd.read_csv(out/'table.csv', index_col=0)
    assert list(table.index) == ['Pre-trained', 'Fine-tuned (STL)'] and list(table.columns) == ['shapes', 'colors', 'Avg.']
    rec = pd.read_csv(out/'results.csv')
    # the table is the tidy records' view: each expert on its own task, the pretrained model on all
    ft = rec.query("method == 'finetuned' and metric == 'accuracy'")
    assert sorted(ft['model']) == ['finetuned:colors', 'finetuned:shapes']
    assert table.loc['Fine-tuned (STL)', 'colors'] == pytest.approx(100 * ft.query("task == 'colors'")['value'].iloc[0])
    assert table.loc['Pre-trained', 'Avg.'] == pytest.approx(table.loc['Pre-trained', ['shapes', 'colors']].mean())
