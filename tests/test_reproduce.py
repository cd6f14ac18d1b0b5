"The reproduce runner on a scratch project: skip-if-unchanged, failure isolation, atomic writes, REPORT.md, CLI."
import json, os, subprocess, sys, time
from pathlib import Path

import nbformat, pytest

from fusion_nb.core import UnknownNameError, FusionError
from fusion_nb.reproduce import reproduce

SETTINGS = """
[DEFAULT]
tasks = a b
batch_size = 8
[demo]
description = a scratch profile
pretrained = ./models/none
expert_template = ./models/none_{task}
dataset_template = ./datasets/{task}
should_fail = no
"""

def write_nb(path, body, params="profile = 'demo'\noutput_dir = None\nbatch_size = 1\nshould_fail = 'no'"):
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell(params); p.metadata['tags'] = ['parameters']
    nb.cells = [p, nbformat.v4.new_code_cell(body)]
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, str(path))

OK_BODY = """
from pathlib import Path
Path(output_dir, 'results.csv').write_text(f'batch_size\\n{batch_size}\\n')
Path(output_dir, 'table.md').write_text(f'| batch_size |\\n|---|\\n| {batch_size} |\\n')
"""
FAIL_BODY = """
from pathlib import Path
Path(output_dir, 'results.csv').write_text('partial\\n')
if should_fail == 'yes': raise RuntimeError('boom in experiment')
Path(output_dir, 'table.md').write_text('| fine |\\n|---|\\n| 1 |\\n')
Path(output_dir, 'results.csv').write_text('complete\\n')
"""

@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path/'settings.ini').write_text(SETTINGS)
    exp = tmp_path/'nbs'/'experiments'; exp.mkdir(parents=True)
    write_nb(exp/'00_ok.ipynb', OK_BODY)
    write_nb(exp/'01_flaky.ipynb', FAIL_BODY)
    monkeypatch.setenv('FUSION_NB_ROOT', str(tmp_path))
    return tmp_path

def run(project, **kw):
    lines = []
    status = reproduce('demo', log=lines.append, **kw)
    return status, '\n'.join(lines)

def test_runs_injects_profile_values_and_writes_report(project):
    status, log = run(project)
    assert status == {'00_ok': 'ok', '01_flaky': 'ok'}
    out = project/'outputs'/'demo'
    assert (out/'00_ok'/'results.csv').read_text() == 'batch_size\n8\n'   # the profile's batch_size was injected
    assert (out/'00_ok'/'run.ipynb').exists() and (out/'00_ok'/'inputs.json').exists()
    report = (out/'REPORT.md').read_text()
    assert '## 00_ok' in report and '| 8 |' in report and '## 01_flaky' in report
    assert not [p for p in out.iterdir() if p.name.startswith('.')]   # no temporary folders left

def test_skip_if_unchanged_and_rerun_on_change(project):
    run(project)
    status, log = run(project)
    assert status == {'00_ok': 'skipped', '01_flaky': 'skipped'} and 'up to date' in log
    assert run(project, force=True)[0] == {'00_ok': 'ok', '01_flaky': 'ok'}
    write_nb(project/'nbs'/'experiments'/'00_ok.ipynb', OK_BODY + "\nx = 1\n")   # the notebook changed
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'skipped'}
    (project/'settings.ini').write_text(SETTINGS.replace('batch_size = 8', 'batch_size = 16'))  # a parameter changed
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'ok'}
    assert (project/'outputs'/'demo'/'00_ok'/'results.csv').read_text() == 'batch_size\n16\n'

def test_failure_is_isolated_and_keeps_previous_outputs(project):
    run(project)
    prev = (project/'outputs'/'demo'/'01_flaky'/'table.md').read_text()
    (project/'settings.ini').write_text(SETTINGS.replace('should_fail = no', 'should_fail = yes').replace('batch_size = 8', 'batch_size = 9'))
    status, log = run(project)
    assert status == {'00_ok': 'ok', '01_flaky': 'failed'}
    out = project/'outputs'/'demo'
    assert 'FAILED' in log and 'boom in experiment' in log and '01_flaky.failed.ipynb' in log
    assert (out/'01_flaky'/'table.md').read_text() == prev                    # previous outputs kept
    assert (out/'01_flaky'/'results.csv').read_text() == 'complete\n'         # the half-written file never landed
    assert (out/'01_flaky.failed.ipynb').exists()
    assert (out/'00_ok'/'results.csv').read_text() == 'batch_size\n9\n'       # the other experiment still ran
    assert 'Failed in this run:** 01_flaky' in (out/'REPORT.md').read_text()
    assert not [p for p in out.iterdir() if p.name.startswith('.')]
    # back to the inputs of the kept outputs: up to date, and the stale failure marker goes away
    (project/'settings.ini').write_text(SETTINGS)
    assert run(project)[0]['01_flaky'] == 'skipped' and not (out/'01_flaky.failed.ipynb').exists()

def test_only_and_unknown_names(project):
    assert run(project, only=['01_flaky'])[0] == {'01_flaky': 'ok'}
    with pytest.raises(UnknownNameError, match=r"unknown experiment\(s\) \['02_nope'\]. Experiments: 00_ok, 01_flaky"):
        run(project, only=['02_nope'])
    with pytest.raises(UnknownNameError, match="unknown profile 'nope'"):
        reproduce('nope')

def test_notebook_without_parameters_cell_is_refused(project):
    write_nb(project/'nbs'/'experiments'/'02_bad.ipynb', OK_BODY, params="x = 1")
    status, log = run(project, only=['00_ok'])
    assert status == {'00_ok': 'ok'}
    with pytest.raises(FusionError, match="'02_bad': its parameters cell must declare `profile` and `output_dir`"):
        run(project, only=['02_bad'])

def test_cli_exit_codes(project):
    env = {**os.environ, 'FUSION_NB_ROOT': str(project)}
    ok = subprocess.run([sys.executable, '-c', 'from fusion_nb.reproduce import main; raise SystemExit(main())', 'reproduce', '--profile', 'demo'],
                        env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    (project/'settings.ini').write_text(SETTINGS.replace('should_fail = no', 'should_fail = yes'))
    bad = subprocess.run([sys.executable, '-c', 'import sys; from fusion_nb.reproduce import main; sys.argv[0]="fusion-nb"; raise SystemExit(main(sys.argv[1:]))',
                          'reproduce', '--profile', 'demo'], env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and '1 experiment(s) failed: 01_flaky' in bad.stderr
    unknown = subprocess.run([sys.executable, '-c', 'import sys; from fusion_nb.reproduce import main; raise SystemExit(main(sys.argv[1:]))',
                              'reproduce', '--profile', 'nope'], env=env, capture_output=True, text=True)
    assert unknown.returncode == 2 and "unknown profile 'nope'" in unknown.stderr

def test_paper_profile_offline_fails_at_once(monkeypatch):
    monkeypatch.delenv('FUSION_NB_ROOT', raising=False)
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    t0 = time.time()
    with pytest.raises(FusionError, match="profile 'clip-vit-b32' needs the Hugging Face Hub"):
        reproduce('clip-vit-b32', log=lambda s: None)
    assert time.time() - t0 < 5
