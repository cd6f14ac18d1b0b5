"The reproduce runner on a scratch project: skip-if-unchanged, failure isolation, atomic writes, REPORT.md, CLI."
import json, os, subprocess, sys, time
from pathlib import Path

import nbformat, pandas as pd, pytest

import fusion_nb
import fusion_nb.reproduce.runner, fusion_nb.reproduce.fingerprints
from conftest import scratch_sources
from fusion_nb.core import UnknownNameError, FusionError
from fusion_nb.reproduce.runner import reproduce

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

def write_nb(path, body, params="profile = 'demo'\noutput_dir = None\nbatch_size = 1\nshould_fail = 'no'", title=None):
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell(params); p.metadata['tags'] = ['parameters']
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {title or path.stem} title\n\n> summary"), p, nbformat.v4.new_code_cell(body)]
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, str(path))

OK_BODY = """
from pathlib import Path
Path(output_dir, 'results.csv').write_text(f'batch_size\\n{batch_size}\\n')
Path(output_dir, 'table.md').write_text(f'| batch_size |\\n|---|\\n| {batch_size} |\\n')
Path(output_dir, 'figure.png').write_bytes(b'not really a png')
print('wrote to', output_dir)
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
    return scratch_sources(tmp_path)

def run(project, **kw):
    lines = []
    status = reproduce('demo', log=lines.append, progress=False, **kw)
    return status, '\n'.join(lines)

def leftovers(out):
    "Temporary files or folders (dot-names) left beside the outputs."
    return [p for p in out.rglob('.*')]

def test_runs_injects_profile_values_and_writes_report(project):
    status, log = run(project)
    assert status == {'00_ok': 'ok', '01_flaky': 'ok'} and '2 ran, 0 up to date, 0 failed' in log
    out = project/'outputs'/'demo'
    assert (out/'00_ok'/'results.csv').read_text() == 'batch_size\n8\n'   # the profile's batch_size was injected
    inputs = json.loads((out/'00_ok'/'inputs.json').read_text())
    assert inputs['parameters'] == {'profile': 'demo', 'batch_size': 8, 'should_fail': 'no'}
    assert inputs['version'] == fusion_nb.__version__ and inputs['profile']['experts']['a'] == str(project/'models'/'none_a')
    assert isinstance(inputs['torch_threads'], int) and inputs['torch_threads'] >= 1   # results depend on it in the last bits
    executed = (out/'00_ok'/'run.ipynb').read_text()
    assert f'output_dir = \\"{out/"00_ok"}\\"' in executed and '.tmp' not in executed   # names its final folder
    report = (out/'REPORT.md').read_text()
    assert report.startswith("# fusion_nb report — profile `demo`") and 'a scratch profile' in report
    assert f"fusion_nb {fusion_nb.__version__}" in report
    assert '## 00_ok — 00_ok title' in report and '| 8 |' in report and '![figure](00_ok/figure.png)' in report
    assert '[run.ipynb](00_ok/run.ipynb)' in report and '## 01_flaky — 01_flaky title' in report
    assert 's) on full test splits' in report
    assert report.index('## 00_ok') < report.index('## 01_flaky')
    assert not leftovers(out)

def test_skip_if_unchanged_and_rerun_on_change(project, monkeypatch):
    run(project)
    status, log = run(project)
    assert status == {'00_ok': 'skipped', '01_flaky': 'skipped'} and '[00_ok] up to date' in log
    assert run(project, force=True)[0] == {'00_ok': 'ok', '01_flaky': 'ok'}
    write_nb(project/'nbs'/'experiments'/'00_ok.ipynb', OK_BODY + "\nx = 1\n")   # the notebook changed
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'skipped'}
    (project/'settings.ini').write_text(SETTINGS.replace('batch_size = 8', 'batch_size = 16'))  # an injected parameter
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'ok'}
    assert (project/'outputs'/'demo'/'00_ok'/'results.csv').read_text() == 'batch_size\n16\n'
    scratch_sources(project, model='models/other')
    (project/'settings.ini').write_text(SETTINGS.replace('batch_size = 8', 'batch_size = 16').replace('none_{task}', 'other_{task}'))
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'ok'}      # a profile value no notebook declares
    (project/'models'/'none'/'config.json').write_text('{}')
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'ok'}      # local data changed (a file appeared)
    assert run(project)[0] == {'00_ok': 'skipped', '01_flaky': 'skipped'}
    monkeypatch.setattr(fusion_nb.reproduce.fingerprints, 'code_fingerprint', lambda nb: {'fusion_nb/x.py': 'other code'})
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'ok'}      # the sources they run changed
    (project/'outputs'/'demo'/'01_flaky'/'table.md').unlink()
    assert run(project)[0] == {'00_ok': 'skipped', '01_flaky': 'ok'}  # outputs gone: rerun

def test_failure_is_isolated_and_keeps_previous_outputs(project):
    run(project)
    out = project/'outputs'/'demo'
    prev = (out/'01_flaky'/'table.md').read_text()
    (project/'settings.ini').write_text(SETTINGS.replace('should_fail = no', 'should_fail = yes').replace('batch_size = 8', 'batch_size = 9'))
    status, log = run(project)
    assert status == {'00_ok': 'ok', '01_flaky': 'failed'} and '1 ran, 0 up to date, 1 failed' in log
    assert '[01_flaky] FAILED' in log and 'boom in experiment' in log and str(out/'01_flaky.failed.ipynb') in log
    assert f'previous outputs kept in {out/"01_flaky"}' in log
    assert (out/'01_flaky'/'table.md').read_text() == prev                    # previous outputs kept
    assert (out/'01_flaky'/'results.csv').read_text() == 'complete\n'         # the half-written file never landed
    failed_nb = nbformat.read(str(out/'01_flaky.failed.ipynb'), as_version=4)
    assert any('boom in experiment' in str(o) for c in failed_nb.cells if c.cell_type == 'code' for o in c.get('outputs', []))
    assert (out/'00_ok'/'results.csv').read_text() == 'batch_size\n9\n'       # the other experiment still ran
    report = (out/'REPORT.md').read_text()
    assert '**Failed in the last run:** 01_flaky' in report and '[01_flaky.failed.ipynb](01_flaky.failed.ipynb)' in report
    assert 'outputs below are from the previous successful run' in report and '| fine |' in report
    assert not leftovers(out)
    # back to the inputs of the kept outputs: a recorded failure still reruns it; success clears the record
    (project/'settings.ini').write_text(SETTINGS)
    status, log = run(project)
    assert status['01_flaky'] == 'ok' and '(it failed in an earlier run)' in log
    assert not (out/'01_flaky.failed.ipynb').exists() and not (out/'01_flaky.failed.json').exists()
    assert 'Failed' not in (out/'REPORT.md').read_text()

def test_first_run_failure_leaves_no_output_folder(project):
    (project/'settings.ini').write_text(SETTINGS.replace('should_fail = no', 'should_fail = yes'))
    status, log = run(project)
    out = project/'outputs'/'demo'
    assert status == {'00_ok': 'ok', '01_flaky': 'failed'} and not (out/'01_flaky').exists()
    assert (out/'01_flaky.failed.ipynb').exists() and not leftovers(out)
    assert (out/'01_flaky.partial'/'results.csv').read_text() == 'partial\n'   # what it wrote before failing, kept as partial
    assert '01_flaky.failed.ipynb); no outputs yet' in (out/'REPORT.md').read_text()
    assert json.loads((out/'01_flaky.failed.json').read_text())['error'] == 'RuntimeError: boom in experiment'

def test_only_and_unknown_names(project):
    assert run(project, only=['01_flaky'])[0] == {'01_flaky': 'ok'}
    assert run(project, only=['00'], force=True)[0] == {'00_ok': 'ok'}          # a unique prefix
    assert '## 01_flaky' in (project/'outputs'/'demo'/'REPORT.md').read_text()  # the report still shows every experiment
    with pytest.raises(UnknownNameError, match=r"unknown experiment\(s\) '02_nope'. Experiments: 00_ok, 01_flaky"):
        run(project, only=['00_ok', '02_nope'])
    with pytest.raises(UnknownNameError, match="'0' is ambiguous: it could be 00_ok, 01_flaky"):
        run(project, only=['0'])
    with pytest.raises(UnknownNameError, match="unknown profile 'nope'. Profiles in .*: demo"):
        reproduce('nope')

def test_notebook_without_parameters_cell_is_refused_before_anything_runs(project):
    write_nb(project/'nbs'/'experiments'/'02_bad.ipynb', OK_BODY, params="x = 1")
    with pytest.raises(FusionError, match=r"'02_bad': its parameters cell .* must declare `profile` and `output_dir`; it declares x"):
        run(project)
    assert not (project/'outputs').exists()
    assert run(project, only=['00_ok'])[0] == {'00_ok': 'ok'}

def cli(project, *args, env=None):
    return subprocess.run([sys.executable, '-c', 'import sys; from fusion_nb.reproduce.cli import main; raise SystemExit(main(sys.argv[1:]))', *args],
                          env={**os.environ, 'FUSION_NB_ROOT': str(project), **(env or {})}, capture_output=True, text=True)

def test_cli(project):
    ok = cli(project, 'reproduce', '--profile', 'demo', '--no-progress')
    assert ok.returncode == 0, ok.stderr
    assert '[00_ok] done' in ok.stdout and 'report: ' in ok.stdout
    (project/'settings.ini').write_text(SETTINGS.replace('should_fail = no', 'should_fail = yes'))
    bad = cli(project, 'reproduce', '--profile', 'demo', '--no-progress')
    out = project/'outputs'/'demo'
    assert bad.returncode == 1
    assert f"1 experiment(s) failed: 01_flaky. See their executed notebooks ({out/'01_flaky.failed.ipynb'}) and {out/'REPORT.md'}" in bad.stderr
    unknown = cli(project, 'reproduce', '--profile', 'nope')
    assert unknown.returncode == 2 and "fusion-nb: error: unknown profile 'nope'" in unknown.stderr
    only = cli(project, 'reproduce', '--profile', 'demo', '--only', 'zz')
    assert only.returncode == 2 and "unknown experiment(s) 'zz'. Experiments: 00_ok, 01_flaky" in only.stderr
    listing = cli(project, 'list')
    assert listing.returncode == 0 and 'demo' in listing.stdout and 'a scratch profile' in listing.stdout
    assert '00_ok title' in listing.stdout and listing.stdout.index('00_ok') < listing.stdout.index('01_flaky')

def test_paper_profile_offline_fails_at_once(tmp_path):
    "The real clip-vit-b32 profile, no hub and empty caches: exit 2 before any experiment starts, saying what to do."
    before = sorted((Path(__file__).parents[2]/'outputs'/'clip-vit-b32').rglob('*'))   # a checkout may hold earlier runs
    r = subprocess.run([sys.executable, '-c', 'import sys; from fusion_nb.reproduce.cli import main; raise SystemExit(main(sys.argv[1:]))',
                        'reproduce', '--profile', 'clip-vit-b32'],
                       env={**{k: v for k, v in os.environ.items() if k != 'FUSION_NB_ROOT'}, 'HF_HUB_OFFLINE': '1', 'HF_HOME': str(tmp_path)},
                       capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert r.returncode == 2, r.stderr
    import torch
    assert "profile 'clip-vit-b32' needs the Hugging Face Hub" in r.stderr and 'openai/clip-vit-base-patch32' in r.stderr
    if not torch.cuda.is_available():   # the device first, and the missing sources in the same message (issue 54: one round trip)
        assert "profile 'clip-vit-b32': device 'cuda' requested but CUDA is not available" in r.stderr
        assert r.stderr.index("device 'cuda'") < r.stderr.index('needs the Hugging Face Hub')
    # at once: no experiment started and nothing written (prepare() itself is checked in test_profiles)
    assert 'running' not in r.stdout and sorted((Path(__file__).parents[2]/'outputs'/'clip-vit-b32').rglob('*')) == before

def test_individual_experiment_through_the_runner(micro_project, tmp_path):
    "The real 00_individual notebook, run by the runner on the micro test project: table, figure, report, skip."
    lines = []
    status = reproduce('micro-test', only=['00_individual'], output_root=tmp_path, progress=False, log=lines.append,
                       settings=micro_project/'settings.ini')
    assert status == {'00_individual': 'ok'}, '\n'.join(lines)
    out = tmp_path/'micro-test'/'00_individual'
    rec = pd.read_csv(out/'results.csv')
    assert set(rec.columns) >= {'model', 'task', 'metric', 'value'}
    table = pd.read_csv(out/'table.csv', index_col=0)
    assert list(table.index) == ['Pre-trained', 'Fine-tuned (STL)'] and list(table.columns) == ['shapes', 'colors', 'Avg.']
    acc = rec[rec['metric'] == 'accuracy'].set_index(['model', 'task'])['value'] * 100
    assert table.loc['Pre-trained', 'colors'] == pytest.approx(acc[('pretrained', 'colors')])
    assert table.loc['Fine-tuned (STL)', 'shapes'] == pytest.approx(acc[('finetuned:shapes', 'shapes')])
    assert table.loc['Fine-tuned (STL)', 'Avg.'] == pytest.approx((acc[('finetuned:shapes', 'shapes')] + acc[('finetuned:colors', 'colors')]) / 2)
    assert json.loads((out/'inputs.json').read_text())['parameters']['batch_size'] == 5   # the profile's value, injected
    assert (out/'individual_accuracy.png').read_bytes()[:4] == b'\x89PNG'
    report = (tmp_path/'micro-test'/'REPORT.md').read_text()
    assert '## 00_individual — Individual models' in report and '| Fine-tuned (STL) |' in report
    assert '![individual_accuracy](00_individual/individual_accuracy.png)' in report
    assert reproduce('micro-test', only=['00_individual'], output_root=tmp_path, progress=False, log=lines.append,
                     settings=micro_project/'settings.ini') == {'00_individual': 'skipped'}

# --- results that cannot go stale or wrong silently (issue 11) ----------------------------------------------------

FLAKY_BODY = """
import os
from pathlib import Path
if Path(os.environ['FUSION_NB_ROOT'], 'fail_now').exists(): raise RuntimeError('transient failure')
Path(output_dir, 'results.csv').write_text('fine\\n')
"""

def test_a_failure_stays_a_failure_until_the_experiment_succeeds(project):
    "A failure whose inputs equal those of the kept outputs (a transient error, a --force run) is not forgotten."
    write_nb(project/'nbs'/'experiments'/'02_transient.ipynb', FLAKY_BODY)
    assert run(project, only=['02'])[0] == {'02_transient': 'ok'}
    (project/'fail_now').write_text('')
    assert run(project, only=['02'], force=True)[0] == {'02_transient': 'failed'}
    out = project/'outputs'/'demo'
    for _ in range(2):   # every plain run tries again, reports it and exits 1, until it succeeds
        status, log = run(project)
        assert status['02_transient'] == 'failed' and '[02_transient] running' in log and '(it failed in an earlier run)' in log
        assert '**Failed in the last run:** 02_transient' in (out/'REPORT.md').read_text()
        assert cli(project, 'reproduce', '--profile', 'demo', '--no-progress').returncode == 1
    status, log = run(project, only=['00'])   # another selection: the old failure is still reported
    assert 'still failing from an earlier run: 02_transient' in log and '02_transient' in (out/'REPORT.md').read_text().split('##')[0]
    (project/'fail_now').unlink()
    assert run(project)[0]['02_transient'] == 'ok'
    assert not (out/'02_transient.failed.json').exists() and 'Failed' not in (out/'REPORT.md').read_text()
    assert run(project)[0]['02_transient'] == 'skipped'

def test_outputs_written_outside_the_runner_are_not_trusted(project):
    "A notebook run by hand into the runner's folder (or an edited table) makes the next run redo the experiment."
    run(project)
    res = project/'outputs'/'demo'/'00_ok'/'results.csv'
    res.write_text('batch_size\n5\n')   # e.g. papermill ... -p output_dir outputs/demo/00_ok -p batch_size 5
    status, log = run(project)
    assert status == {'00_ok': 'ok', '01_flaky': 'skipped'} and 'outputs changed since the runner wrote them (results.csv)' in log
    assert res.read_text() == 'batch_size\n8\n'
    (project/'outputs'/'demo'/'00_ok'/'extra.md').write_text('| 5 samples |\n')   # a file the runner did not write: refused, kept
    with pytest.raises(FusionError, match=r"holds 1 file\(s\) the runner did not write \(extra.md\)"): run(project)
    assert (project/'outputs'/'demo'/'00_ok'/'extra.md').read_text() == '| 5 samples |\n'

def test_a_file_the_runner_did_not_write_is_never_deleted(project):
    "Issue 26, item 2: a user's file in an experiment's folder stops a plain or forced run before anything runs; nothing is deleted."
    run(project)
    out = project/'outputs'/'demo'/'00_ok'
    before = (project/'outputs'/'demo'/'01_flaky'/'inputs.json').read_text()
    (out/'my_notes.md').write_text('mine'); (out/'sub').mkdir(); (out/'sub'/'x.txt').write_text('x'); (out/'empty').mkdir()
    for force in (False, True):
        with pytest.raises(FusionError, match=r"\[00_ok\] .*00_ok holds 3 file\(s\) the runner did not write \(empty, my_notes.md, sub/x.txt\)"):
            run(project, force=force)
        assert (out/'my_notes.md').read_text() == 'mine' and (out/'sub'/'x.txt').read_text() == 'x' and (out/'empty').is_dir()
    assert (project/'outputs'/'demo'/'01_flaky'/'inputs.json').read_text() == before   # nothing ran
    r = cli(project, 'reproduce', '--profile', 'demo', '--no-progress', '--force', '--only', '00')
    assert r.returncode == 2 and 'my_notes.md' in r.stderr and 'Traceback' not in r.stderr and (out/'my_notes.md').exists()
    for f in ('my_notes.md', 'sub/x.txt', 'sub', 'empty'): (out/f).unlink() if (out/f).is_file() else (out/f).rmdir()
    (out/'.ipynb_checkpoints').mkdir(); (out/'.ipynb_checkpoints'/'run-checkpoint.ipynb').write_text('{}')   # Jupyter's, of run.ipynb
    assert run(project)[0] == {'00_ok': 'skipped', '01_flaky': 'skipped'}
    assert run(project, force=True)[0] == {'00_ok': 'ok', '01_flaky': 'ok'}

def test_local_data_counts_by_content(project):
    "Same size, mtime put back; two experts swapped; a deleted file: each changes the inputs."
    for t in 'ab':
        d = project/'models'/f'none_{t}'; d.mkdir(parents=True, exist_ok=True)
        (d/'model.safetensors').write_bytes(t.encode() * 64)
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'ok'}
    w = project/'models'/'none_a'/'model.safetensors'; st = w.stat()
    w.write_bytes(b'n' * 64); os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))   # a NaN-like edit, same size and mtime
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'ok'}
    a, b = project/'models'/'none_a', project/'models'/'none_b'
    a.rename(project/'models'/'tmp'); b.rename(a); (project/'models'/'tmp').rename(b)   # two experts swapped (mtimes kept)
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'ok'}
    assert run(project)[0] == {'00_ok': 'skipped', '01_flaky': 'skipped'}
    (b/'model.safetensors').unlink()
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'ok'}

def test_a_second_backbone_counts_by_content(project):
    """Paper 001's second backbone (profile keys second_pretrained / second_expert_template) is data like the first, for
    the experiment that reads it (10, Table s6) and no other."""
    ini = project/'settings.ini'
    ini.write_text(ini.read_text().replace('should_fail = no', 'should_fail = no\nsecond_pretrained = ./models/b\nsecond_expert_template = ./models/b_{task}'))
    write_nb(project/'nbs'/'experiments'/'10_backbones.ipynb', OK_BODY)
    for d in ['b', 'b_a', 'b_b']:
        (project/'models'/d).mkdir(parents=True); (project/'models'/d/'model.safetensors').write_bytes(d.encode() * 8)
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'ok', '10_backbones': 'ok'}
    assert run(project)[0] == {'00_ok': 'skipped', '01_flaky': 'skipped', '10_backbones': 'skipped'}
    (project/'models'/'b_b'/'model.safetensors').write_bytes(b'x' * 24)   # one second-backbone expert changed
    assert run(project)[0] == {'00_ok': 'skipped', '01_flaky': 'skipped', '10_backbones': 'ok'}

def test_outputs_follow_the_umask_and_killed_runs_leave_no_temporaries(project):
    out = project/'outputs'/'demo'; out.mkdir(parents=True)
    dead = subprocess.Popen(['true']); dead.wait()
    (out/f'.00_ok.{dead.pid}.x1y2z3ab.tmp').mkdir()             # what a SIGKILLed run leaves behind
    (out/f'.REPORT.md.{dead.pid}.k9j8h7g6.tmp').write_text('half')
    old = os.umask(0o022)
    try: run(project)
    finally: os.umask(old)
    assert not leftovers(out)
    assert (out/'00_ok').stat().st_mode & 0o777 == 0o755 and (out/'REPORT.md').stat().st_mode & 0o777 == 0o644
    assert (out/'00_ok'/'inputs.json').stat().st_mode & 0o777 == 0o644

def test_two_runs_finishing_the_same_experiment_do_not_race(project):
    "Runs finishing the same folder at once take turns under a lock; none fails, no temporaries remain."
    target, ready = project/'outputs'/'demo'/'00_ok', project/'ready'
    ready.mkdir()
    script = ("import sys, time; from pathlib import Path; from fusion_nb.core import atomic_dir\n"
              "ready = Path(sys.argv[3]); (ready/sys.argv[2]).touch()\n"
              "while len(list(ready.iterdir())) < 4: time.sleep(0.01)   # all imported: start together\n"
              "for i in range(150):\n"
              "    with atomic_dir(Path(sys.argv[1])) as t: (t/'who').write_text(sys.argv[2])\n")
    procs = [subprocess.Popen([sys.executable, '-c', script, str(target), str(i), str(ready)], stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    errs = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errs   # before the lock: most of 4 × 150 swaps failed
    assert (target/'who').read_text() in '0123' and not leftovers(target.parent)

def test_unwritable_output_root_and_only_options(project):
    (project/'afile').write_text('')
    with pytest.raises(FusionError, match=f"cannot write the outputs of profile 'demo' to {project/'afile'/'demo'}"):
        run(project, output_root=project/'afile')
    # the command line's own messages for both (exit 2, no traceback): tests/test_bad_inputs.py::test_cli_bad_input
    r = cli(project, 'reproduce', '--profile', 'demo', '--no-progress', '--only', '00', '--only', '01')
    assert r.returncode == 0 and '[00_ok] running' in r.stdout and '[01_flaky] running' in r.stdout   # both, not the last
    with pytest.raises(UnknownNameError, match=r"no experiment named in \[''\]. Experiments: 00_ok, 01_flaky"): run(project, only=[''])

def test_hand_run_of_an_experiment_writes_to_scratch(micro_project, tmp_path):
    "The papermill example of nbs/guide/03_running.ipynb without output_dir: outputs/scratch/<profile>/<experiment>, never the runner's folder."
    import papermill
    nb = micro_project/'nbs'/'experiments'/'00_individual.ipynb'
    old = os.environ.get('FUSION_NB_ROOT'); os.environ['FUSION_NB_ROOT'] = str(micro_project)
    try:
        papermill.execute_notebook(str(nb), str(tmp_path/'run.ipynb'), parameters={'profile': 'micro-test', 'max_test_samples': 4},
                                   kernel_name='python3', cwd=str(nb.parent), progress_bar=False)
    finally:
        if old is None: os.environ.pop('FUSION_NB_ROOT')
        else: os.environ['FUSION_NB_ROOT'] = old
    scratch = micro_project/'outputs'/'scratch'/'micro-test'/'00_individual'
    assert (scratch/'results.csv').exists() and not (micro_project/'outputs'/'micro-test').exists()
    assert not (scratch/'inputs.json').exists()   # nothing the runner would take for its own record

def test_report_says_how_many_test_samples_each_run_used(project):
    "The sample count comes from each run's recorded inputs, so a subset run never reads as a full-split one."
    (project/'settings.ini').write_text(SETTINGS + 'max_test_samples = 5\n')
    run(project, only=['00'])
    (project/'settings.ini').write_text(SETTINGS)
    run(project, only=['01'])
    report = (project/'outputs'/'demo'/'REPORT.md').read_text()
    sec = lambda name: report.split(f'## {name}')[1].split('\n## ')[0]
    assert 'on at most 5 test samples per task' in sec('00_ok') and 'on full test splits' in sec('01_flaky')

def test_a_profile_runs_only_the_experiments_its_key_names(project):
    (project/'settings.ini').write_text(SETTINGS + "[demo00]\npretrained = ./models/none\nexpert_template = ./models/none_{task}\n"
                                        "dataset_template = ./datasets/{task}\nexperiments = 00\n[typo]\npretrained = ./m\nexperiments = 02\n")
    lines = []
    assert reproduce('demo00', log=lines.append, progress=False) == {'00_ok': 'ok'}   # 01_flaky is not one of its experiments
    with pytest.raises(FusionError, match=r"profile 'demo00' does not run 01_flaky \(its experiments: 00_ok"):
        reproduce('demo00', only=['01'], log=lines.append, progress=False)
    with pytest.raises(FusionError, match=r"profile 'typo', key experiments: unknown experiment\(s\) '02'"):
        reproduce('typo', log=lines.append, progress=False)
    assert set(run(project)[0]) == {'00_ok', '01_flaky'}                               # no key: every experiment

def test_runner_keys_are_never_notebook_parameters(project):
    "A profile's `experiments` (what the runner runs) is not injected into a notebook parameter of that name."
    from fusion_nb.reproduce.fingerprints import experiment_parameters
    from fusion_nb.reproduce.profiles import load_profile
    ini = project/'settings.ini'
    ini.write_text(ini.read_text().replace('should_fail = no', 'should_fail = no\nexperiments = 00_ok'))
    nb = project/'nbs'/'experiments'/'02_splits.ipynb'
    write_nb(nb, OK_BODY, params="profile = 'demo'\noutput_dir = None\nbatch_size = 1\nexperiments = 'exp1 exp2'")
    p = load_profile('demo')
    assert p.experiments == ['00_ok']
    assert experiment_parameters(nb, p) == {'profile': 'demo', 'batch_size': 8}

def test_every_profile_injects_values_of_the_declared_types():
    "For each real profile and each experiment it runs, an injected value has the type of the notebook's default (a str stays a str)."
    import ast
    from fusion_nb.reproduce.fingerprints import experiment_parameters, notebook_parameters
    from fusion_nb.reproduce.profiles import list_profiles, load_profile
    repo = Path(__file__).parents[2]
    notebooks = sorted((repo/'nbs'/'experiments').glob('*.ipynb'))
    checked = 0
    for name in list_profiles(repo/'settings.ini'):
        p = load_profile(name, settings=repo/'settings.ini')
        for nb in notebooks:
            if p.experiments and not any(nb.stem.startswith(e) for e in p.experiments): continue
            declared = notebook_parameters(nb)
            for k, v in experiment_parameters(nb, p).items():
                default = ast.literal_eval(declared[k]['default'])
                if default is None or k == 'profile': continue
                ok = isinstance(v, str) if isinstance(default, str) else not isinstance(v, str) or isinstance(default, (int, float))
                assert ok, f"profile {name!r} injects {k} = {v!r} into {nb.name}, whose default is {default!r}"
                checked += 1
    assert checked   # some values meet a non-None default (e.g. device, batch sizes)

def test_papermill_reads_every_parameter_of_every_experiment():
    "A parameter papermill cannot parse (e.g. '=' in its comment) is never injected: the runner would ignore the profile's value."
    import ast
    from fusion_nb.reproduce.fingerprints import notebook_parameters
    for nb in sorted((Path(__file__).parents[2]/'nbs'/'experiments').glob('*.ipynb')):
        cell = next(c for c in json.loads(nb.read_text())['cells'] if 'parameters' in c['metadata'].get('tags', []))
        assigned = [t.id for n in ast.parse(''.join(cell['source'])).body if isinstance(n, ast.Assign) for t in n.targets]
        assert list(notebook_parameters(nb)) == assigned, nb.name

def test_data_an_experiment_builds_is_recorded_as_the_run_left_it(project, monkeypatch):
    "A zoo built on first use is the experiment's input as built: the next run finds it up to date (not stale once more)."
    import fusion_nb.reproduce.fingerprints as fp, fusion_nb.reproduce.runner as runner
    zoo = project/'zoo.txt'
    fake = lambda profile, experiment=None: {'zoo': zoo.read_text() if zoo.exists() and experiment == '02_builds' else 'not built yet'}
    monkeypatch.setattr(fp, 'data_fingerprint', fake); monkeypatch.setattr(runner, 'data_fingerprint', fake)
    write_nb(project/'nbs'/'experiments'/'02_builds.ipynb', OK_BODY + f"\nPath({str(zoo)!r}).write_text('weights')\n")
    assert run(project)[0] == {'00_ok': 'ok', '01_flaky': 'ok', '02_builds': 'ok'}
    assert run(project)[0] == {'00_ok': 'skipped', '01_flaky': 'skipped', '02_builds': 'skipped'}
    zoo.write_text('other weights')   # the zoo changed afterwards: its reader reruns, no one else
    assert run(project)[0] == {'00_ok': 'skipped', '01_flaky': 'skipped', '02_builds': 'ok'}

WAIT_FOR_OTHER = """
import os, time
from pathlib import Path
meet = Path(os.environ['MEET_DIR']); (meet/'{me}').touch()
t0 = time.time()
while not (meet/'{other}').exists():   # one after the other, the first would wait for the second in vain
    if time.time() - t0 > 120: raise RuntimeError('{other} never started while {me} ran')
    time.sleep(0.1)
Path(output_dir, 'threads.txt').write_text(os.environ.get('OMP_NUM_THREADS', 'unset'))
Path(output_dir, 'cwd.txt').write_text(os.getcwd())
"""

def test_experiments_run_side_by_side_one_thread_each(project, tmp_path, monkeypatch):
    """With two slots, two experiments run at the same time (each waits until the other started), one torch thread each, each
    kernel in the notebooks' folder, and this process's working folder untouched (papermill's `cwd=` would move it: two at once
    left it in a run's folder, where the next `load_profile` found that project's settings.ini)."""
    exp = project/'nbs'/'experiments'
    for f in exp.iterdir(): f.unlink()
    write_nb(exp/'00_a.ipynb', WAIT_FOR_OTHER.format(me='a', other='b')); write_nb(exp/'01_b.ipynb', WAIT_FOR_OTHER.format(me='b', other='a'))
    monkeypatch.setenv('MEET_DIR', str(tmp_path)); monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    here = os.getcwd()
    status, log = run(project, jobs=2)
    assert status == {'00_a': 'ok', '01_b': 'ok'}, log
    assert os.getcwd() == here
    assert 'running up to 2 experiments at once, 1 torch thread(s) each' in log
    out = project/'outputs'/'demo'
    for n in status:
        assert (out/n/'threads.txt').read_text() == '1' and json.loads((out/n/'inputs.json').read_text())['torch_threads'] == 1
        assert Path((out/n/'cwd.txt').read_text()).resolve() == exp.resolve()
    assert run(project, jobs=2)[0] == {'00_a': 'skipped', '01_b': 'skipped'}   # up to date, found before any slot is taken
    bad = cli(project, 'reproduce', '--profile', 'demo', '--jobs', '0')
    assert bad.returncode == 2 and 'jobs = 0: expected a whole number ≥ 1' in bad.stderr

def test_one_at_a_time_keeps_the_profiles_threads(project, monkeypatch):
    """`--jobs 1` runs each kernel with the profile's `cpus_per_experiment` torch threads (1 here), not torch's default (the machine's
    cores): a thread count changes some experiments' numbers (experiment 10's semi-supervised NeuLig), so the machine must not pick it."""
    exp = project/'nbs'/'experiments'
    for f in exp.iterdir(): f.unlink()
    write_nb(exp/'00_a.ipynb', "import os\nfrom pathlib import Path\nPath(output_dir, 'threads.txt').write_text(os.environ.get('OMP_NUM_THREADS', 'unset'))\n")
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    status, log = run(project, jobs=1)
    assert status == {'00_a': 'ok'}, log
    out = project/'outputs'/'demo'/'00_a'
    assert (out/'threads.txt').read_text() == '1' and json.loads((out/'inputs.json').read_text())['torch_threads'] == 1

def test_kernels_compute_under_compute_env(project, monkeypatch):
    """An experiment's kernel starts with `fusion_nb.core.compute_env`'s settings (glibc's heap kept between batches, OpenMP threads
    that sleep), and a user's own value of one of them wins."""
    from fusion_nb.core import COMPUTE_ENV
    exp = project/'nbs'/'experiments'
    for f in exp.iterdir(): f.unlink()
    names = sorted(COMPUTE_ENV)
    write_nb(exp/'00_a.ipynb', "import json, os\nfrom pathlib import Path\n"
             f"Path(output_dir, 'env.json').write_text(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))\n")
    for k in names: monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv('OMP_WAIT_POLICY', 'ACTIVE')
    status, log = run(project, jobs=1)
    assert status == {'00_a': 'ok'}, log
    seen = json.loads((project/'outputs'/'demo'/'00_a'/'env.json').read_text())
    assert seen == {**COMPUTE_ENV, 'OMP_WAIT_POLICY': 'ACTIVE'}

def test_an_experiment_that_declares_portable_kernels_runs_on_them(project, monkeypatch):
    """An experiment whose parameters declare `cpu_kernels = "portable"` (experiment 10: it trains at run time) computes on
    `PORTABLE_KERNELS` whatever cap the environment sets, one that declares nothing on this CPU's own; inputs.json says which (issue 47)."""
    from fusion_nb.reproduce.runner import PORTABLE_KERNELS
    exp = project/'nbs'/'experiments'
    for f in exp.iterdir(): f.unlink()
    body = ("import json, os, torch\nfrom pathlib import Path\n"
            f"Path(output_dir, 'env.json').write_text(json.dumps({{k: os.environ.get(k) for k in {sorted(PORTABLE_KERNELS)!r}}}))\n"
            "Path(output_dir, 'capability.txt').write_text(torch.backends.cpu.get_cpu_capability())\n"
            "import numpy as np, fusion_nb.core\nx = torch.rand(100_000) * 1e3\n"   # torch.sqrt is the correctly rounded one?
            "Path(output_dir, 'sqrt.txt').write_text(str(torch.equal(torch.sqrt(x), torch.from_numpy(np.sqrt(x.numpy())))))\n")
    write_nb(exp/'00_portable.ipynb', body, params="profile = 'demo'\noutput_dir = None\ncpu_kernels = 'portable'   # trains at run time")
    write_nb(exp/'01_native.ipynb', body)
    for k in PORTABLE_KERNELS: monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv('ONEDNN_MAX_CPU_ISA', 'AVX')   # .ci/other_cpu.py's cap on an AVX2 CPU
    status, log = run(project, jobs=1)
    assert status == {'00_portable': 'ok', '01_native': 'ok'}, log
    out = project/'outputs'/'demo'
    assert json.loads((out/'00_portable'/'env.json').read_text()) == PORTABLE_KERNELS
    assert (out/'00_portable'/'capability.txt').read_text() == 'DEFAULT'
    assert json.loads((out/'01_native'/'env.json').read_text()) == {'ATEN_CPU_CAPABILITY': None, 'MKL_CBWR': None, 'ONEDNN_MAX_CPU_ISA': 'AVX',
                                                                    'FUSION_NB_PORTABLE_SQRT': None}
    # the correctly rounded sqrt (notebook 00) where portable; MKL's, one unit off on some inputs, where native
    assert (out/'00_portable'/'sqrt.txt').read_text() == 'True'
    import torch
    if torch.backends.mkl.is_available(): assert (out/'01_native'/'sqrt.txt').read_text() == 'False'
    assert [json.loads((out/n/'inputs.json').read_text())['cpu_kernels'] for n in status] == ['portable', 'native']

# --- issue 54: an interrupted or failed experiment keeps what it finished, as a partial output -----------------------

LONG_BODY = """
from pathlib import Path
Path(output_dir, 'table.md').write_text(f'| paper rows, batch {batch_size} |\\n|---|\\n| 1 |\\n')   # the paper's rows: done
if should_fail == 'yes': raise RuntimeError('boom in the beyond block')
if should_fail == 'interrupt': raise KeyboardInterrupt   # as a Ctrl-C in the kernel reads
Path(output_dir, 'table_beyond.md').write_text('| beyond |\\n|---|\\n| 2 |\\n')
"""

def test_an_unfinished_run_keeps_what_it_finished_as_partial(project):
    "A table written before a failure or a KeyboardInterrupt lands in <experiment>.partial/, listed in REPORT.md as partial;"
    "the complete folder is replaced only whole, and the skip logic never reads the partial one."
    write_nb(project/'nbs'/'experiments'/'02_long.ipynb', LONG_BODY)
    out = project/'outputs'/'demo'
    ini = lambda mode, batch=8: (project/'settings.ini').write_text(SETTINGS.replace('should_fail = no', f'should_fail = {mode}')
                                                                    .replace('batch_size = 8', f'batch_size = {batch}'))
    # interrupted on its first run: no complete folder, the finished table kept as partial, REPORT.md says so
    ini('interrupt')
    with pytest.raises(KeyboardInterrupt): run(project, only=['02'])
    part = out/'02_long.partial'
    assert not (out/'02_long').exists() and not leftovers(out)
    assert (part/'table.md').read_text().startswith('| paper rows, batch 8 |') and not (part/'table_beyond.md').exists()
    assert not (part/'inputs.json').exists()                       # nothing the skip logic could take for a complete run
    assert json.loads((part/'partial.json').read_text())['stopped'] == 'interrupted'
    assert '.tmp' not in (part/'run.ipynb').read_text() and str(part) in (part/'run.ipynb').read_text()
    assert not (out/'02_long.failed.json').exists()                # an interrupt is not a failure
    report = (out/'REPORT.md').read_text()
    assert '**Partial outputs** (runs that did not finish, not complete results): 02_long.' in report
    assert '## 02_long.partial' not in report and '| paper rows' not in report   # linked, never shown as a result
    assert 'holds what an interrupted run' in report and '[table.md](02_long.partial/table.md)' in report
    # the same inputs again: the partial folder does not count as done; the complete run removes it
    ini('no')
    status, log = run(project, only=['02'])
    assert status == {'02_long': 'ok'} and '(no outputs yet)' in log
    assert (out/'02_long'/'table_beyond.md').exists() and not part.exists()
    assert 'Partial' not in (out/'REPORT.md').read_text()
    # a failure late in a rerun with other inputs: the complete folder stays whole, the new finished table is partial
    ini('yes', batch=9)
    status, log = run(project, only=['02'])
    assert status == {'02_long': 'failed'} and f'failed: what it finished is kept in {part}' in log
    assert (out/'02_long'/'table.md').read_text().startswith('| paper rows, batch 8 |')   # the old complete run, untouched
    assert (out/'02_long'/'table_beyond.md').exists()
    assert (part/'table.md').read_text().startswith('| paper rows, batch 9 |') and not (part/'table_beyond.md').exists()
    rec = json.loads((part/'partial.json').read_text())
    assert rec['stopped'] == 'failed' and rec['error'] == 'RuntimeError: boom in the beyond block'
    report = (out/'REPORT.md').read_text()
    assert 'holds what a failed run' in report and '**Failed in the last run:** 02_long' in report
    assert report.count('| paper rows, batch 8 |') == 1 and 'batch 9' not in report   # only the complete run's table is shown
    # back to the complete run's inputs: still rerun (it failed since), never skipped on the partial folder's account
    ini('no')
    status, log = run(project, only=['02'])
    assert status == {'02_long': 'ok'} and '(it failed in an earlier run)' in log and not part.exists()
    assert run(project, only=['02'])[0] == {'02_long': 'skipped'}
    assert not leftovers(out)

def test_a_kernel_slow_to_start_is_waited_for(project, monkeypatch):
    "papermill's 60 s for a kernel to answer failed a CI run on 2 busy cores: the runner waits KERNEL_START_TIMEOUT instead."
    import papermill
    from fusion_nb.reproduce.runner import KERNEL_START_TIMEOUT
    seen = []
    def execute_notebook(*a, **kw): seen.append(kw.get('start_timeout')); raise RuntimeError("Kernel didn't respond")
    monkeypatch.setattr(papermill, 'execute_notebook', execute_notebook)
    status, log = run(project, only=['00'])
    assert status == {'00_ok': 'failed'} and "Kernel didn't respond" in log, log
    assert seen == [KERNEL_START_TIMEOUT] and KERNEL_START_TIMEOUT >= 300
