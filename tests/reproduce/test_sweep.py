"`fusion-nb sweep`: a grid of papermill parameters, one executed notebook per point, one merged results.csv (local backend)."
import json, sys

import pandas as pd, pytest

from fusion_nb.core import FusionError
from fusion_nb.reproduce.cli import main
from fusion_nb.reproduce.runner import check_backend, sweep
from test_reproduce import project, write_nb   # the scratch project of the runner's tests (fixture included)

SWEEP_BODY = """
from pathlib import Path
import pandas as pd
if should_fail == 'yes' and batch_size == 3: raise RuntimeError(f'boom at batch_size={batch_size}')
rows = [{'metric': 'double', 'value': 2 * batch_size}, {'metric': 'tag', 'value': len(should_fail)}]
pd.DataFrame(rows).to_csv(Path(output_dir, 'results.csv'), index=False)
"""

@pytest.fixture
def sweep_project(project):
    write_nb(project/'nbs'/'experiments'/'02_grid.ipynb', SWEEP_BODY)
    return project

def cli(capsys, *args):
    "`fusion-nb ARGS` in this process (FUSION_NB_ROOT points at the scratch project): (exit status, stdout, stderr)."
    code = main(list(args)); out = capsys.readouterr()
    return code, out.out, out.err

def run_sweep(project, grid, **kw):
    lines = []
    status = sweep('02_grid', grid, 'demo', progress=False, log=lines.append, **kw)
    return status, '\n'.join(lines)

def test_grid_points_each_run_and_merge(sweep_project):
    status, log = run_sweep(sweep_project, {'batch_size': ['1', '2'], 'should_fail': ['no', 'maybe']})
    points = ['batch_size=1,should_fail=no', 'batch_size=1,should_fail=maybe', 'batch_size=2,should_fail=no', 'batch_size=2,should_fail=maybe']
    assert status == dict.fromkeys(points, 'ok'), log
    sdir = sweep_project/'outputs'/'sweeps'/'demo'/'02_grid'
    for p in points:   # one executed notebook per point, with the point's values injected over the profile's
        assert (sdir/p/'run.ipynb').exists()
        params = json.loads((sdir/p/'inputs.json').read_text())['parameters']
        assert (params['batch_size'], params['should_fail']) == (int(p.split(',')[0][-1]), p.split('=')[-1])
    merged = pd.read_csv(sdir/'results.csv')
    assert list(merged.columns) == ['batch_size', 'should_fail', 'metric', 'value']
    doubles = merged[merged.metric == 'double']
    assert list(zip(doubles.batch_size, doubles.should_fail, doubles.value)) == [(1, 'no', 2), (1, 'maybe', 2), (2, 'no', 4), (2, 'maybe', 4)]
    assert list(merged[merged.metric == 'tag'].value) == [2, 5, 2, 5]   # len('no'), len('maybe'): each point saw its own value
    assert not (sweep_project/'outputs'/'demo').exists()                # outputs/<profile>/ is reproduce's alone
    status, log = run_sweep(sweep_project, {'batch_size': ['1', '2'], 'should_fail': ['no', 'maybe']})
    assert set(status.values()) == {'skipped'} and 'up to date' in log
    assert run_sweep(sweep_project, {'batch_size': ['5']})[0] == {'batch_size=5': 'ok'}
    assert list(pd.read_csv(sdir/'results.csv').batch_size.unique()) == [5]   # the merged table is this grid's

def test_failed_point_is_isolated_named_and_rerun(sweep_project, capsys):
    (sweep_project/'settings.ini').write_text((sweep_project/'settings.ini').read_text().replace('should_fail = no', 'should_fail = yes'))
    status, log = run_sweep(sweep_project, {'batch_size': ['2', '3', '4']})
    assert status == {'batch_size=2': 'ok', 'batch_size=3': 'failed', 'batch_size=4': 'ok'}
    sdir = sweep_project/'outputs'/'sweeps'/'demo'/'02_grid'
    assert 'boom at batch_size=3' in log and (sdir/'batch_size=3.failed.ipynb').exists() and not (sdir/'batch_size=3').exists()
    assert sorted(pd.read_csv(sdir/'results.csv').batch_size.unique()) == [2, 4]
    code, out, err = cli(capsys, 'sweep', '02_grid', '-p', 'batch_size', '2', '3', '4', '--profile', 'demo', '--no-progress')
    assert code == 1 and '1 sweep point(s) failed: batch_size=3' in err
    assert '[batch_size=2] up to date' in out and '[batch_size=3] running' in out   # only what is missing reruns
    (sweep_project/'settings.ini').write_text((sweep_project/'settings.ini').read_text().replace('should_fail = yes', 'should_fail = no'))
    code, out, err = cli(capsys, 'sweep', '02_grid', '-p', 'batch_size', '2', '3', '4', '--profile', 'demo', '--no-progress')
    assert code == 0, err
    assert sorted(pd.read_csv(sdir/'results.csv').batch_size.unique()) == [2, 3, 4]
    assert not (sdir/'batch_size=3.failed.json').exists() and not [p for p in sdir.rglob('.*')]

def test_bad_sweeps_fail_before_anything_runs(sweep_project, capsys):
    with pytest.raises(FusionError, match=r"experiment '02_grid' has no parameter 'bach_size' to sweep; its parameters cell declares batch_size, should_fail"):
        run_sweep(sweep_project, {'bach_size': ['1']})
    with pytest.raises(FusionError, match=r"parameter 'batch_size': 'x' is not an integer"):
        run_sweep(sweep_project, {'batch_size': ['1', 'x']})
    code, _, err = cli(capsys, 'sweep', '02_grid', '-p', 'batch_size', '--profile', 'demo')
    assert code == 2 and "-p batch_size: give the parameter's values after its name" in err
    code, _, err = cli(capsys, 'sweep', '02_grid', '-p', 'batch_size', '1', '-p', 'batch_size', '2', '--profile', 'demo')
    assert code == 2 and '-p batch_size is given twice' in err
    code, _, err = cli(capsys, 'sweep', '09', '-p', 'batch_size', '1', '--profile', 'demo')
    assert code == 2 and "unknown experiment(s) '09'" in err
    code, _, err = cli(capsys, 'sweep', '02_grid', '-p', 'batch_size', 'x', '--profile', 'demo')
    assert code == 2 and "fusion-nb: error: parameter 'batch_size': 'x' is not an integer" in err
    assert not (sweep_project/'outputs').exists()

def test_ray_backend_without_ray_says_how_to_install(monkeypatch, sweep_project):
    monkeypatch.setitem(sys.modules, 'ray', None)   # as if Ray were not installed
    with pytest.raises(FusionError, match=r"the ray backend needs Ray, an optional dependency: pip install 'fusion_nb\[ray\]'"):
        check_backend('ray')
    with pytest.raises(FusionError, match="needs Ray"):
        run_sweep(sweep_project, {'batch_size': ['1']}, backend='ray')
    assert not (sweep_project/'outputs').exists()
