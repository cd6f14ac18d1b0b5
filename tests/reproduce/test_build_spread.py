"bench/build_spread.py's reading of one build's outputs: every table row's average, and every claim's difference (paper 003)."
import pandas as pd

from conftest import bench_module

def _bench(): return bench_module('build_spread')   # it imports reproduce_time beside it

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

def _spread_file(path, zoo, rows, runs):
    "A build-spread file as build_spread writes it: header (recipes, runs), then one row per (experiment, table, row)."
    head = f"# build spread, profile tiny: zoo recipe {zoo}, llava zoo recipe ab12, robust zoo recipe cd34 (seed 0 = the pins), training seeds [0, 1, 2]; runs: {'; '.join(runs)}\n"
    path.write_text(head + pd.DataFrame(rows).to_csv(index=False))

OLD_RUNS = ['python bench/build_spread.py --profile tiny --only 01 04 --seeds 1 2 (10 s)',
            'python bench/build_spread.py --profile tiny --only 40 --seeds 1 2 --papermill (seed 1: 20 s; seed 2: 21 s)',
            'python bench/build_spread.py --profile tiny --only 10 --seeds 1 2 (30 s)',
            "the benchmark's zoo re-keyed from 0ff1, rebuilt to the same weights", 'the LLaVA zoo re-keyed from 0ff2, the same weights']
OLD_ROWS = [dict(experiment=e, table='table', row='r', **{'seed 0': 1.0, 'seed 1': 2.0, 'seed 2': 4.0}, min=1.0, max=4.0, spread=3.0)
            for e in ['04_fusion_eight_tasks', '10_neulig', '40_uq_merge']]

def test_a_new_benchmark_zoo_drops_the_rows_measured_on_the_old_one_but_not_those_of_own_zoos(tmp_path):
    m = _bench(); out = tmp_path/'spread.csv'
    _spread_file(out, 'aaa0', OLD_ROWS, OLD_RUNS)
    now = m.spread_table({0: pd.DataFrame([dict(experiment='04_fusion_eight_tasks', table='table', row='r', value=10.0)]),
                          1: pd.DataFrame([dict(experiment='04_fusion_eight_tasks', table='table', row='r', value=12.0)])})
    table, recipes, runs = m.merge_previous(out, now, {'zoo': 'bbb1'}, ['01', '04'])
    got = table.set_index('experiment')
    assert set(got.index) == {'04_fusion_eight_tasks', '40_uq_merge'}   # 10 read the old benchmark zoo: gone, not relabelled
    assert got.loc['04_fusion_eight_tasks', 'spread'] == 2.0 and pd.isna(got.loc['04_fusion_eight_tasks', 'seed 2'])   # no old seed mixed in
    assert got.loc['40_uq_merge', 'spread'] == 3.0
    assert recipes == {'zoo': 'bbb1', 'llava zoo': 'ab12'}   # the robust zoo's rows were not in the file: its recipe goes too
    assert runs == [OLD_RUNS[1], OLD_RUNS[4]]   # a run's own '; ' does not split it; a note on a dropped zoo goes

def test_seeds_of_an_earlier_run_on_the_same_zoo_add_up(tmp_path):
    "`--seeds 1` in one session, `--seeds 2` in the next: the file then holds three builds."
    m = _bench(); out = tmp_path/'spread.csv'
    _spread_file(out, 'c0de', [dict(experiment='04_fusion_eight_tasks', table='table', row='r', **{'seed 0': 10.0, 'seed 1': 12.0}, min=10.0, max=12.0, spread=2.0)],
                 ['python bench/build_spread.py --profile tiny --only 01 04 --seeds 1 (10 s)'])
    now = m.spread_table({0: pd.DataFrame([dict(experiment='04_fusion_eight_tasks', table='table', row='r', value=10.0)]),
                          2: pd.DataFrame([dict(experiment='04_fusion_eight_tasks', table='table', row='r', value=7.0)])})
    table, _, runs = m.merge_previous(out, now, {'zoo': 'c0de'}, ['01', '04'])
    r = table.set_index('experiment').loc['04_fusion_eight_tasks']
    assert (r['seed 0'], r['seed 1'], r['seed 2'], r['min'], r['max'], r['spread']) == (10.0, 12.0, 7.0, 7.0, 12.0, 5.0)
    assert runs == ['python bench/build_spread.py --profile tiny --only 01 04 --seeds 1 (10 s)']   # the run that measured seed 1 stays named
    assert list(table.columns) == ['experiment', 'table', 'row', 'seed 0', 'seed 1', 'seed 2', 'min', 'max', 'spread']

def test_a_seed_added_without_running_the_pinned_build_again(tmp_path):
    "`--keep-pinned`: this run measured seed 2 only; seed 0 (the pins) and seed 1 stay the file's, measured on the same zoo."
    m = _bench(); out = tmp_path/'spread.csv'
    _spread_file(out, 'c0de', [dict(experiment='04_fusion_eight_tasks', table='table', row='r', **{'seed 0': 10.0, 'seed 1': 12.0}, min=10.0, max=12.0, spread=2.0),
                               dict(experiment='20_robust_fronts', table='findings', row='(a) / cifar10', **{'seed 0': 1.0, 'seed 1': 0.0}, min=0.0, max=1.0, spread=1.0)],
                 ['python bench/build_spread.py --profile tiny --only 04 20 --seeds 1 (10 s)'])
    now = m.spread_table({2: pd.DataFrame([dict(experiment='04_fusion_eight_tasks', table='table', row='r', value=13.5)])})
    table, _, runs = m.merge_previous(out, now, {'zoo': 'c0de'}, ['04'])
    r = table.set_index('experiment')
    assert (r.loc['04_fusion_eight_tasks', 'seed 0'], r.loc['04_fusion_eight_tasks', 'seed 2'], r.loc['04_fusion_eight_tasks', 'spread']) == (10.0, 13.5, 3.5)
    assert pd.isna(r.loc['20_robust_fronts', 'seed 2']) and r.loc['20_robust_fronts', 'spread'] == 1.0   # not run for seed 2: its two builds stay
    assert runs == ['python bench/build_spread.py --profile tiny --only 04 20 --seeds 1 (10 s)']

def test_a_row_only_earlier_seeds_measured_is_kept(tmp_path):
    m = _bench(); out = tmp_path/'spread.csv'
    _spread_file(out, 'c0de', [dict(experiment='04_fusion_eight_tasks', table='table', row=r, **{'seed 0': 10.0, 'seed 1': 12.0}, min=10.0, max=12.0, spread=2.0)
                               for r in ('a', 'b')], ['python bench/build_spread.py --profile tiny --only 04 --seeds 1 (10 s)'])
    now = m.spread_table({2: pd.DataFrame([dict(experiment='04_fusion_eight_tasks', table='table', row='b', value=7.0)])})
    table, _, _ = m.merge_previous(out, now, {'zoo': 'c0de'}, ['04'])
    r = table.set_index('row')
    assert list(r.index) == ['b', 'a'] and r.loc['a', 'spread'] == 2.0 and pd.isna(r.loc['a', 'seed 2']) and r.loc['b', 'spread'] == 5.0

def test_a_rebuilt_own_zoo_drops_its_rows_unless_kept_on_purpose(tmp_path):
    "The robust zoo re-keyed (experiments 20 and 21 read it): rows and seeds measured on the old one go, unless named in keep_rows."
    m = _bench(); out = tmp_path/'spread.csv'
    rows = [dict(experiment=e, table='findings', row='x', **{'seed 0': 1.0, 'seed 1': 0.0, 'seed 2': 1.0}, min=0.0, max=1.0, spread=1.0)
            for e in ['20_robust_fronts', '21_robust_shifts']]
    runs = ['python bench/build_spread.py --profile tiny --only 20 21 --seeds 1 2 --papermill (9 s)']
    _spread_file(out, 'c0de', rows, runs)   # its robust zoo recipe: cd34
    now = m.spread_table({s: pd.DataFrame([dict(experiment='20_robust_fronts', table='findings', row='x', value=1.0)]) for s in (0, 1)})
    table, recipes, kept_runs = m.merge_previous(out, now, {'zoo': 'c0de', 'robust zoo': 'ef56'}, ['20'])
    got = table.set_index('experiment')
    assert list(got.index) == ['20_robust_fronts'] and pd.isna(got.loc['20_robust_fronts', 'seed 2'])   # no seed of the old zoo mixed in
    assert recipes['robust zoo'] == 'ef56' and kept_runs == []
    table, recipes, kept_runs = m.merge_previous(out, now, {'zoo': 'c0de', 'robust zoo': 'ef56'}, ['20'], keep_rows=['21'])
    assert set(table.experiment) == {'20_robust_fronts', '21_robust_shifts'} and kept_runs == runs and recipes['robust zoo'] == 'ef56'
    table, _, kept_runs = m.merge_previous(out, now, {'zoo': 'c0de', 'robust zoo': 'cd34'}, ['20'])   # the same zoo: seed 2 adds up
    assert table.set_index('experiment').loc['20_robust_fronts', 'seed 2'] == 1.0 and kept_runs == runs

def test_keep_rows_names_an_experiment_with_its_own_zoo_and_a_reason(capsys):
    "Refused before any copy is made: a benchmark-zoo experiment (its rows follow the benchmark's recipe), or no --note."
    import pytest
    with pytest.raises(SystemExit): _bench().main(['--only', '20', '--keep-rows', '04', '--note', 'why'])
    assert 'not an experiment with a zoo of its own' in capsys.readouterr().err
    with pytest.raises(SystemExit): _bench().main(['--only', '20', '--keep-rows', '21_robust_shifts'])
    assert '--keep-rows needs --note' in capsys.readouterr().err

def test_judging_a_run_of_another_build_keeps_its_seed_verdicts_out(tmp_path):
    "judge_findings: a claim judged over the run's own seeds (30, 31: 'within noise') counts only where the run is the file's seed 0."
    judge = bench_module('judge_findings')
    spread = pd.DataFrame({'experiment': '30_y', 'table': 'findings', 'row': ['A beats B', 'C beats D'],
                           'seed 0': [1.5, 0.2], 'seed 1': [1.4, 0.1], 'seed 2': [1.6, 0.3]}).set_index(['experiment', 'table', 'row'])
    def found(a, c): return pd.DataFrame({'claim': ['A beats B', 'C beats D'], 'difference (points)': [a, c], 'holds': [True, True],
                                          'verdict over seeds': ['holds', 'within noise']})
    same = judge.claims(spread, '30_y', found(1.5, 0.2))   # the file's seed 0: its verdicts stand
    assert same['verdict'].tolist() == ['holds', 'within noise'] and same['seed 0 is this run'].all()
    other = judge.claims(spread, '30_y', found(1.4, 0.2))   # A's value is another build's: its seeds' verdict is not seed 0's
    assert other['verdict'].tolist() == [judge.NOT_SEED0, 'within noise']

def test_reuse_runs_a_seed_whose_run_was_stopped(tmp_path, monkeypatch, capsys):
    "--reuse reads a seed's outputs only when each experiment finished there: a stopped run's '.<name>.<pid>.….tmp' would lose its rows."
    bs = _bench()
    (tmp_path/'nbs'/'experiments').mkdir(parents=True)
    for n in ['04_fusion_eight_tasks', '10_neulig', '30_masked_images']: (tmp_path/'nbs'/'experiments'/f'{n}.ipynb').write_text('{}')
    assert bs.experiments(tmp_path, ['04,10']) == bs.experiments(tmp_path, ['04', '10_neulig.ipynb']) == ['04_fusion_eight_tasks', '10_neulig']
    out = tmp_path/'spread'/'seed1'/'tiny'; (out/'.10_neulig.4242.k2x9.tmp').mkdir(parents=True); (out/'04_fusion_eight_tasks').mkdir()
    assert bs.unfinished(out, ['04_fusion_eight_tasks', '10_neulig']) == ['10_neulig'] and bs.unfinished(tmp_path/'none', ['10_neulig']) == ['10_neulig']
    ran = []
    monkeypatch.setattr(bs, 'run_logged', lambda argv, env, root: (ran.append(argv), (1, '', 0.0))[1])   # stands in for the run: it fails
    assert bs.main(['--only', '04,10', '--seeds', '1', '--root', str(tmp_path), '--reuse']) == 1
    assert len(ran) == 1 and 'reproduce' in ran[0] and "holds no finished output of 10_neulig" in capsys.readouterr().out
    (out/'10_neulig').mkdir(); assert bs.unfinished(out, bs.experiments(tmp_path, ['04,10'])) == []
