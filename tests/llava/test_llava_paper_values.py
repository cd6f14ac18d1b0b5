"""Paper 004 (UQ-Merge) values transcribed in data/paper_values/paper004.csv: schema, names, and the paper's internal consistency.

Each check can fail on a transcription slip: printed averages are the mean of their cells, Table 1's mean ± sd are those of
the three selections of appendix Tables 8–9, Table 6 is the 5:7 weighted mean of Table 2's held-in and held-out averages,
Table 7's averages are the mean of the five held-in datasets, and the same UQ-Merge model carries the same numbers in
Tables 1–4. Cells the paper's text truncates (most POPE cells of Tables 2 and 9, Table 4's last uncertainty) or garbles
(Table 2's held-in columns, where the text repeats cells) are not transcribed.
"""
import numpy as np
import pandas as pd
import pytest

from fusion_nb.merge import MERGE_METHODS
from fusion_nb.reproduce.profiles import list_profiles, load_profile

COLUMNS = ['paper', 'table', 'model', 'method', 'task', 'metric', 'value']
KEY = ['paper', 'table', 'model', 'method', 'task', 'metric']
HELD_IN = ['ai2d', 'scienceqa', 'seedbench', 'mmbench', 'oodcv']
HELD_OUT = ['okvqa', 'textvqa', 'gqa', 'mmmu', 'vizwiz', 'vqav2', 'pope']
BASELINES = ['dare_task_arithmetic', 'della', 'weighted_average', 'ties_merging', 'task_arithmetic', 'model_stock']
NOT_METHODS = {'uq_merge', 'llava_v1.5_7b'}  # UQ-Merge's rows (a procedure around a method) and LLaVA-v1.5 trained on all data
TWO_DECIMALS = 0.01 + 1e-9  # a printed mean and its printed cells are each rounded to 0.01

@pytest.fixture(scope='module')
def pv():
    v = pd.read_csv(load_profile('tiny').root/'data'/'paper_values'/'paper004.csv', dtype={'paper': str})
    return v.assign(tid=v['table'].str.split(':').str[0])

def cells(pv, tid, metric='accuracy'):
    v = pv[(pv.tid == tid) & (pv.metric == metric)]
    return v.pivot_table(index='method', columns='task', values='value', aggfunc='first')

def test_schema_and_names(pv):
    assert list(pv.columns[:7]) == COLUMNS and not pv[COLUMNS].isna().any().any()
    assert set(pv.paper) == {'004'} and set(pv.model) == {'llava-1.5-7b'} and 'llava-1.5-7b' in list_profiles()
    assert not pv.duplicated(KEY).any(), pv[pv.duplicated(KEY, keep=False)]
    assert (pv.groupby('tid')['table'].nunique() == 1).all()
    methods = set(pv[pv.tid.isin(['table1', 'table2', 'table6', 'table8', 'table9'])].method)
    assert methods - NOT_METHODS == set(BASELINES) and all(MERGE_METHODS[m].name == m for m in BASELINES)
    assert {MERGE_METHODS[m].name for m in ['dare', 'linear', 'ties_merging']} == {'dare_task_arithmetic', 'linear', 'ties_merging'}  # linear: mergekit's (normalised), paper 004's Linear rows are weighted_average's paper settings, the same merge
    acc = pv[pv.metric.str.startswith('accuracy') | pv.metric.str.endswith('_accuracy')]
    assert acc.value.between(0, 100).all() and pv[pv.metric.str.startswith('uncertainty')].value.between(0, np.log(12)).all()

def test_printed_averages_are_row_means(pv):
    checked = 0
    for tid in ['table1', 'table2', 'table3', 'table8', 'table9']:
        for metric in pv[pv.tid == tid].metric.unique():
            if metric.endswith('_sd'): continue
            t = cells(pv, tid, metric)
            for avg, cols in [('avg_held_in', HELD_IN), ('avg_held_out', HELD_OUT)]:
                if avg not in t: continue
                full = t[cols].notna().all(axis=1) & t[avg].notna() if set(cols) <= set(t.columns) else pd.Series(False, t.index)
                for m in t.index[full]:
                    assert abs(t.loc[m, avg] - t.loc[m, cols].mean()) <= TWO_DECIMALS, (tid, metric, m, avg)
                    checked += 1
    assert checked >= 35

def test_table1_is_mean_and_sd_of_the_three_selections(pv):
    "Table 1's '±' is the sample standard deviation (ddof=1) of Tables 8–9's three selections, not sd/√3."
    t1, t1sd, checked = cells(pv, 'table1'), cells(pv, 'table1', 'accuracy_sd'), 0
    for tid in ['table8', 'table9']:
        sel = np.stack([cells(pv, tid, f'accuracy_selection{s}').reindex(index=BASELINES, columns=t1.columns).values for s in (1, 2, 3)])
        mean, sd = pd.DataFrame(sel.mean(0), BASELINES, t1.columns), pd.DataFrame(sel.std(0, ddof=1), BASELINES, t1.columns)
        for m in BASELINES:
            for c in t1.columns:
                if np.isnan(mean.loc[m, c]) or np.isnan(t1.loc[m, c]): continue
                assert abs(mean.loc[m, c] - t1.loc[m, c]) <= 0.005 + 0.005 + 1e-9, (tid, m, c)
                if c in t1sd and not np.isnan(t1sd.loc[m, c]): assert abs(sd.loc[m, c] - t1sd.loc[m, c]) <= 0.011, (tid, m, c, sd.loc[m, c])
                checked += 1
    assert checked >= 60

def test_table6_is_the_weighted_mean_of_table2_and_table1(pv):
    "Table 6 averages the 12 datasets: (5 · held-in avg + 7 · held-out avg) / 12 — of Table 2 for 10 models, of UQ-Merge's 7 for Linear."
    t2, t6, ours = cells(pv, 'table2'), cells(pv, 'table6'), cells(pv, 'table1').loc['uq_merge']
    for m in BASELINES:
        assert abs(t6.loc[m, 'avg_10_models'] - (5 * t2.loc[m, 'avg_held_in'] + 7 * t2.loc[m, 'avg_held_out']) / 12) <= 0.006, m
    assert abs(t6.loc['weighted_average', 'avg_7_models'] - (5 * ours['avg_held_in'] + 7 * ours['avg_held_out']) / 12) <= 0.006

def test_one_uq_merge_model_across_tables(pv):
    ours = cells(pv, 'table1').loc['uq_merge']
    assert cells(pv, 'table2').loc['uq_merge', 'avg_held_in'] == ours['avg_held_in']
    assert (cells(pv, 'table2').loc['uq_merge', HELD_OUT] == ours[HELD_OUT]).all()
    assert (cells(pv, 'table3').loc['uq_merge_uncertainty_descending', ['avg_held_out', *HELD_OUT]] == ours[['avg_held_out', *HELD_OUT]]).all()
    t4 = pv[pv.tid == 'table4'].pivot_table(index='metric', columns='task', values='value')
    assert t4.loc['heldout_accuracy', 'step_7'] == ours['avg_held_out'] and len(t4.columns) == 10
    assert cells(pv, 'table5').loc['uq_merge_input_model', 'avg_held_out'] == ours['avg_held_out']

def test_table7_averages_and_repeats(pv):
    t7 = pv[pv.tid == 'table7']
    assert sorted(t7.metric.unique()) == ['uncertainty_run1', 'uncertainty_run2', 'uncertainty_run3'] and t7.method.nunique() == 10
    for (m, run), g in t7.groupby(['method', 'metric']):
        v = dict(zip(g.task, g.value))
        assert abs(v['avg'] - np.mean([v[c] for c in HELD_IN])) <= 0.0001 + 1e-9, (m, run)
    spread = t7[t7.task == 'avg'].groupby('method').value.agg(lambda s: s.max() - s.min())
    assert (spread < 0.002).all()  # "the uncertainty is stable and consistent" (appendix A.1)
