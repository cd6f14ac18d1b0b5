"The docs site's sources: everything `nbdev-docs` does before Quarto renders (Quarto itself is not installable here)."
import json, os, shutil, subprocess, sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PRE_DOCS = """
import os
from nbdev.config import get_config
from nbdev.quarto import refresh_quarto_yml, nbdev_sidebar
from nbdev.serve import proc_nbs
import nbdev.doclinks
cfg = get_config(); os.chdir(cfg.config_path)
refresh_quarto_yml(); nbdev.doclinks._build_modidx(); nbdev_sidebar.__wrapped__(path=cfg.nbs_path)
proc_nbs(cfg.nbs_path, n_workers=0, force=True)
"""

def test_every_notebook_is_processed_for_the_site(tmp_path):
    "nbdev's processing of every notebook (the API docs run, examples not), as `nbdev-docs` does it, in a copy of the project."
    for f in ('pyproject.toml', 'settings.ini', 'README.md'): shutil.copy(REPO/f, tmp_path/f)
    shutil.copytree(REPO/'nbs', tmp_path/'nbs')
    shutil.copytree(REPO/'fusion_nb', tmp_path/'fusion_nb', ignore=shutil.ignore_patterns('__pycache__'))
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [str(tmp_path), os.environ.get('PYTHONPATH')]))}
    r = subprocess.run([sys.executable, '-c', PRE_DOCS], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    sources = sorted(p.relative_to(REPO/'nbs').as_posix() for p in (REPO/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)
    processed = sorted(p.relative_to(tmp_path/'_proc').as_posix() for p in (tmp_path/'_proc').rglob('*.ipynb'))
    assert processed == sources
    assert '{{< include ../README.md >}}' in (tmp_path/'_proc'/'index.qmd').read_text()   # the home page: the README, included
    sidebar = yaml.safe_load((tmp_path/'nbs'/'sidebar.yml').read_text())['website']['sidebar']['contents']
    listed = {e for item in sidebar for e in ([item] if isinstance(item, str) else item['contents'])}
    assert {s for s in sources if s.startswith(('methods/', 'experiments/'))} <= listed   # every method and experiment page
    ev = json.loads((tmp_path/'_proc'/'06_evaluation.ipynb').read_text())
    docs = [''.join(o['data']['text/markdown']) for c in ev['cells'] if c['cell_type'] == 'code' and 'show_doc(evaluate)' in ''.join(c['source'])
            for o in c.get('outputs', []) if 'text/markdown' in o.get('data', {})]
    assert docs and '### evaluate' in docs[0] and 'def evaluate(' in docs[0]   # the API docs were rendered by running the exports
