"""MLflow tracking (fusion_nb.reproduce.tracking) on a scratch project with toy notebooks: what `reproduce`, `sweep` and
`merge` record, nothing new for what was skipped, FAILED for what failed, --no-track, an unreachable server, two writers at
once, and the store read back as a user would — through `mlflow server`'s REST API and in a headless browser."""
import json, os, re, shutil, signal, socket, sqlite3, subprocess, sys, time, urllib.request
from pathlib import Path

import pytest

from conftest import scratch_sources
from test_reproduce import SETTINGS, write_nb
from fusion_nb.reproduce.cli import main
from fusion_nb.reproduce.runner import reproduce, sweep
from fusion_nb.reproduce.merge_config import run_merge
from fusion_nb.reproduce.tracking import MERGE_EXPERIMENT, Store, tracked_merge

mlflow = pytest.importorskip('mlflow')
from mlflow.tracking import MlflowClient

TABLE_BODY = """
from pathlib import Path
# accuracies (%) that depend on batch_size, so that a test can compute what the run must have recorded
Path(output_dir, 'table.csv').write_text(f',MNIST,SVHN\\nTask Arithmetic,{70 + batch_size},{60 + batch_size / 2}\\nTIES,55.5,\\n')
Path(output_dir, 'table.md').write_text('| table |\\n')
Path(output_dir, 'findings.csv').write_text('finding,difference (points),verdict\\nTA > TIES,3.5,holds\\nTIES > TA,-3.5,does not hold\\n')
Path(output_dir, 'findings.md').write_text('| findings |\\n')
Path(output_dir, 'results.csv').write_text(f'method,task,accuracy\\nTIES,MNIST,55.5\\n')
"""
BOOM_BODY = "raise RuntimeError('boom in experiment')"

@pytest.fixture(scope='module')
def proj(tmp_path_factory):
    root = tmp_path_factory.mktemp('tracked')
    (root/'settings.ini').write_text(SETTINGS)
    exp = root/'nbs'/'experiments'; exp.mkdir(parents=True)
    write_nb(exp/'00_table.ipynb', TABLE_BODY, title='Table'); write_nb(exp/'01_boom.ipynb', BOOM_BODY, title='Boom')
    scratch_sources(root)
    with pytest.MonkeyPatch.context() as mp:
        for k in ('FUSION_NB_TRACK', 'MLFLOW_TRACKING_URI'): mp.delenv(k, raising=False)   # conftest turns tracking off
        mp.setenv('FUSION_NB_ROOT', str(root))
        yield root

def store(root): return f"sqlite:///{root/'outputs'/'mlruns.db'}"

def runs(root, experiment='demo'):
    "The store's runs of `experiment`: run name → list of runs, oldest first."
    c = MlflowClient(store(root))
    e = c.get_experiment_by_name(experiment)
    out = {}
    for r in sorted(c.search_runs([e.experiment_id], max_results=1000), key=lambda r: r.info.start_time) if e else []:
        out.setdefault(r.info.run_name, []).append(r)
    return out

def artifacts(root, run_id, path=''):
    return sorted(a.path for a in MlflowClient(store(root)).list_artifacts(run_id, path))

@pytest.fixture(scope='module')
def first(proj):
    "The first `reproduce` of the scratch profile: 00_table runs, 01_boom fails."
    lines = []
    status = reproduce('demo', log=lines.append, progress=False)
    return status, lines

def test_reproduce_records_a_parent_and_a_run_per_experiment(proj, first):
    status, lines = first
    assert status == {'00_table': 'ok', '01_boom': 'failed'}
    got = runs(proj)
    parent, = got['reproduce demo']; ok, = got['00_table']; bad, = got['01_boom']
    assert ok.data.tags['mlflow.parentRunId'] == parent.info.run_id == bad.data.tags['mlflow.parentRunId']
    assert parent.info.status == 'FAILED' and ok.info.status == 'FINISHED' and bad.info.status == 'FAILED'   # one failed: as the exit status says
    # metrics: the table's cells, method × task, as the notebook computed them from the profile's batch_size (8)
    m = ok.data.metrics
    assert m['table/Task Arithmetic/MNIST'] == 70 + 8 and m['table/Task Arithmetic/SVHN'] == 60 + 8 / 2 and m['table/TIES/MNIST'] == 55.5
    assert 'table/TIES/SVHN' not in m   # an empty cell is no number
    assert m['findings/TA _ TIES/difference _points_'] == 3.5 and m['findings/TA _ TIES/verdict'] == 1.0
    assert m['findings/TIES _ TA/verdict'] == 0.0 and ok.data.tags['findings/TIES _ TA/verdict'] == 'does not hold'
    assert not any(k.startswith('results') for k in m)   # tidy records are an artifact, not repeated as metrics
    inputs = json.loads((proj/'outputs'/'demo'/'00_table'/'inputs.json').read_text())
    p = ok.data.params
    assert p['param.batch_size'] == '8' and p['profile.batch_size'] == '8' and p['inputs.hash'] == inputs['hash']
    assert p['inputs.notebook'] == inputs['notebook'] and m['seconds'] == inputs['seconds']
    assert artifacts(proj, ok.info.run_id) == ['findings.csv', 'findings.md', 'inputs.json', 'results.csv', 'run.ipynb', 'table.csv', 'table.md']
    assert 'boom in experiment' in bad.data.tags['error'] and bad.data.params['param.batch_size'] == '8'
    assert artifacts(proj, bad.info.run_id) == ['01_boom.failed.ipynb', '01_boom.failed.json']
    assert artifacts(proj, parent.info.run_id) == ['REPORT.md'] and len(parent.data.params['git.commit']) in (4, 40)   # 'none' outside git
    assert parent.data.metrics == {'experiments ok': 1, 'experiments skipped': 0, 'experiments failed': 1}
    assert (proj/'outputs'/'mlartifacts'/'demo').is_dir()   # the files under outputs/, not in the working folder
    assert any(l.startswith('tracking: 2 run(s) recorded') and 'mlflow ui --backend-store-uri sqlite:///' in l for l in lines)

def test_a_skipped_experiment_logs_nothing_new_a_failed_one_again(proj, first):
    before = {k: len(v) for k, v in runs(proj).items()}
    assert reproduce('demo', log=lambda s: None, progress=False) == {'00_table': 'skipped', '01_boom': 'failed'}
    after = {k: len(v) for k, v in runs(proj).items()}
    assert after == {**before, 'reproduce demo': before['reproduce demo'] + 1, '01_boom': before['01_boom'] + 1}
    assert reproduce('demo', only=['00_table'], log=lambda s: None, progress=False) == {'00_table': 'skipped'}
    assert {k: len(v) for k, v in runs(proj).items()} == after   # nothing ran: not even a parent run

def test_no_track_and_the_environment_turn_it_off(proj, first, capsys, monkeypatch):
    before = {k: len(v) for k, v in runs(proj).items()}
    assert main(['reproduce', '--profile', 'demo', '--only', '00_table', '--force', '--no-progress', '--no-track']) == 0
    monkeypatch.setenv('FUSION_NB_TRACK', '0')
    assert reproduce('demo', only=['00_table'], force=True, log=lambda s: None, progress=False) == {'00_table': 'ok'}
    assert {k: len(v) for k, v in runs(proj).items()} == before
    assert 'tracking' not in capsys.readouterr().out

def test_sweep_records_a_run_per_point(proj, first):
    lines = []
    assert sweep('00_table', {'batch_size': ['1', '2']}, 'demo', log=lines.append, progress=False) == {'batch_size=1': 'ok', 'batch_size=2': 'ok'}
    got = runs(proj)
    parent, = got['sweep 00_table']
    for b in (1, 2):
        r, = got[f'batch_size={b}']
        assert r.data.tags['mlflow.parentRunId'] == parent.info.run_id and r.data.params['param.batch_size'] == str(b)
        assert r.data.metrics['table/Task Arithmetic/MNIST'] == 70 + b
    assert parent.data.params['experiment'] == '00_table' and artifacts(proj, parent.info.run_id) == ['results.csv']

def test_an_unreachable_store_warns_once_and_the_outputs_are_written(proj, first, monkeypatch):
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]   # closed again: nothing listens there
    monkeypatch.setenv('MLFLOW_TRACKING_URI', f'http://127.0.0.1:{port}')
    monkeypatch.setenv('MLFLOW_HTTP_REQUEST_MAX_RETRIES', '0'); monkeypatch.setenv('MLFLOW_HTTP_REQUEST_TIMEOUT', '2')
    out = proj/'outputs'/'demo'/'00_table'
    shutil.rmtree(out)   # so that it runs again and writes its outputs anew
    lines = []
    assert reproduce('demo', only=['00_table'], log=lines.append, progress=False) == {'00_table': 'ok'}
    assert (out/'inputs.json').exists() and (out/'table.csv').exists()
    warned = [l for l in lines if 'tracking' in l]
    assert len(warned) == 1 and 'WARNING' in warned[0] and f'127.0.0.1:{port}' in warned[0] and '--no-track' in warned[0]

WRITER = """
import sys
from fusion_nb.reproduce.tracking import Store
with Store(sys.argv[1], sys.argv[2]).writing() as s:
    e = s.experiment('both')
    for i in range(int(sys.argv[4])):
        s.record_run(e, f'{sys.argv[3]} {i}', {'writer': sys.argv[3]}, {f'm{j}': i * j for j in range(50)})
"""

def test_two_processes_write_one_sqlite_store_at_once(tmp_path):
    "Two writers start together on a store that does not exist yet (both would create its tables): every run lands, whole."
    uri = f"sqlite:///{tmp_path/'mlruns.db'}"
    ps = [subprocess.Popen([sys.executable, '-c', WRITER, uri, str(tmp_path/'art'), w, '10'], stderr=subprocess.PIPE, text=True)
          for w in ('a', 'b')]
    errs = [p.communicate(timeout=240)[1] for p in ps]
    assert [p.returncode for p in ps] == [0, 0], errs
    c = MlflowClient(uri)
    got = c.search_runs([c.get_experiment_by_name('both').experiment_id], max_results=100)
    assert sorted(r.info.run_name for r in got) == sorted(f'{w} {i}' for w in 'ab' for i in range(10))
    assert all(r.data.metrics == {f'm{j}': float(int(r.info.run_name.split()[1]) * j) for j in range(50)} for r in got)
    assert sqlite3.connect(tmp_path/'mlruns.db').execute('PRAGMA integrity_check').fetchone() == ('ok',)

def test_merge_records_method_hyperparameters_hashes_time_and_memory(proj, tmp_path):
    assert run_merge.__wrapped__   # `fusion-nb merge` goes through tracked_merge
    @tracked_merge
    def fake_merge(config, out_dir, *, log=print):   # writes what `run_merge`'s export writes: inputs.json, README.md
        out = Path(out_dir); out.mkdir()
        (out/'inputs.json').write_text(json.dumps({'resolved': {'method': 'ties_merging', 'hyperparameters': {'k': 20, 'scaling_factor': 0.3},
                                                                'models': {'mnist': '/m/mnist'}, 'dtype': 'float32'},
                                                   'models': {'mnist': 'abc123'}, 'hash': 'h' * 64}))
        (out/'README.md').write_text('card'); bytearray(64 * 2**20)   # 64 MB at its peak
        return out
    lines = []
    fake_merge('cfg.yaml', tmp_path/'merged', log=lines.append)
    r, = runs(proj, MERGE_EXPERIMENT)['ties_merging → merged']
    p = r.data.params
    assert (p['method'], p['hyperparameters.k'], p['hyperparameters.scaling_factor'], p['hash.mnist']) == ('ties_merging', '20', '0.3', 'abc123')
    assert p['inputs.hash'] == 'h' * 64 and p['output'] == str((tmp_path/'merged').resolve())
    assert r.data.metrics['seconds'] >= 0 and r.data.metrics['peak_rss_mb'] >= 64
    assert artifacts(proj, r.info.run_id) == ['README.md', 'inputs.json'] and any('merge recorded' in l for l in lines)

def free_port():
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

@pytest.fixture(scope='module')
def server(proj, first):
    "`mlflow server` on the scratch project's store, on 127.0.0.1 and a free port, as a user starts it."
    yield from mlflow_server(store(proj))

def mlflow_server(uri:str):
    "Start `mlflow server` on store `uri` at 127.0.0.1 and a free port; yield its URL; stop it."
    port = free_port()
    p = subprocess.Popen([sys.executable, '-m', 'mlflow', 'server', '--backend-store-uri', uri, '--host', '127.0.0.1',
                          '--port', str(port), '--workers', '1'], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True,   # its workers in its process group, stopped with it
                         env={**os.environ, 'MLFLOW_SERVER_ENABLE_JOB_EXECUTION': 'false'})   # no job runner (GenAI jobs): starts in half the time
    url = f'http://127.0.0.1:{port}'
    for _ in range(240):
        try: urllib.request.urlopen(f'{url}/health', timeout=1); break
        except OSError:
            assert p.poll() is None, p.stderr.read()
            time.sleep(0.5)
    try: yield url
    finally:   # also when the test using it fails (the generator is closed)
        os.killpg(p.pid, signal.SIGTERM)
        try: p.wait(20)
        except subprocess.TimeoutExpired: os.killpg(p.pid, signal.SIGKILL); p.wait()

def api(url, path, body):
    req = urllib.request.Request(f'{url}/api/2.0/mlflow/{path}', json.dumps(body).encode(), {'Content-Type': 'application/json'})
    return json.loads(urllib.request.urlopen(req, timeout=30).read())

def test_the_server_shows_the_runs_through_its_rest_api(proj, server):
    exp = json.loads(urllib.request.urlopen(f'{server}/api/2.0/mlflow/experiments/get-by-name?experiment_name=demo', timeout=30).read())['experiment']
    found = api(server, 'runs/search', {'experiment_ids': [exp['experiment_id']], 'filter': "attributes.run_name = '00_table'"})['runs']
    metrics = {m['key']: m['value'] for m in found[0]['data']['metrics']}
    assert metrics['table/Task Arithmetic/MNIST'] == 78.0 and metrics['table/TIES/MNIST'] == 55.5

CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser') or shutil.which('google-chrome')

@pytest.mark.skipif(CHROMIUM is None, reason='no chromium to open the MLflow UI with (Debian: apt-get install -y chromium)')
def test_a_browser_shows_the_runs_in_the_mlflow_ui(proj, server, tmp_path):
    c = MlflowClient(store(proj))
    eid = c.get_experiment_by_name('demo').experiment_id
    run, = [r for r in c.search_runs([eid], "attributes.run_name = '00_table'") if r.info.status == 'FINISHED'][:1]
    flags = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--virtual-time-budget=30000',
             f'--user-data-dir={tmp_path/"profile"}', '--window-size=1600,900']
    page = f'{server}/#/experiments/{eid}/runs/{run.info.run_id}'   # the run's page: its parameters and metrics
    dom = subprocess.run([CHROMIUM, *flags, '--dump-dom', page], capture_output=True, text=True, timeout=180).stdout
    assert '00_table' in dom and 'table/Task Arithmetic/MNIST' in dom and re.search(r'>\s*78(\.0)?\s*<', dom), dom[-2000:]
    page = f'{server}/#/experiments/{eid}/runs'   # the runs side by side, for the docs
    shot = Path(os.environ.get('FUSION_NB_UI_SHOT') or tmp_path/'mlflow.png')
    subprocess.run([CHROMIUM, *flags, f'--screenshot={shot}', page], capture_output=True, timeout=180)
    assert shot.stat().st_size > 10_000

@pytest.mark.skipif(CHROMIUM is None, reason='no chromium to open the MLflow UI with (Debian: apt-get install -y chromium)')
def test_a_micro_profile_run_and_its_metrics_in_the_mlflow_ui(tmp_path, monkeypatch):
    "The project's real micro profile, experiment 00, tracked as `fusion-nb reproduce` tracks it; its run and a table cell in the UI."
    import pandas as pd
    for k in ('FUSION_NB_TRACK', 'MLFLOW_TRACKING_URI', 'FUSION_NB_ROOT'): monkeypatch.delenv(k, raising=False)   # conftest: off; proj: its root
    assert reproduce('micro', only=['00_individual'], output_root=tmp_path, progress=False, log=lambda s: None,
                     settings=Path(__file__).parents[2]/'settings.ini') == {'00_individual': 'ok'}
    table = pd.read_csv(tmp_path/'micro'/'00_individual'/'table.csv', index_col=0)
    row, task = table.index[0], table.columns[0]
    c, uri = MlflowClient(f"sqlite:///{tmp_path/'mlruns.db'}"), f"sqlite:///{tmp_path/'mlruns.db'}"
    eid = c.get_experiment_by_name('micro').experiment_id
    run, = c.search_runs([eid], "attributes.run_name = '00_individual'")
    key = f'table/{row}/{task}'
    assert run.data.metrics[key] == pytest.approx(table.loc[row, task])   # the table's cell, as recorded
    for url in mlflow_server(uri):
        flags = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--virtual-time-budget=30000',
                 f'--user-data-dir={tmp_path/"profile"}', '--window-size=1600,900']
        dom = subprocess.run([CHROMIUM, *flags, '--dump-dom', f'{url}/#/experiments/{eid}/runs/{run.info.run_id}'],
                             capture_output=True, text=True, timeout=180).stdout
        assert '00_individual' in dom and key in dom, dom[-2000:]
