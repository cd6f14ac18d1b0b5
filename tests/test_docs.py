"""The docs site: nbdev's processing of every notebook (what `nbdev-docs` does before Quarto renders), and the site that
Sphinx + myst-nb renders from it when Quarto is absent (`make docs`, fusion_nb.site), with an executed experiment's figure."""
import json, os, shutil, subprocess, sys
from html import unescape
from pathlib import Path

import pytest, re, yaml

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

@pytest.fixture(scope='module')
def processed(tmp_path_factory):
    "A copy of the project with every notebook processed by nbdev into `_proc/`, as `nbdev-docs` does it."
    tmp_path = tmp_path_factory.mktemp('project')
    for f in ('pyproject.toml', 'settings.ini', 'README.md'): shutil.copy(REPO/f, tmp_path/f)
    shutil.copytree(REPO/'nbs', tmp_path/'nbs')
    shutil.copytree(REPO/'fusion_nb', tmp_path/'fusion_nb', ignore=shutil.ignore_patterns('__pycache__'))
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [str(tmp_path), os.environ.get('PYTHONPATH')]))}
    r = subprocess.run([sys.executable, '-c', PRE_DOCS], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp_path

@pytest.mark.slow   # the docs site build (make docs): make test-all
def test_every_notebook_is_processed_for_the_site(processed):
    "nbdev's processing of every notebook (the API docs run, examples not), as `nbdev-docs` does it, in a copy of the project."
    tmp_path = processed
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


def _executed_run(project, experiment, profile):
    """What `fusion-nb reproduce` leaves for `experiment`: papermill's executed notebook (the parameters it injected, the cell
    whose output names the figure `save_figure` wrote) beside the figure's PNG; the cells are the clean notebook's."""
    run_dir = project/'outputs'/profile/experiment; run_dir.mkdir(parents=True)
    import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(3, 2)); ax.imshow([[1, 0.2], [0.2, 1]]); fig.savefig(run_dir/'cosine_similarity.png'); plt.close(fig)
    nb = json.loads((project/'nbs'/'experiments'/f'{experiment}.ipynb').read_text())
    at = next(i for i, c in enumerate(nb['cells']) if 'parameters' in c['metadata'].get('tags', [])) + 1
    nb['cells'].insert(at, {'cell_type': 'code', 'metadata': {'tags': ['injected-parameters']}, 'execution_count': 2, 'outputs': [],
                            'source': f'# Parameters\nprofile = "{profile}"\noutput_dir = "{run_dir}"\n'})
    saved = {'output_type': 'execute_result', 'execution_count': 9, 'metadata': {},
             'data': {'text/plain': f"{{'png': PosixPath('{run_dir}/cosine_similarity.png'), 'pdf': PosixPath('{run_dir}/cosine_similarity.pdf')}}"}}
    last = max(i for i, c in enumerate(nb['cells']) if c['cell_type'] == 'code')
    nb['cells'][last]['outputs'] = [saved]
    (run_dir/'run.ipynb').write_text(json.dumps(nb)); (run_dir/'inputs.json').write_text(json.dumps({'finished': '2026-11-23 21:00:00'}))
    return run_dir

def _text(html): return unescape(re.sub(r'<[^>]+>', '', html))

@pytest.mark.slow   # the docs site build (make docs): make test-all
def test_the_site_renders_every_notebook(processed, monkeypatch):
    """Sphinx + myst-nb render the processed notebooks, every warning an error: a page per notebook in the sidebar, math for
    MathJax, show_doc's API entries, and an experiment's executed run (its figure) in place of its clean notebook."""
    from fusion_nb.site import build_site, page_name
    monkeypatch.chdir(processed)   # nbdev's processors read this copy's pyproject.toml
    run_dir = _executed_run(processed, '03_task_vector_cosine', 'micro')
    pages = build_site(processed/'_proc', processed/'_docs', processed/'README.md', processed/'outputs', ['tiny', 'micro'])
    site = processed/'_docs'
    assert not (processed/'jupyter_execute').exists()   # myst-nb's copies stay in the build's temporary folder
    sources = sorted(p.relative_to(REPO/'nbs').as_posix() for p in (REPO/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)
    assert sorted(pages) == sources
    index = (site/'index.html').read_text()
    for rel in sources:
        page = page_name(rel, json.loads((processed/'_proc'/rel).read_text()))
        assert pages[rel]['page'] == page and (site/f'{page}.html').is_file(), rel
        assert f'href="{page}.html"' in index, f'{page} is not in the sidebar'
    assert 'A short tour' in _text(index) and (site/'search.html').is_file() and (site/'searchindex.js').is_file()
    ta = (site/'methods'/'task_arithmetic.html').read_text()   # math, marked for MathJax and served from the site
    assert re.search(r'<div class="math notranslate nohighlight">\s*\\\[\\theta = \\theta_0 \+ \\lambda \\sum', ta)
    assert '<span class="math notranslate nohighlight">\\(\\tau_i = \\theta_i - \\theta_0\\)</span>' in ta
    assert 'src="../_static/mathjax/tex-mml-chtml.js' in ta and (site/'_static'/'mathjax'/'tex-mml-chtml.js').is_file()
    article = _text(ta.split('<article')[1].split('</article>')[0])
    assert '$\\' not in article and '$$' not in article   # no raw $\lambda$ left in the page
    ev = (site/'evaluation.html').read_text()   # show_doc's entries: heading, signature, docstring; not the show_doc call
    assert 'id="task-head"' in ev and 'def task_head(' in _text(ev) and 'show_doc(' not in ev and 'show-doc-source' in ev
    cos = (site/'experiments'/'task_vector_cosine.html').read_text()
    assert pages['experiments/03_task_vector_cosine.ipynb']['run'] == run_dir
    assert re.search(r'<img alt="cosine_similarity" src="../_images/cosine_similarity\.png"', cos), "the run's figure is not on its page"
    assert (site/'_images'/'cosine_similarity.png').read_bytes() == (run_dir/'cosine_similarity.png').read_bytes()
    assert 'outputs/micro/03_task_vector_cosine/run.ipynb, finished 2026-11-23 21:00:00' in _text(cos) and 'profile = "micro"' in _text(cos)
    individual = _text((site/'experiments'/'individual.html').read_text())   # no run: the clean notebook, and how to get one
    assert pages['experiments/00_individual.ipynb']['run'] is None
    assert 'fusion-nb reproduce --profile tiny --only 00_individual' in individual


# The README is the front door (issue 53): what the project is, the two commands, a short tour, where to go next. Its
# measurements and studies moved to the guide pages (nbs/guide/), each a page of the site.
README_BEFORE_THE_GUIDE = '9f2a07b'   # the last commit whose README held them all (649 lines)
GUIDE = REPO/'nbs'/'guide'

def _numbers(text:str)->set[str]:
    "Every number written in `text` (`42`, `1,483`, `0.35`, `12:53`, `2026-11-28` as 2026, 11, 28)."
    return set(re.findall(r'\d+(?:[.,:]\d+)*', text))

def _guide_text()->str:
    return '\n'.join(''.join(c['source']) for p in sorted(GUIDE.glob('*.ipynb')) for c in json.loads(p.read_text())['cells'])

def test_the_readme_is_short_and_names_every_guide_page():
    readme = (REPO/'README.md').read_text()
    assert len(readme.splitlines()) < 200 and 'make reproduce' in readme and 'make test' in readme and 'make lab' in readme
    pages = sorted(p.relative_to(REPO).as_posix() for p in GUIDE.glob('*.ipynb'))
    assert pages and all(f'`{p}`' in readme for p in pages), pages
    sidebar = yaml.safe_load((REPO/'nbs'/'sidebar.yml').read_text())['website']['sidebar']['contents']
    listed = {e for item in sidebar for e in ([item] if isinstance(item, str) else item['contents'])}
    assert {p.removeprefix('nbs/') for p in pages} <= listed   # each a page of the Quarto site too

def test_every_number_of_the_old_readme_is_kept():
    "Every number the README held before the guide pages is in the README or a guide page: the move lost no measurement."
    old = subprocess.run(['git', 'show', f'{README_BEFORE_THE_GUIDE}:README.md'], cwd=REPO, capture_output=True, text=True)
    if old.returncode: pytest.skip(f"git cannot show {README_BEFORE_THE_GUIDE}:README.md here (a shallow clone?): {old.stderr.strip()}")
    lost = _numbers(old.stdout) - _numbers((REPO/'README.md').read_text() + _guide_text())
    assert not lost, f"numbers of the old README found in neither README.md nor nbs/guide/: {sorted(lost)}"

def test_the_number_check_finds_a_lost_number():
    assert _numbers('took 12:53 to 14:59 (pytest 8.9–10.6), 1,483 s; ×4') == {'12:53', '14:59', '8.9', '10.6', '1,483', '4'}
    assert _numbers('all thirteen after 42–50 minutes') - _numbers('after 42–51 minutes') == {'50'}
