"An experiment is stale when the code it runs changed, not when any module of the package did (issue 30, item 4)."
import json, re, shutil
from pathlib import Path

import nbformat, pytest

import fusion_nb
import fusion_nb.reproduce.fingerprints as fp
from fusion_nb.reproduce.profiles import load_profile
from fusion_nb.reproduce.fingerprints import code_fingerprint
from fusion_nb.reproduce.profiles import experiments_dir, list_experiments
from fusion_nb.reproduce.runner import run_reason

PAPER_000 = ['00_individual', '01_multi_task_merging', '02_scaling_sweeps', '03_task_vector_cosine',
             '04_fusion_eight_tasks', '05_generalization', '06_robustness']

@pytest.fixture(scope='module')
def pkg(tmp_path_factory):
    "A copy of the package to edit."
    dst = tmp_path_factory.mktemp('pkg')/'fusion_nb'
    shutil.copytree(Path(fusion_nb.__file__).parent, dst, ignore=shutil.ignore_patterns('__pycache__'))
    return dst

def fingerprints(pkg): return {n: code_fingerprint(experiments_dir()/f'{n}.ipynb', pkg) for n in list_experiments()}

def edit(path): path.write_text(path.read_text() + '\n# edited\n')

def changed(before, after): return {n for n in before if before[n] != after[n]}

def test_edits_rerun_only_what_they_touch(pkg):
    assert set(PAPER_000) <= set(list_experiments())
    before = fingerprints(pkg)
    edit(pkg/'llava'/'model.py'); edit(pkg/'llava'/'zoo.py')
    after = fingerprints(pkg)
    assert not changed(before, after) & set(PAPER_000) and '40_uq_merge' in changed(before, after)
    edit(pkg/'methods'/'ties.py')
    again = fingerprints(pkg)
    assert {'01_multi_task_merging', '02_scaling_sweeps', '04_fusion_eight_tasks'} <= changed(after, again)
    edit(pkg/'evaluation.py')
    last = fingerprints(pkg)
    # independent: the notebooks whose own text imports the evaluation module
    evaluates = {n for n in list_experiments() if 'fusion_nb.evaluation' in (experiments_dir()/f'{n}.ipynb').read_text()}
    assert len(evaluates) >= 8 and evaluates <= changed(again, last)

def test_transitive_and_in_function_imports(tmp_path):
    p = tmp_path/'fusion_nb'; (p/'sub').mkdir(parents=True)
    for f, src in {'__init__.py': '', 'a.py': 'from .b import x\n', 'b.py': 'def f():\n    from .sub import c\nx = 1\n',
                   'sub/__init__.py': '', 'sub/c.py': 'import fusion_nb.d\n', 'd.py': '', 'e.py': '', 'tiny/build.py': '',
                   'tiny/__init__.py': '', 'f.py': 'def g():\n    from fusion_nb.tiny.build import z\n'}.items():
        (p/f).parent.mkdir(exist_ok=True); (p/f).write_text(src)
    nb = tmp_path/'x.ipynb'
    def deps(src):
        n = nbformat.v4.new_notebook(); n.cells = [nbformat.v4.new_code_cell(src)]; nbformat.write(n, str(nb))
        return sorted(code_fingerprint(nb, p))
    assert deps('%matplotlib inline\nfrom fusion_nb.a import x') == [
        'fusion_nb/__init__.py', 'fusion_nb/a.py', 'fusion_nb/b.py', 'fusion_nb/d.py', 'fusion_nb/sub/__init__.py', 'fusion_nb/sub/c.py']
    assert deps('import fusion_nb\nfusion_nb.e.y') == ['fusion_nb/__init__.py', 'fusion_nb/e.py']   # attribute chain
    assert deps('import pandas') == []
    assert deps('from fusion_nb.f import g') == ['fusion_nb/__init__.py', 'fusion_nb/f.py', 'fusion_nb/tiny/__init__.py']  # builder: by outputs
    assert 'fusion_nb/tiny/build.py' in deps('from fusion_nb.tiny.build import z')   # ... unless imported directly
    assert len(deps('import importlib\nimportlib.import_module(name)')) == 10         # computed name: everything

SETTINGS = "[DEFAULT]\ntasks = a\n[demo]\ndescription = scratch\npretrained = ./m\nexpert_template = ./m_{task}\ndataset_template = ./d/{task}\n"

def scratch_nb(path, body):
    n = nbformat.v4.new_notebook()
    c = nbformat.v4.new_code_cell("profile = 'demo'\noutput_dir = None"); c.metadata['tags'] = ['parameters']
    n.cells = [nbformat.v4.new_markdown_cell(f'# {path.stem}'), c, nbformat.v4.new_code_cell(body)]
    n.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(n, str(path))

def test_runner_reruns_what_changed_and_old_records_once(tmp_path, monkeypatch, pkg):
    (tmp_path/'settings.ini').write_text(SETTINGS)
    exp = tmp_path/'nbs'/'experiments'; exp.mkdir(parents=True)
    scratch_nb(exp/'00_merges.ipynb', 'from fusion_nb.methods.ties import ties_merging')
    scratch_nb(exp/'01_llava.ipynb', 'from fusion_nb.llava.model import load_llava')
    monkeypatch.setenv('FUSION_NB_ROOT', str(tmp_path)); monkeypatch.setattr(fp, '_package_dir', lambda: pkg)
    prof = load_profile('demo')
    def record(name, **change):   # what a successful run leaves: inputs.json, no other outputs
        out = tmp_path/'outputs'/'demo'/name; out.mkdir(parents=True, exist_ok=True)
        (out/'inputs.json').write_text(json.dumps({**run_reason(name, prof)[1], 'outputs': {}, **change}, default=str))
    for n in ('00_merges', '01_llava'): record(n)
    assert [run_reason(n, prof)[0] for n in ('00_merges', '01_llava')] == [None, None]
    edit(pkg/'methods'/'ties.py')
    assert run_reason('00_merges', prof)[0] == 'inputs changed (code: fusion_nb/methods/ties.py)'
    assert run_reason('01_llava', prof)[0] is None
    edit(pkg/'llava'/'model.py')
    assert run_reason('01_llava', prof)[0] == 'inputs changed (code: fusion_nb/llava/model.py)'
    # an inputs.json of the runner that hashed the whole package: stale once, not an error
    old = {k: v for k, v in run_reason('00_merges', prof)[1].items() if k != 'code'}
    (tmp_path/'outputs'/'demo'/'00_merges'/'inputs.json').write_text(json.dumps({**old, 'package': 'abc', 'hash': 'x', 'outputs': {}}))
    assert 'recorded before the runner fingerprinted the code' in run_reason('00_merges', prof)[0]
    record('00_merges')
    assert run_reason('00_merges', prof)[0] is None
