"Pools and evaluation on the micro project, against naive per-sample computations."
import json, os, subprocess, sys
import numpy as np
import pandas as pd
import pytest, torch
import torch.nn.functional as F

from fusion_nb.core import FusionError, UnknownNameError
from fusion_nb.evaluation import evaluate, zeroshot_head
from fusion_nb.pools import PRETRAINED, ModelPool, TaskPool
from fusion_nb.profiles import load_profile

@pytest.fixture(scope='module')
def pools(micro_project):
    p = load_profile('micro-test', settings=micro_project/'settings.ini')
    return p, ModelPool.from_profile(p), TaskPool.from_profile(p)

def naive_eval(mp, task, encoder):
    "Per image: preprocess, encode, project, normalise, compare with per-class prompt means."
    clip, tok, proc = mp.clip, mp.tokenizer, mp.processor
    with torch.no_grad():
        rows = []
        for c in task.classnames:
            embs = []
            for t in task.templates:
                e = clip.get_text_features(**tok([t.format(c)], return_tensors='pt'))
                e = e if isinstance(e, torch.Tensor) else e.pooler_output
                embs.append(e[0] / e[0].norm())
            m = torch.stack(embs).mean(0); rows.append(m / m.norm())
        head = torch.stack(rows)
        correct, loss, ds = 0, 0.0, task.load()
        for ex in ds:
            px = proc(images=[ex['image'].convert('RGB')], return_tensors='pt')['pixel_values']
            f = clip.visual_projection(encoder(pixel_values=px).pooler_output)[0]
            logits = clip.logit_scale.exp() * (f / f.norm()) @ head.T
            correct += int(logits.argmax() == ex['label'])
            loss += float(F.cross_entropy(logits[None], torch.tensor([ex['label']])))
    return correct / len(ds), loss / len(ds), head

def value(rec, model, task, metric):
    return float(rec.query('model == @model and task == @task and metric == @metric')['value'].iloc[0])

def test_evaluate_matches_naive_loop(pools):
    p, mp, tp = pools
    rec = evaluate({'pre': PRETRAINED, 'ex': 'shapes'}, mp, tp, batch_size=5, progress=False)
    assert set(rec.columns) == {'model', 'task', 'metric', 'value'} and len(rec) == 2 * 2 * 2
    for name, enc in [('pre', mp.vision_model(PRETRAINED)), ('ex', mp.vision_model('shapes'))]:
        for t in tp.names:
            acc, loss, head = naive_eval(mp, tp[t], enc)
            assert value(rec, name, t, 'accuracy') == pytest.approx(acc)
            assert value(rec, name, t, 'loss') == pytest.approx(loss, rel=1e-4)
    torch.testing.assert_close(zeroshot_head(mp.clip, mp.tokenizer, tp['colors'].classnames, tp['colors'].templates), head)

def test_per_model_tasks_and_columns(pools):
    p, mp, tp = pools
    rec = evaluate({'ft:shapes': 'shapes'}, mp, tp, tasks={'ft:shapes': ['shapes']}, progress=False, columns={'method': 'finetuned'})
    assert list(rec['task'].unique()) == ['shapes'] and (rec['method'] == 'finetuned').all()

def test_ensembles(pools):
    p, mp, tp = pools
    single = evaluate({'x': 'shapes'}, mp, tp, progress=False)
    for combine in ['probs', 'logits', 'features']:
        one = evaluate({'x': ['shapes']}, mp, tp, combine=combine, progress=False)
        same = evaluate({'x': ['shapes', 'shapes']}, mp, tp, combine=combine, progress=False)
        pd.testing.assert_frame_equal(one, single, atol=1e-5, rtol=1e-5)
        pd.testing.assert_frame_equal(same, single, atol=1e-5, rtol=1e-5)

def test_ensemble_of_two_is_mean_of_probabilities(pools):
    p, mp, tp = pools
    task = tp['colors']
    encs = [mp.vision_model('shapes'), mp.vision_model('colors')]
    clip = mp.clip
    with torch.no_grad():
        head = zeroshot_head(clip, mp.tokenizer, task.classnames, task.templates)
        nll, n = 0.0, 0
        for ex in task.load():
            px = mp.processor(images=[ex['image'].convert('RGB')], return_tensors='pt')['pixel_values']
            probs = 0
            for e in encs:
                f = F.normalize(clip.visual_projection(e(pixel_values=px).pooler_output), dim=-1)
                probs = probs + torch.softmax(clip.logit_scale.exp() * f @ head.T, -1) / 2
            nll -= float(torch.log(probs[0, ex['label']])); n += 1
    rec = evaluate({'ens': ['shapes', 'colors']}, mp, tp, tasks=['colors'], combine='probs', progress=False)
    assert value(rec, 'ens', 'colors', 'loss') == pytest.approx(nll / n, rel=1e-4)

def test_old_layout_experts_evaluate_identically(micro_project, pools):
    p, mp, tp = pools
    old = load_profile('micro-test-old-layout', settings=micro_project/'settings.ini')
    mp_old = ModelPool.from_profile(old)
    a = evaluate({'e': 'colors'}, mp, tp, progress=False)
    b = evaluate({'e': 'colors'}, mp_old, tp, progress=False)
    pd.testing.assert_frame_equal(a, b)

def test_bad_names(pools):
    p, mp, tp = pools
    with pytest.raises(UnknownNameError, match="unknown model 'cars'"): evaluate({'x': 'cars'}, mp, tp, progress=False)
    with pytest.raises(UnknownNameError, match="unknown task 'cars'"): evaluate({'x': PRETRAINED}, mp, tp, tasks=['cars'], progress=False)

def test_bad_dataset_schema(tmp_path):
    from datasets import Dataset, DatasetDict
    from fusion_nb.pools import Task
    DatasetDict(test=Dataset.from_dict({'img': [1], 'label': [0]})).save_to_disk(str(tmp_path/'d'))
    with pytest.raises(FusionError, match=r"dataset of task 'weird' lacks column\(s\) \['image'\]"):
        Task('weird', str(tmp_path/'d'), class_names_from='dataset').load()
    with pytest.raises(FusionError, match="dataset of task 'gone' not found"):
        Task('gone', str(tmp_path/'nope')).load()

def test_individual_experiment_runs_with_papermill(micro_project, tmp_path):
    out = tmp_path/'out'
    env = {**os.environ, 'FUSION_NB_ROOT': str(micro_project)}
    r = subprocess.run([sys.executable, '-m', 'papermill', str(micro_project/'nbs'/'experiments'/'00_individual.ipynb'),
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
    assert (out/'individual_accuracy.png').exists() and (out/'table.md').exists()

def test_ensemble_method_spec_is_evaluated_like_a_list(pools):
    from fusion_nb.merge import merge
    p, mp, tp = pools
    experts = {t: mp.vision_state(t) for t in ['shapes', 'colors']}
    spec = merge('ensemble', mp.vision_state(PRETRAINED), experts)
    a = evaluate({'e': spec}, mp, tp, progress=False)
    b = evaluate({'e': ['shapes', 'colors']}, mp, tp, combine=spec.combine, progress=False)
    pd.testing.assert_frame_equal(a, b, atol=1e-5, rtol=1e-5)
