"""The published numbers beyond paper 000 (data/paper_values/sota.csv): schema, names, and consistency with paper 000's table.

Each row is one method's ViT-B/32 eight-task average from its own paper, on a named checkpoint lineage. Checks that can
fail on a transcription slip: accuracies in percent, one number per (method, model, lineage), every number above paper
000's Task Arithmetic row and below its individual fine-tuned models (every such paper reports beating TA, and none
beats the experts on their own tasks on average), and every declared method in the file having the settings its row runs.
"""
import pandas as pd

from fusion_nb.merge import MERGE_METHODS
from fusion_nb.reproduce.sota import SOTA_COLUMNS, load_sota_values, sota_rows
from fusion_nb.reproduce.profiles import list_profiles, load_profile
from fusion_nb.reproduce.reports import load_paper_values

LINEAGES = {'task_vectors', 'tall_masks', 'fusion_bench'}   # Ilharco et al.'s fine-tunes, the TALL-masks re-fine-tunes, FusionBench's

def test_schema_and_names():
    raw = pd.read_csv(load_profile('tiny').root/'data'/'paper_values'/'sota.csv', dtype=str)
    assert list(raw.columns) == SOTA_COLUMNS and not raw.isna().any().any()
    v = load_sota_values()
    assert pd.api.types.is_float_dtype(v['value']) and v['value'].between(0, 100).all()
    assert v['method'].str.fullmatch(r'[a-z][a-z0-9_]*').all()
    assert set(v['lineage']) <= LINEAGES, set(v['lineage']) - LINEAGES
    assert set(v['model']) <= set(list_profiles())
    assert not v.duplicated(['method', 'model', 'lineage']).any()

def test_between_task_arithmetic_and_the_experts():
    p = load_paper_values()
    p = p[(p['paper'].astype(str).str.zfill(3) == '000') & p['table'].str.startswith('multi_task') & (p['task'] == 'avg')]
    for model, g in load_sota_values().groupby('model'):
        ref = p[p['model'] == model].set_index('method')['value']
        assert (g['value'] > ref['task_arithmetic']).all() and (g['value'] < ref['finetuned']).all(), g

def test_declared_methods_have_their_row_settings():
    v = load_sota_values()
    declared = [m for m in v['method'] if m in MERGE_METHODS]
    assert declared, 'no method of sota.csv is declared'
    for m in declared: assert 'sota' in MERGE_METHODS[m].papers, m
    rows, names = sota_rows(), list(dict.fromkeys(MERGE_METHODS[m].name for m in declared))   # a method may have several rows
    assert rows[:len(names)] == names   # the file's order first

def test_rows_held_against_the_profiles_lineage_and_ranked_within_it():
    "Issue 49: the clip-vit-b32 profile merges FusionBench's experts, so FusionBench's numbers are its published column."
    from fusion_nb.reproduce.sota import sota_table
    v = load_sota_values()
    methods = list(dict.fromkeys(v['method']))
    t = sota_table(pd.DataFrame({'Avg.': [float(i) for i in range(len(methods))]}, index=methods), v)
    t.index = methods
    want = {'iso_c': (82.8, 'fusion_bench', 86.3), 'iso_cts': (82.7, 'fusion_bench', 86.2), 'wudi_merging': (84.5, 'fusion_bench', 85.2),
            'cart': (84.7, 'task_vectors', 84.7), 'tsv_merging': (85.9, 'tall_masks', 85.9)}
    for m, w in want.items(): assert tuple(t.loc[m, ['published Avg.', 'lineage', "paper's Avg."]]) == w, m
    for lineage, g in t.groupby('lineage'):   # each lineage ranked on its own, by hand
        for m in g.index:
            assert g.loc[m, 'rank published'] == 1 + (g['published Avg.'] > g.loc[m, 'published Avg.']).sum()
            assert g.loc[m, 'rank here'] == 1 + (g['Avg.'] > g.loc[m, 'Avg.']).sum()
    assert t.loc['iso_c', 'rank published'] == 2 and t.loc['wudi_merging', 'rank published'] == 1   # 82.8 < 84.5, FusionBench's
