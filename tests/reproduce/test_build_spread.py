"bench/build_spread.py's reading of one build's outputs: every table row's average, and every claim's difference (paper 003)."
import importlib.util, sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]

def _bench():
    sys.path.insert(0, str(REPO/'bench'))   # build_spread imports reproduce_time beside it
    spec = importlib.util.spec_from_file_location('build_spread', REPO/'bench'/'build_spread.py')
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m

def test_averages_and_claim_differences_of_one_build(tmp_path):
    (tmp_path/'04_x').mkdir(); (tmp_path/'30_y').mkdir()
    pd.DataFrame({'a': [50., 60.], 'Avg.': [55., 65.]}, index=pd.Index(['TA', 'TIES'], name='method')).to_csv(tmp_path/'04_x'/'table.csv')
    pd.DataFrame({'difference (points)': [1.5, -0.25], 'verdict': ['holds', 'does not hold']},
                 index=pd.Index(['A beats B', 'C beats D'], name='claim')).to_csv(tmp_path/'30_y'/'findings.csv')
    pd.DataFrame({'finding': ['TA > TIES'], 'difference here': [3.0]}).to_csv(tmp_path/'04_x'/'findings.csv', index=False)   # 04's: no claim differences
    got = _bench().averages(tmp_path).set_index(['experiment', 'table', 'row'])['value'].to_dict()
    assert got == {('04_x', 'table', 'TA'): 55.0, ('04_x', 'table', 'TIES'): 65.0,
                   ('30_y', 'findings', 'A beats B'): 1.5, ('30_y', 'findings', 'C beats D'): -0.25}

def test_verdicts_of_criterion_findings_per_build(tmp_path):
    "Paper 002's findings (a criterion, no difference): 1 where it holds, 0 where not, named as `verdicts_across_builds` reads them."
    from fusion_nb.reproduce.reports import finding_label, verdicts_across_builds
    (tmp_path/'20_x').mkdir(); (tmp_path/'21_y').mkdir()
    f20 = pd.DataFrame({'holds': [True, False], 'evidence': ['3 of 6 fronts', '1 of 3']},
                       index=pd.MultiIndex.from_tuples([('(a) trades', 'cifar10'), ('(a) trades', 'imagenet')], names=['finding', 'dataset']))
    f20.to_csv(tmp_path/'20_x'/'findings.csv')
    pd.DataFrame({'holds': [True], 'evidence': ['2 of 3 wins']}, index=pd.Index(['(c) specific soups win'], name='finding')).to_csv(tmp_path/'21_y'/'findings.csv')
    got = _bench().averages(tmp_path).set_index(['experiment', 'table', 'row'])['value'].to_dict()
    assert got == {('20_x', 'findings', '(a) trades / cifar10'): 1.0, ('20_x', 'findings', '(a) trades / imagenet'): 0.0,
                   ('21_y', 'findings', '(c) specific soups win'): 1.0}
    builds = pd.DataFrame({'seed 0': [1.0, 0.0], 'seed 1': [1.0, 1.0]}, index=[finding_label(i) for i in f20.index])
    assert verdicts_across_builds(f20, builds)['verdict'].tolist() == ['holds', 'varies between builds']

def test_a_build_thread_count_is_refused(monkeypatch):
    "FUSION_NB_BUILD_THREADS changes the zoo's recipe: seed 0 would then be trained anew, not the pinned build the file says it is."
    import pytest
    monkeypatch.setenv('FUSION_NB_BUILD_THREADS', '1')
    with pytest.raises(SystemExit): _bench().main(['--only', '30'])
