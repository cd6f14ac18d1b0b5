"Logs a person can read (issue 30, item 5): without a terminal, no carriage-return bars; a line per stage, a summary a minute."
import os, subprocess, sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[2]
SETTINGS = "[DEFAULT]\ntasks = a\n[demo]\ndescription = scratch\npretrained = ./m\nexpert_template = ./m_{task}\ndataset_template = ./d/{task}\n"

def test_a_run_without_terminal_writes_lines_not_bars(tmp_path):
    (tmp_path/'settings.ini').write_text(SETTINGS)
    from conftest import scratch_sources
    scratch_sources(tmp_path, tasks='a', model='m', datasets='d')
    exp = tmp_path/'nbs'/'experiments'; exp.mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell("profile = 'demo'\noutput_dir = None"); p.metadata['tags'] = ['parameters']
    nb.cells = [nbformat.v4.new_markdown_cell('# slow'), p, *[nbformat.v4.new_code_cell('import time; time.sleep(0.5)') for _ in range(5)]]
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, str(exp/'00_slow.ipynb'))
    env = {**os.environ, 'FUSION_NB_ROOT': str(tmp_path), 'FUSION_NB_LOG_EVERY': '1', 'PYTHONPATH': str(REPO)}
    env.pop('FUSION_NB_PROGRESS', None)
    r = subprocess.run([sys.executable, '-c', 'import sys; from fusion_nb.reproduce.cli import main; sys.exit(main())',
                        'reproduce', '--profile', 'demo'], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    log = r.stdout.decode()
    assert r.returncode == 0, log
    assert '\r' not in log                                   # papermill's bar over the cells drew `\r` updates here
    lines = log.splitlines()   # (a library's warning may come first)
    lines = lines[next(i for i, l in enumerate(lines) if l.startswith('[00_slow] running')):]
    assert lines[-1].startswith('1 ran, 0 up to date, 0 failed'), log
    beats = [l for l in lines if l.startswith('[00_slow] still running after ')]
    assert 1 <= len(beats) <= 30 and len(lines) <= len(beats) + 5, log   # a line per second of a run of 2.5 s and more
