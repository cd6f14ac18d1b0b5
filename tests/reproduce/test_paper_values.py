"""The transcribed paper values (data/paper_values/): schema, names, completeness, and internal consistency.

Every check here can fail on a transcription slip: a printed average must be the mean of its row (up to the
paper's one-decimal rounding), the full-precision results printed in paper 000's examples must round to the
table's cells, and the pre-trained rows of the two generalization tables (the same model) must agree.
"""
import pandas as pd
import pytest

from fusion_nb.reproduce.profiles import list_profiles, load_profile
from fusion_nb.reproduce.reports import load_paper_values, paper_table

COLUMNS = ['paper', 'table', 'model', 'method', 'task', 'metric', 'value']
KEY = ['paper', 'table', 'model', 'method', 'task', 'metric']
METHODS = {'pretrained', 'finetuned', 'simple_average', 'fisher_merging', 'regmean', 'task_arithmetic', 'concrete_task_arithmetic',
           'ties_merging', 'task_wise_adamerging', 'layer_wise_adamerging', 'concrete_layer_wise_adamerging', 'weight_ensembling_moe'}
TASKS = ['sun397', 'stanford_cars', 'resisc45', 'eurosat', 'svhn', 'gtsrb', 'mnist', 'dtd']
AVERAGES = {'avg', 'avg_seen', 'avg_unseen'}
CORRUPTIONS = ['clean', 'motion_blur', 'impulse_noise', 'gaussian_noise', 'pixelate', 'spatter', 'contrast', 'jpeg_compression']
UNSEEN = {'generalization_exp1': {'mnist', 'eurosat'}, 'generalization_exp2': {'resisc45', 'svhn'}}
# Averages the paper prints that are NOT the mean of their row (the transcription is right; the paper is not).
# Listed so the check below stays strict for every other cell; each entry must really be inconsistent.
PAPER_ERRATA = {('generalization_exp2', 'clip-vit-b32', 'pretrained', 'avg_unseen'): 40.1}  # (60.6 + 23.5) / 2 = 42.05
ROUNDING = 0.1 + 1e-9  # printed cells and the printed average are each rounded to one decimal

@pytest.fixture(scope='module')
def pv():
    v = load_paper_values()
    v = v[v['paper'].astype(str).str.zfill(3) == '000']  # this file checks paper 000; each paper's values have their own test
    return v.assign(tid=v['table'].str.split(':').str[0])

def test_schema(pv):
    raw = pd.read_csv(load_profile('tiny').root/'data'/'paper_values'/'paper000.csv', dtype=str)
    assert list(raw.columns) == COLUMNS and not raw.isna().any().any()
    assert set(raw['paper']) == {'000'}
    assert pd.api.types.is_float_dtype(pv['value']) and pv['value'].notna().all()
    assert (pv['table'].str.match(r'^[a-z0-9_]+: \S')).all(), 'table = "<short id>: <caption>"'

def test_names(pv):
    assert set(pv['method']) <= METHODS, set(pv['method']) - METHODS
    assert set(pv['task']) <= set(TASKS) | AVERAGES
    assert set(pv['model']) == {'clip-vit-b32', 'clip-vit-l14'} and set(pv['model']) <= set(list_profiles())
    assert set(pv['metric']) == {'accuracy', 'loss'}
    assert set(load_profile('clip-vit-b32').tasks) == set(TASKS)  # the file's task names are the profile's

def test_ranges_and_keys(pv):
    acc, loss = pv[pv['metric'] == 'accuracy'], pv[pv['metric'] == 'loss']
    assert acc['value'].between(0, 100).all() and (loss['value'] > 0).all()
    assert not pv.duplicated(KEY).any(), pv[pv.duplicated(KEY, keep=False)]
    # one caption per short id and model, so filtering by id and model (paper_table(table=...)) never mixes two tables
    assert (pv.groupby(['tid', 'model'])['table'].nunique() == 1).all()

def test_tables_complete(pv):
    acc = pv[pv['metric'] == 'accuracy']
    def cells(tid, model): return acc[(acc['tid'] == tid) & (acc['model'] == model)].groupby('method')['task'].apply(set)
    for model, n in [('clip-vit-b32', 12), ('clip-vit-l14', 10)]:
        rows = cells('multi_task', model)
        assert len(rows) == n and all(r == set(TASKS) | {'avg'} for r in rows)
    for tid in UNSEEN:
        rows = cells(tid, 'clip-vit-b32')
        assert len(rows) == 7 and all(r == set(TASKS) | {'avg_seen', 'avg_unseen'} for r in rows)
    assert sorted(t for t in pv['tid'].unique() if t.startswith('robustness')) == sorted(f'robustness_{c}' for c in CORRUPTIONS)
    for c in CORRUPTIONS:
        rows = cells(f'robustness_{c}', 'clip-vit-b32')
        assert len(rows) == 6 and all(r == {'stanford_cars', 'eurosat', 'resisc45', 'gtsrb', 'avg'} for r in rows)
    for m in ['simple_average', 'task_arithmetic']:  # the examples' printed results: accuracy and loss on all eight tasks
        ex = pv[pv['tid'] == f'examples_{m}']
        assert set(ex['method']) == {m} and ex.groupby('metric')['task'].apply(sorted).to_dict() == {k: sorted(TASKS) for k in ['accuracy', 'loss']}

def _average_deviations(pv):
    "Printed average minus the mean of the cells it averages, for every printed average."
    out = {}
    for (tid, model, method), g in pv[pv['metric'] == 'accuracy'].groupby(['tid', 'model', 'method']):
        v = dict(zip(g['task'], g['value']))
        tasks = [t for t in v if t not in AVERAGES]
        groups = {'avg': tasks}
        if tid in UNSEEN: groups = {'avg_seen': [t for t in tasks if t not in UNSEEN[tid]], 'avg_unseen': sorted(UNSEEN[tid])}
        for col, ts in groups.items():
            if col in v: out[(tid, model, method, col)] = v[col] - sum(v[t] for t in ts) / len(ts)
    return out

def test_averages_are_row_means(pv):
    dev = _average_deviations(pv)
    assert len(dev) == 22 + 2 * 14 + 48  # eight-task rows, seen and unseen of the generalization rows, robustness rows
    bad = {k: round(d, 3) for k, d in dev.items() if abs(d) > ROUNDING and k not in PAPER_ERRATA}
    assert not bad, bad
    for k, printed in PAPER_ERRATA.items():  # the errata list stays honest: each entry is printed so and really off
        assert pv.loc[(pv['tid'] == k[0]) & (pv['model'] == k[1]) & (pv['method'] == k[2]) & (pv['task'] == k[3]), 'value'].item() == printed
        assert abs(dev[k]) > ROUNDING

def test_examples_round_to_table_cells(pv):
    "The full-precision accuracies printed in the 'Basic Examples' round to the B/32 table's one-decimal cells."
    table = pv[(pv['tid'] == 'multi_task') & (pv['model'] == 'clip-vit-b32')].set_index(['method', 'task'])['value']
    ex = pv[pv['tid'].str.startswith('examples_') & (pv['metric'] == 'accuracy')]
    assert len(ex) == 16
    for r in ex.itertuples(): assert abs(r.value - table[(r.method, r.task)]) <= 0.05 + 1e-9, (r.method, r.task, r.value)

def test_generalization_pretrained_rows_agree(pv):
    "Both generalization tables evaluate the same pre-trained model on the same eight tasks."
    g = pv[pv['tid'].isin(list(UNSEEN)) & (pv['method'] == 'pretrained') & pv['task'].isin(TASKS)]
    wide = g.pivot(index='task', columns='tid', values='value')
    assert len(wide) == 8 and (wide['generalization_exp1'] == wide['generalization_exp2']).all()

def test_paper_table_selects_one_table(pv):
    "reports.paper_table with table='multi_task' gives the eight-task table's cells, not the examples' full-precision ones."
    t = paper_table(pv.drop(columns='tid'), 'clip-vit-b32', ['task_arithmetic', 'simple_average'], TASKS, table='multi_task')
    src = pv[(pv['tid'] == 'multi_task') & (pv['model'] == 'clip-vit-b32')].set_index(['method', 'task'])['value']
    for m in t.index:
        assert [t.loc[m, c] for c in TASKS] == [src[(m, c)] for c in TASKS] and t.loc[m, 'Avg.'] == src[(m, 'avg')]
