"""Papermill's injected parameters keep their types: a profile's number (settings.ini text) is injected as a number, so the
executed notebook (and the docs page showing it) reads `adamerging_steps = 200`, not `adamerging_steps = "200"`."""
import json

import nbformat, pytest

from conftest import scratch_sources
from fusion_nb.reproduce.runner import reproduce

SETTINGS = """
[DEFAULT]
tasks = a b
[demo]
description = a scratch profile
pretrained = ./models/none
expert_template = ./models/none_{task}
dataset_template = ./datasets/{task}
adamerging_steps = 200
adamerging_lr = 5e-3
splits = 0
rows = Task Arithmetic
"""
PARAMS = "profile = 'demo'\noutput_dir = None\nadamerging_steps = None\nadamerging_lr = None\nsplits = 'exp1 exp2'\nrows = None"
BODY = """
from pathlib import Path
Path(output_dir, 'types.json').write_text(__import__('json').dumps({k: type(v).__name__ for k, v in
    dict(adamerging_steps=adamerging_steps, adamerging_lr=adamerging_lr, splits=splits, rows=rows).items()}))
"""

@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path/'settings.ini').write_text(SETTINGS)
    exp = tmp_path/'nbs'/'experiments'; exp.mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell(PARAMS); p.metadata['tags'] = ['parameters']
    nb.cells = [nbformat.v4.new_markdown_cell("# typed\n\n> summary"), p, nbformat.v4.new_code_cell(BODY)]
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, str(exp/'00_typed.ipynb'))
    monkeypatch.setenv('FUSION_NB_ROOT', str(tmp_path))
    return scratch_sources(tmp_path)

def test_numbers_are_injected_as_numbers(project):
    assert reproduce('demo', log=lambda *_: None, progress=False) == {'00_typed': 'ok'}
    out = project/'outputs'/'demo'/'00_typed'
    injected = next(''.join(c['source']) for c in json.loads((out/'run.ipynb').read_text())['cells']
                    if 'injected-parameters' in c['metadata'].get('tags', []))
    assert 'adamerging_steps = 200\n' in injected and 'adamerging_lr = 0.005\n' in injected, injected
    assert 'splits = "0"\n' in injected and 'rows = "Task Arithmetic"\n' in injected   # a str default, or not a number: text
    assert json.loads((out/'types.json').read_text()) == {'adamerging_steps': 'int', 'adamerging_lr': 'float', 'splits': 'str', 'rows': 'str'}
    recorded = json.loads((out/'inputs.json').read_text())['parameters']   # the fingerprint keeps settings.ini's text: no rerun
    assert recorded['adamerging_steps'] == '200' and recorded['adamerging_lr'] == '5e-3'
