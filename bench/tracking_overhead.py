"""What MLflow tracking costs a `fusion-nb reproduce`: the same command on a scratch project of toy experiments, with and
without --no-track, in fresh processes, alternated (issue 52). Each toy experiment writes what a real one does to the store:
a table of 8 methods × 8 tasks, a findings table with verdicts, tidy records and a 200 kB figure.

    python bench/tracking_overhead.py [--experiments 4] [--repeats 2]

Prints the wall and CPU seconds of each command (CPU: the command and its kernels, which the machine's load hardly moves),
the overhead per command and per experiment, and the tracked over untracked ratio.

Measured 2026-12-02 (mlflow 3.17.2, 2 cores shared, load average 7.5, 4 experiments, store already created): CPU 21.8 s
untracked → 27.7 s tracked (+6.0 s per command, 1.5 s per experiment, ×1.27); wall 58.6 → 84.0 s (+25.4 s, the load's).
Most of it is per command (importing mlflow, opening the store), not per experiment."""
import argparse, os, resource, statistics, subprocess, sys, tempfile, time
from pathlib import Path

import nbformat

SETTINGS = """
[DEFAULT]
tasks = a b
batch_size = 8
[bench]
description = toy experiments for bench/tracking_overhead.py
pretrained = ./models/none
expert_template = ./models/none_{task}
dataset_template = ./datasets/{task}
"""
BODY = """
from pathlib import Path
import random
rnd = random.Random(batch_size)
tasks, methods = [f'task{i}' for i in range(8)], [f'method {i}' for i in range(8)]
Path(output_dir, 'table.csv').write_text(',' + ','.join(tasks) + '\\n' + ''.join(m + ',' + ','.join(f'{rnd.uniform(50, 90):.2f}' for _ in tasks) + '\\n' for m in methods))
Path(output_dir, 'table.md').write_text('| table |\\n')
Path(output_dir, 'findings.csv').write_text('finding,difference (points),verdict\\n' + ''.join(f'{m} > TA,{rnd.uniform(-3, 3):.2f},holds\\n' for m in methods))
Path(output_dir, 'findings.md').write_text('| findings |\\n')
Path(output_dir, 'results.csv').write_text('method,task,accuracy\\n' + ''.join(f'{m},{t},{rnd.random():.4f}\\n' for m in methods for t in tasks))
Path(output_dir, 'figure.png').write_bytes(rnd.randbytes(200_000))
"""

def project(root:Path, n:int)->Path:
    (root/'settings.ini').write_text(SETTINGS)
    exp = root/'nbs'/'experiments'; exp.mkdir(parents=True)
    for i in range(n):
        nb = nbformat.v4.new_notebook()
        p = nbformat.v4.new_code_cell("profile = 'bench'\noutput_dir = None\nbatch_size = 1"); p.metadata['tags'] = ['parameters']
        nb.cells = [nbformat.v4.new_markdown_cell(f'# toy {i}'), p, nbformat.v4.new_code_cell(BODY)]
        nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
        nbformat.write(nb, str(exp/f'{i:02d}_toy.ipynb'))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]/'tests'))
    from conftest import scratch_sources   # the empty models and small datasets a scratch profile names
    return scratch_sources(root)

def _cpu()->float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN); return r.ru_utime + r.ru_stime

def command(root:Path, track:bool)->tuple[float, float]:
    "(wall seconds, CPU seconds of the command and its kernels): CPU time hardly moves with the machine's load, wall time does."
    env = {**os.environ, 'FUSION_NB_ROOT': str(root), 'FUSION_NB_JOBS': '1'}
    env.pop('MLFLOW_TRACKING_URI', None); env.pop('FUSION_NB_TRACK', None)
    t, c = time.perf_counter(), _cpu()
    r = subprocess.run([sys.executable, '-m', 'fusion_nb.reproduce.cli', 'reproduce', '--profile', 'bench', '--force', '--no-progress',
                        *([] if track else ['--no-track'])], env=env, capture_output=True, text=True)
    if r.returncode: raise SystemExit(r.stderr)
    return time.perf_counter() - t, _cpu() - c

if __name__ == '__main__':
    ap = argparse.ArgumentParser(); ap.add_argument('--experiments', type=int, default=4); ap.add_argument('--repeats', type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = project(Path(d), a.experiments)
        command(root, True)   # warm-up: creates the store's tables (once per project), fills the OS file cache
        times = {True: [], False: []}
        for _ in range(a.repeats):
            for track in (False, True): times[track].append(command(root, track))
        print(f"{a.experiments} toy experiments per command, {a.repeats} command(s) each way, alternated; load average {os.getloadavg()[0]:.1f}")
        for i, what in enumerate(('wall', 'CPU')):
            on, off = (statistics.median(t[i] for t in times[k]) for k in (True, False))
            print(f"{what}: --no-track {' '.join(f'{t[i]:.1f}' for t in times[False])} s, tracked {' '.join(f'{t[i]:.1f}' for t in times[True])} s; "
                  f"overhead {on - off:.1f} s per command, {(on - off) / a.experiments:.2f} s per experiment; tracked / untracked = {on / off:.2f}")
