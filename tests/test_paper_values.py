"The transcribed paper values: schema, uniqueness, and every printed average against its row's mean."
import pandas as pd
import pytest
from fusion_nb.reports import load_paper_values

METHODS = {'pretrained', 'finetuned', 'simple_average', 'fisher_merging', 'regmean', 'task_arithmetic', 'concrete_task_arithmetic',
           'ties_merging', 'adamerging_task_wise', 'adamerging_layer_wise', 'concrete_adamerging_layer_wise', 'weight_ensembling_moe'}
TASKS = {'sun397', 'stanford_cars', 'resisc45', 'eurosat', 'svhn', 'gtsrb', 'mnist', 'dtd'}

@pytest.fixture(scope='module')
def pv(): return load_paper_values()

def test_schema_and_names(pv):
    assert list(pv.columns) == ['paper', 'table', 'model', 'method', 'task', 'metric', 'value']
    assert set(pv['method']) <= METHODS
    assert set(pv['task']) <= TASKS | {'avg', 'avg_seen', 'avg_unseen'}
    assert set(pv['model']) == {'clip-vit-b32', 'clip-vit-l14'}
    assert pv['value'].between(0, 100).all()
    assert not pv.duplicated(['paper', 'table', 'model', 'method', 'task', 'metric']).any()

def test_eight_task_tables_complete(pv):
    mt = pv[pv['table'].str.startswith('multi_task')]
    for model, n_methods in [('clip-vit-b32', 12), ('clip-vit-l14', 10)]:
        rows = mt[mt['model'] == model].groupby('method')['task'].apply(set)
        assert len(rows) == n_methods and all(r == TASKS | {'avg'} for r in rows)

def test_averages_are_row_means(pv):
    # the papers round to one decimal: a printed average may differ from the mean of printed values by rounding only
    checked = 0
    for (table, model, method), g in pv.groupby(['table', 'model', 'method']):
        v = dict(zip(g['task'], g['value']))
        tasks = [t for t in v if not t.startswith('avg')]
        if 'avg' in v:
            assert v['avg'] == pytest.approx(sum(v[t] for t in tasks) / len(tasks), abs=0.11), (table, model, method)
            checked += 1
    assert checked > 50
