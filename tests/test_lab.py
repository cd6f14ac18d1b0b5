"""`make lab`: the kernel JupyterLab starts for an experiment notebook (the notebook's kernelspec, resolved as the lab
resolves it, in the notebook's folder) imports this checkout's fusion_nb and runs the notebook's first cells."""
import json, os, sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = REPO/'nbs'/'experiments'/'03_task_vector_cosine.ipynb'   # its first cells: parameters, then the profile prepared

def run_cell(kc, code:str, timeout:float=300)->tuple[str, dict|None]:
    "Execute `code` in the kernel of client `kc`: (its stdout, the error content or None)."
    out, err = [], []
    def hook(msg):
        t, c = msg['msg_type'], msg['content']
        if t == 'stream' and c['name'] == 'stdout': out.append(c['text'])
        elif t == 'error': err.append(c)
    kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return ''.join(out), (err[0] if err else None)

def test_the_lab_kernel_runs_an_experiments_first_cells(tmp_path):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    nb = json.loads(EXPERIMENT.read_text())
    name = nb['metadata']['kernelspec']['name']
    assert name == 'python3'   # the kernel papermill runs too (runner: kernel_name='python3')
    spec = KernelSpecManager().get_kernel_spec(name)   # as JupyterLab finds it: here, .venv's own Python 3 kernel
    code = [''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'code']
    params = next(i for i, c in enumerate(c for c in nb['cells'] if c['cell_type'] == 'code') if 'parameters' in c['metadata'].get('tags', []))
    env = {k: v for k, v in os.environ.items() if k != 'FUSION_NB_ROOT'}   # the lab finds the project from the notebook's folder
    km = KernelManager(kernel_name=name, kernel_spec_manager=KernelSpecManager())
    km.start_kernel(cwd=str(EXPERIMENT.parent), env=env)
    try:
        kc = km.client(); kc.start_channels(); kc.wait_for_ready(timeout=120)
        out, err = run_cell(kc, "import sys, fusion_nb; print(sys.executable); print(fusion_nb.__file__)")
        assert err is None, err
        executable, package = out.split()
        assert Path(executable).resolve() == Path(sys.executable).resolve(), spec.argv   # the environment `make lab` installed into
        assert Path(package).resolve().is_relative_to(REPO), package                   # this checkout's notebooks' package
        out, err = run_cell(kc, code[params])                                          # the parameters cell, as written
        assert err is None, err
        out, err = run_cell(kc, f"profile = 'micro'; output_dir = {str(tmp_path)!r}\n" + code[params + 1] + "\nprint(P.name, len(P.tasks), out)")
        assert err is None, '\n'.join(err['traceback'])
        assert out.split()[:2] == ['micro', '8'] and out.split()[2] == str(tmp_path), out
    finally:
        kc.stop_channels(); km.shutdown_kernel(now=True)
