"The Ray backend on a local Ray instance (2 CPUs, one session for the module): same outputs, skipping and failure records as local."
import json, os, signal

import pandas as pd, pytest

ray = pytest.importorskip('ray')   # an optional extra: pip install 'fusion_nb[ray]'

from fusion_nb.core import FusionError
from fusion_nb.reproduce.cli import main, reproduce, sweep
from test_reproduce import FLAKY_BODY, SETTINGS, leftovers, project, write_nb

KILLED_BODY = """
import os, signal
from pathlib import Path
Path(output_dir, 'results.csv').write_text('half written\\n')
if Path(os.environ['FUSION_NB_ROOT'], 'die_now').exists():
    os.kill(os.getppid(), signal.SIGKILL)   # the kernel's parent: the Ray worker running the experiment
Path(output_dir, 'results.csv').write_text('complete\\n')
"""
OK_BODY = """
from pathlib import Path
Path(output_dir, 'results.csv').write_text(f'batch_size,pid\\n{batch_size},{os.getppid()}\\n')
"""

@pytest.fixture(scope='module', autouse=True)
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()

@pytest.fixture
def ray_project(project):
    exp = project/'nbs'/'experiments'
    write_nb(exp/'00_ok.ipynb', 'import os\n' + OK_BODY)
    write_nb(exp/'01_flaky.ipynb', FLAKY_BODY)     # fails while <root>/fail_now exists
    write_nb(exp/'02_killed.ipynb', KILLED_BODY)   # kills its Ray worker while <root>/die_now exists
    return project

def run(**kw):
    lines = []
    status = reproduce('demo', log=lines.append, progress=False, backend='ray', **kw)
    return status, '\n'.join(lines)

def test_failed_and_killed_tasks_are_isolated_recorded_and_rerun(ray_project, capsys):
    (ray_project/'fail_now').touch(); (ray_project/'die_now').touch()
    status, log = run()
    assert status == {'00_ok': 'ok', '01_flaky': 'failed', '02_killed': 'failed'}, log
    out = ray_project/'outputs'/'demo'
    assert pd.read_csv(out/'00_ok'/'results.csv').batch_size.tolist() == [8]                 # the profile's value, injected
    assert 'transient failure' in log and (out/'01_flaky.failed.ipynb').exists()            # a failure inside the notebook
    killed = json.loads((out/'02_killed.failed.json').read_text())                         # a worker that died: the driver records it
    assert 'Ray task did not finish' in log and killed['type'] in ('WorkerCrashedError', 'ActorDiedError', 'RayTaskError', 'NodeDiedError')
    assert not (out/'02_killed').exists()                                                  # the half-written folder never landed
    report = (out/'REPORT.md').read_text()
    assert '**Failed in the last run:** 01_flaky, 02_killed' in report and '## 00_ok' in report
    assert main(['reproduce', '--profile', 'demo', '--no-progress', '--backend', 'ray']) == 1   # the CLI exits non-zero naming both
    assert '2 experiment(s) failed: 01_flaky, 02_killed' in capsys.readouterr().err
    first = (out/'00_ok'/'inputs.json').read_text()
    (ray_project/'fail_now').unlink(); (ray_project/'die_now').unlink()
    status, log = run()
    assert status == {'00_ok': 'skipped', '01_flaky': 'ok', '02_killed': 'ok'}, log            # only what is missing
    assert (out/'00_ok'/'inputs.json').read_text() == first                                  # the survivor untouched
    assert (out/'02_killed'/'results.csv').read_text() == 'complete\n' and (out/'01_flaky'/'results.csv').read_text() == 'fine\n'
    assert not list(out.glob('*.failed.*')) and not leftovers(out) and 'Failed' not in (out/'REPORT.md').read_text()

def test_same_outputs_and_fingerprints_as_the_local_backend(ray_project):
    lines = []
    assert reproduce('demo', only=['00', '01'], progress=False, log=lines.append) == {'00_ok': 'ok', '01_flaky': 'ok'}
    out = ray_project/'outputs'/'demo'
    local_pid = pd.read_csv(out/'00_ok'/'results.csv').pid[0]
    status, log = run(only=['00', '01'])
    assert status == {'00_ok': 'skipped', '01_flaky': 'skipped'}           # one run_experiment, one notion of up to date
    status, log = run(only=['00'], force=True)
    assert status == {'00_ok': 'ok'} and 'submitted to Ray' in log
    assert pd.read_csv(out/'00_ok'/'results.csv').pid[0] not in (local_pid, os.getpid())   # it ran in a Ray worker

def test_sweep_on_ray(ray_project):
    lines = []
    status = sweep('00_ok', {'batch_size': ['3', '4']}, 'demo', progress=False, log=lines.append, backend='ray')
    assert status == {'batch_size=3': 'ok', 'batch_size=4': 'ok'}, '\n'.join(lines)
    merged = pd.read_csv(ray_project/'outputs'/'sweeps'/'demo'/'00_ok'/'results.csv')
    assert merged.batch_size.tolist() == [3, 4]

def test_resources_the_cluster_lacks_fail_at_once(ray_project):
    (ray_project/'settings.ini').write_text(SETTINGS + 'gpus_per_experiment = 1\n')
    with pytest.raises(FusionError, match=r"profile 'demo': gpus_per_experiment = 1, but the Ray cluster has 0 GPU\(s\)"):
        run()
    assert not (ray_project/'outputs'/'demo'/'00_ok').exists()

def test_a_real_experiment_gives_the_same_table_on_ray(micro_project, tmp_path):
    "00_individual on the micro test project, locally and as a Ray task: the same records."
    kw = dict(only=['00_individual'], progress=False, log=lambda *_: None, settings=micro_project/'settings.ini')
    assert reproduce('micro-test', output_root=tmp_path/'local', **kw) == {'00_individual': 'ok'}
    assert reproduce('micro-test', output_root=tmp_path/'ray', backend='ray', **kw) == {'00_individual': 'ok'}
    local, on_ray = (pd.read_csv(tmp_path/r/'micro-test'/'00_individual'/'results.csv') for r in ('local', 'ray'))
    assert len(local) == 8 and local.drop(columns='value').equals(on_ray.drop(columns='value'))   # 4 rows × 2 metrics
    assert on_ray.value.tolist() == pytest.approx(local.value.tolist(), rel=1e-6)
    assert reproduce('micro-test', output_root=tmp_path/'ray', backend='ray', **kw) == {'00_individual': 'skipped'}

def test_an_unreachable_address_fails_in_time_naming_it(ray_project, tmp_path):
    "Issue 26, item 9: `--address 127.0.0.1:1` hung past 200 s with only Ray's warnings; now a named error within the stated timeouts."
    import socket, subprocess, sys, time
    from fusion_nb.reproduce.runner import RAY_CONNECT_TIMEOUT, check_ray_address
    t0 = time.time()
    r = subprocess.run([sys.executable, '-m', 'fusion_nb.reproduce.cli', 'reproduce', '--profile', 'demo', '--backend', 'ray',
                        '--address', '127.0.0.1:1', '--no-progress'], env={**os.environ, 'FUSION_NB_ROOT': str(ray_project)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr
    assert f"fusion-nb: error: cannot reach the Ray cluster at '127.0.0.1:1' within {RAY_CONNECT_TIMEOUT:g} s" in r.stderr
    assert time.time() - t0 < 60 and not (ray_project/'outputs'/'demo'/'00_ok').exists()
    with socket.socket() as s:   # something listens there, but it is no Ray cluster (ray.init blocked for minutes)
        s.bind(('127.0.0.1', 0)); s.listen(8)
        t0 = time.time()
        with pytest.raises(FusionError, match=rf"could not join the Ray cluster at '127.0.0.1:{s.getsockname()[1]}' within 3 s"):
            check_ray_address(f'127.0.0.1:{s.getsockname()[1]}', join_timeout=3)
        assert time.time() - t0 < 10
