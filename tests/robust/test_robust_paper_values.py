"""Paper 002's transcribed tables (data/paper_values/paper002.csv): schema, completeness and internal consistency.

Each check can fail on a transcription slip: a printed MEAN must be the mean of its eight cells (up to the
two-decimal rounding), the best soups of Table 2 and the standard-ε soups of Table 3 are Table 1's soup rows,
and the claims the text makes about the tables (App. B.2's 59.46–59.48 %, §5.1's "4 out of the 8 datasets")
must hold for the numbers as transcribed.
"""
from pathlib import Path

import pandas as pd
import pytest

CSV = Path(__file__).resolve().parents[2]/'data'/'paper_values'/'paper002.csv'
SHIFTS = ['imagenet', 'imagenet_real', 'imagenet_v2', 'imagenet_a', 'imagenet_r', 'imagenet_sketch', 'conflict_stimuli', 'imagenet_c']
TABLE1 = ['nominal_training', 'adversarial_training', 'mae_b16', 'advprop', 'pyramid_at', 'indep_networks_ensemble',
          'individual_networks_ensemble', 'single_soup', 'dataset_specific_soups']
SOUPS = ['single_soup', 'dataset_specific_soups']

@pytest.fixture(scope='module')
def pv():
    v = pd.read_csv(CSV, dtype={'paper': str})
    return v.assign(tid=v['table'].str.split(':').str[0])

def cells(pv, tid, method):
    g = pv[(pv.tid == tid) & (pv.method == method)]
    return dict(zip(g.task, g.value))

def test_schema_and_keys(pv):
    assert list(pv.columns[:7]) == ['paper', 'table', 'model', 'method', 'task', 'metric', 'value']
    assert set(pv.paper) == {'002'} and set(pv.model) == {'vit-b16'} and set(pv.metric) == {'accuracy'}
    assert pv.value.between(0, 100).all() and not pv.duplicated(['table', 'method', 'task']).any()
    assert (pv.groupby('tid')['table'].nunique() == 1).all()   # one caption per short id

def test_tables_complete(pv):
    expected = {'table1': TABLE1, **{f'table2_rank{k}': SOUPS for k in (1, 2, 3)}, **{f'table3_{r}': SOUPS for r in ('eps', 'eps2', 'eps4')}}
    assert set(pv.tid) == set(expected)
    for tid, methods in expected.items():
        assert sorted(pv[pv.tid == tid].method.unique()) == sorted(methods)
        for m in methods: assert sorted(cells(pv, tid, m)) == sorted(SHIFTS + ['mean']), (tid, m)
    assert len(pv) == 9 * 9 + 6 * 2 * 9

def test_means_are_row_means(pv):
    "Cells and MEAN are printed to 0.01: the MEAN may differ from the mean of the printed cells by at most 0.01."
    for (tid, m), g in pv.groupby(['tid', 'method']):
        c = cells(pv, tid, m)
        assert abs(c['mean'] - sum(c[s] for s in SHIFTS) / 8) <= 0.01 + 1e-9, (tid, m)

def test_best_soups_repeat_table1(pv):
    "Table 2's best soups and Table 3's standard-radius soups are Table 1's soup rows (the paper prints them three times)."
    for m in SOUPS:
        assert cells(pv, 'table2_rank1', m) == cells(pv, 'table1', m) == cells(pv, 'table3_eps', m)

def test_text_claims(pv):
    # App. B.2: the three best single soups have mean accuracy 59.46 % to 59.48 %
    assert sorted(cells(pv, f'table2_rank{k}', 'single_soup')['mean'] for k in (1, 2, 3)) == [59.46, 59.46, 59.48]
    # §5.1: dataset-specific soups give the best accuracy of Table 1 on 4 of the 8 datasets
    t1 = pv[pv.tid == 'table1'].pivot(index='method', columns='task', values='value')
    assert sum(t1[s].idxmax() == 'dataset_specific_soups' for s in SHIFTS) == 4
    # §5.1: on IN-R and Conflict Stimuli the dataset-specific soup beats the closest baseline (non-soup row)
    baselines = t1.drop(index=SOUPS)
    assert all(t1.loc['dataset_specific_soups', s] > baselines[s].max() for s in ('imagenet_r', 'conflict_stimuli'))
