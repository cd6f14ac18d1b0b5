"Issue 6's experiment notebooks, run with papermill on the real `micro` profile (built on first use), checked against the library."
import os, subprocess, sys
from pathlib import Path
import pandas as pd
import pytest, torch

from fusion_nb.reproduce.rows import paper_rows
from fusion_nb.reproduce.reports import ROW_LABELS
from fusion_nb.reproduce.profiles import load_profile, prepare
from fusion_nb.pools import ModelPool, TaskPool, PRETRAINED
from fusion_nb.evaluation import evaluate
from fusion_nb.methods.adamerging import layer_wise_adamerging
from fusion_nb.methods.we_moe import weight_ensembling_moe
from fusion_nb.methods.data import MergeData
from conftest import PAPERMILL

REPO = Path(__file__).resolve().parents[2]

def run_nb(tmp_path, name, *params):
    out = tmp_path/name
    args = [*PAPERMILL, str(REPO/'nbs'/'experiments'/f'{name}.ipynb'), str(tmp_path/f'{name}.run.ipynb'),
            '-k', 'python3', '-p', 'profile', 'micro', '-p', 'output_dir', str(out), *params]
    r = subprocess.run(args, env={**os.environ, 'FUSION_NB_ROOT': str(REPO), 'HF_HUB_OFFLINE': '1'}, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return out

@pytest.fixture(scope='module')
def micro():
    P = prepare(load_profile('micro', settings=REPO/'settings.ini'))
    return P, ModelPool.from_profile(P), TaskPool.from_profile(P)

def test_eight_task_table_every_row(micro, tmp_path):
    P, models, tasks = micro
    out = run_nb(tmp_path, '04_fusion_eight_tasks')
    table = pd.read_csv(out/'table.csv', index_col=0)
    assert list(table.index) == [ROW_LABELS[r] for r in ['pretrained', 'finetuned', *paper_rows('000', 'multi_task', 'micro')]]
    assert list(table.columns) == [*P.tasks, 'Avg.']
    assert table['Avg.'].tolist() == pytest.approx(table[P.tasks].mean(axis=1).tolist())
    # the saved artefacts merge, without training, the models the table evaluated
    pre, experts = models.vision_state(PRETRAINED), {t: models.vision_state(t) for t in P.tasks}
    lw = layer_wise_adamerging(pre, experts, coefficients=out/'artefacts'/'layer_wise_adamerging.safetensors')
    data = MergeData(models, tasks, seed=P.seed)
    moe = weight_ensembling_moe(pre, experts, data=data, load_from=out/'artefacts'/'weight_ensembling_moe.routers.safetensors')
    rec = evaluate({'lw': lw, 'moe': moe}, models, tasks, batch_size=P.batch_size, seed=P.seed, progress=False)
    acc = rec[rec.metric == 'accuracy'].pivot(index='model', columns='task', values='value') * 100
    assert acc.loc['lw', P.tasks].tolist() == pytest.approx(table.loc['Layer-wise AdaMerging', P.tasks].tolist())
    assert acc.loc['moe', P.tasks].tolist() == pytest.approx(table.loc['Weight-Ensembling MoE', P.tasks].tolist())
    curves = pd.read_csv(out/'learning_curves.csv')
    assert curves.groupby('method').size().loc['Layer-wise AdaMerging'] == 3   # micro: adamerging_steps = 3
    check_beyond_block(out, P, models, tasks, pre, experts)

def check_beyond_block(out, P, models, tasks, pre, experts):
    "The 'beyond paper 000' block: every sota row once (task-conditional ones apart, marked †), published numbers beside, one row re-evaluated."
    from fusion_nb.merge import MERGE_METHODS
    from fusion_nb.reproduce.sota import load_sota_values, published_numbers, sota_rows
    single = pd.read_csv(out/'table_beyond.csv', index_col=0)
    cond = out/'table_beyond_task_conditional.csv'
    cond = pd.read_csv(cond, index_col=0) if cond.exists() else single.iloc[:0]
    assert all(i.endswith(' †') for i in cond.index) and not any(i.endswith(' †') for i in single.index)
    labels = [*single.index[2:], *(i[:-2] for i in cond.index)]
    assert list(single.index[:2]) == ['Task Arithmetic', 'Ties-Merging']   # the reference rows, from the main table
    assert sorted(labels) == sorted(ROW_LABELS[r] for r in sota_rows(len(P.tasks)))
    pub = published_numbers(load_sota_values())['published Avg.']   # the profile's lineage where sota.csv has it (issue 49)
    for m, v in pub.items():
        if m in MERGE_METHODS and ROW_LABELS[m] in single.index: assert single.loc[ROW_LABELS[m], 'published Avg.'] == pytest.approx(v)
    m = MERGE_METHODS['consensus_ta']
    got = evaluate({'x': m(pre, experts, progress=False, **m.papers['sota'])}, models, tasks, batch_size=P.batch_size, seed=P.seed, progress=False)
    acc = got[got.metric == 'accuracy'].groupby('task')['value'].mean() * 100
    assert single.loc['Consensus TA', 'Avg.'] == pytest.approx(acc[P.tasks].mean())

def test_generalization_splits(micro, tmp_path):
    out = run_nb(tmp_path, '05_generalization', '-p', 'rows', 'task_arithmetic layer_wise_adamerging')
    for exp, seen, unseen in [('exp1', ['sun397', 'stanford_cars', 'resisc45', 'dtd', 'svhn', 'gtsrb'], ['mnist', 'eurosat']),
                              ('exp2', ['sun397', 'stanford_cars', 'gtsrb', 'eurosat', 'dtd', 'mnist'], ['resisc45', 'svhn'])]:
        t = pd.read_csv(out/f'table_{exp}.csv', index_col=0)
        assert list(t.columns) == [*seen, 'avg_seen', *unseen, 'avg_unseen']
        assert list(t.index) == ['Pre-trained', 'Task Arithmetic', 'Layer-wise AdaMerging']
        assert t['avg_unseen'].tolist() == pytest.approx(t[unseen].mean(axis=1).tolist())
        # the coefficients were learned for the six seen experts only
        from safetensors import safe_open
        import json
        with safe_open(str(out/'artefacts'/exp/'layer_wise_adamerging.safetensors'), 'pt') as f:
            assert json.loads(f.metadata()['info'])['tasks'] == seen

def test_robustness_blocks(micro, tmp_path):
    P, models, _ = micro
    out = run_nb(tmp_path, '06_robustness', '-p', 'corruptions', 'contrast pixelate', '-p', 'rows', 'task_arithmetic layer_wise_adamerging')
    t = pd.read_csv(out/'table.csv', index_col=[0, 1])
    assert list(dict.fromkeys(t.index.get_level_values(0))) == ['clean', 'contrast', 'pixelate']
    assert list(t.columns) == ['stanford_cars', 'eurosat', 'resisc45', 'gtsrb', 'avg']
    rec = pd.read_csv(out/'results.csv')
    # the clean block is the clean test split; a corruption block is its own split (same labels, other images)
    ta = rec[(rec.method == 'task_arithmetic') & (rec.metric == 'accuracy')]
    assert set(ta.test_set) == {'clean', 'contrast', 'pixelate'}
    # test-time adaptation ran once per test set
    for s in ['clean', 'contrast', 'pixelate']: assert (out/'artefacts'/s/'layer_wise_adamerging.safetensors').exists()
