#!/usr/bin/env python
"""What `fusion_nb.core.compute_env` changes: the time of the tiny profile's hot loops, and not one byte of their results.

    python bench/compute_env.py                # 3 rounds of each workload, in fresh processes, plain and under compute_env
    python bench/compute_env.py --rounds 5 --only soups
    python bench/compute_env.py --notebook 21_robust_shifts --root R   # a whole experiment, plain and tuned side by side

Every experiment's kernel starts under `compute_env`: glibc's large freed blocks kept in the heap (`MALLOC_MMAP_THRESHOLD_`,
`MALLOC_TRIM_THRESHOLD_`) and OpenMP threads that sleep. glibc's default hands every large freed block back to the system,
so a CPU forward pass page-faults its activations in again at every layer. The workloads are the loops the whole tiny run
spends its time in, each run in a fresh Python (the allocator reads its settings at start), alternating plain (every
`COMPUTE_ENV` variable removed) and compute_env, one torch thread each, one process at a time:

- soups: experiment 21's inner loop, the robust ConvNet's soups evaluated clean on the 4,025 adapt images of the shifts;
- attack: experiment 20's inner loop, APGD (20 steps) in the three threat models on 300 test images, two soups;
- clip: the tiny CLIP's vision tower, forward and backward on 1,024 images in batches of 128 (test-time adaptation's step).

Loops alone overstate it: glibc raises its thresholds by itself after the process frees a large block, which a notebook's
earlier cells often do. `--notebook NAME` runs a whole experiment notebook with papermill twice at once, one core each
(plain and compute_env, the same load on both until the first one ends: the other then runs alone, which favours
it), on a project root whose data is built (`--root`, default this checkout),
and compares every table it writes byte for byte.

Prints per workload the median seconds of each setting, their ratio (compute_env / plain: below 1 is faster) and whether
the results' SHA-256 agree; exits 1 if any differ. Needs the tiny benchmark and the robust zoo (`make reproduce`, or the pins).
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_ROBUST = """
from fusion_nb.reproduce.profiles import load_profile
from fusion_nb.reproduce.runner import KERNEL_START_TIMEOUT
from fusion_nb.robust.zoo import load_zoo, profile_budget, robust_zoo, zoo_dir, zoo_specs
from fusion_nb.robust.soups import SoupKitchen
from fusion_nb.robust.paper_data import standin_set, to_input
P = load_profile('tiny'); E = P.extra
def zoo(ds): return load_zoo(robust_zoo(zoo_dir(P.root, P.name, ds), ds, zoo_specs(ds, E['robust_bases'].split() if ds == 'cifar10' else None), profile_budget(E, ds), progress=False))
"""

WORKLOADS = {
    'soups': _ROBUST + """
from fusion_nb.robust.shifts import SHIFTS, build_shifts, shift_tensors, shifts_dir
z = zoo('imagenet'); names = ['theta_linf', 'theta_linf_to_l2', 'theta_linf_to_l1', 'theta_linf_to_nominal']
sdir = build_shifts(shifts_dir(P.root, P.name), int(E['shift_adapt_images']), int(E['shift_test_images']), int(E['shift_c_images']), progress=False)
X = torch.cat([standin_set(*shift_tensors(sdir, s, 'adapt')).x for s in SHIFTS])
K = SoupKitchen(z[names[0]], {n: z[n] for n in names})
def work():
    out = []
    for w in ([0.4, 0.2, 0.2, 0.2], [1.0, 0.0, 0.0, 0.0], [-0.2, 0.6, 0.4, 0.2], [0.2, 0.2, 0.2, 0.4]):
        m = K.set(w)
        with torch.no_grad(): out += [m(to_input(X[i:i + 128], 'cpu')) for i in range(0, len(X), 128)]
    return out
""",
    'attack': _ROBUST + """
from fusion_nb.robust.attacks import apgd
from fusion_nb.robust.zoo import standin, standin_attacks
z = zoo('cifar10'); T = standin_set(*standin('cifar10', 'test', 300))
K = SoupKitchen(next(iter(z.values())), z)
attacks = {a['norm']: dict(a, steps=20) for a in standin_attacks('cifar10')}
def work():
    out = []
    for w in ({'theta_linf': 1.0}, {'theta_linf': 0.5, 'theta_l2': 0.5}):
        m = K.set({n: w.get(n, 0.0) for n in K.names})
        for norm, a in attacks.items():
            for i in range(0, len(T), 128):
                x, y = to_input(T.x[i:i + 128], 'cpu'), T.y[i:i + 128]
                with torch.no_grad(): ok = m(x).argmax(1) == y
                r = apgd(m, x[ok], y[ok], norm, a['eps'], steps=a['steps'], loss=a['loss'], largereps=a.get('largereps', False))
                out += [r.robust, r.x_adv]
    return out
""",
    'clip': """
from transformers import CLIPVisionModel
m = CLIPVisionModel.from_pretrained('data/tiny/models/clip-vit-tiny'); s = m.config.image_size; first = next(m.parameters())
X = torch.rand(1024, 3, s, s, generator=torch.Generator().manual_seed(0))
def work():
    out = []
    for i in range(0, len(X), 128):
        m.zero_grad(); f = m(pixel_values=X[i:i + 128]).pooler_output; f.square().mean().backward()
        out += [f.detach(), first.grad.clone()]
    return out
""",
}

_TIMED = """
import hashlib, time, json, torch
torch.set_num_threads(1)
{setup}
work()   # warm-up: imports, first allocations
t = time.perf_counter(); out = work(); dt = time.perf_counter() - t
h = hashlib.sha256(b''.join(o.detach().contiguous().numpy().tobytes() for o in out)).hexdigest()
print(json.dumps({{'seconds': dt, 'sha256': h}}))
"""

def child_env(tuned:bool, root:Path)->dict:
    "A child's environment: every `COMPUTE_ENV` variable removed (plain) or compute_env's; one torch thread, offline, on `root`."
    from fusion_nb.core import COMPUTE_ENV, compute_env
    plain = {k: v for k, v in os.environ.items() if k not in COMPUTE_ENV}
    return {**(compute_env(plain) if tuned else plain), 'OMP_NUM_THREADS': '1', 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1',
            'FUSION_NB_ROOT': str(root)}

def run_once(name:str, tuned:bool)->dict:
    "One timed call of a workload's `work()` in a fresh Python, plain or under compute_env."
    p = subprocess.run([sys.executable, '-c', _TIMED.format(setup=WORKLOADS[name])], env=child_env(tuned, REPO), cwd=REPO, capture_output=True, text=True)
    if p.returncode: sys.exit(f"{name} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])

def run_notebook(name:str, root:Path, profile:str)->int:
    "Experiment `name` run twice at once by papermill, plain and under compute_env; seconds each, and whether their tables agree."
    import tempfile, time
    scratch, procs = Path(tempfile.mkdtemp(prefix='compute-env-')), {}
    for tuned in (False, True):
        out = scratch/('tuned' if tuned else 'plain'); out.mkdir()
        env = {**child_env(tuned, root), 'PYTHONPATH': str(root)}
        nb = root/'nbs'/'experiments'/f'{name}.ipynb'
        cmd = [sys.executable, '-m', 'papermill', '--start-timeout', str(KERNEL_START_TIMEOUT), str(nb), str(out/'run.ipynb'), '-p', 'profile', profile, '-p', 'output_dir', str(out),
               '-k', 'python3', '--cwd', str(nb.parent), '--no-progress-bar']
        procs[tuned] = (subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=(out/'stderr.txt').open('w')), time.time())
    secs = {}
    for tuned, (p, t0) in procs.items():
        if p.wait(): sys.exit(f"{name} ({'tuned' if tuned else 'plain'}) failed: see {scratch}")
        secs[tuned] = time.time() - t0
    tables = sorted(f.name for f in (scratch/'plain').glob('*.csv'))
    same = bool(tables) and all((scratch/'plain'/f).read_bytes() == (scratch/'tuned'/f).read_bytes() for f in tables)
    print(f"{name}: plain {secs[False]:.0f} s, compute_env {secs[True]:.0f} s (ratio {secs[True] / secs[False]:.2f}), side by side; "
          f"{len(tables)} tables, {'byte-identical' if same else 'DIFFERENT'} ({scratch})")
    return 0 if same else 1

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--rounds', type=int, default=3, help='timed runs of each setting (alternating)')
    ap.add_argument('--only', nargs='+', choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument('--notebook', help='an experiment notebook to run whole, plain and tuned side by side')
    ap.add_argument('--root', type=Path, default=REPO, help='project root with its data built (--notebook)')
    ap.add_argument('--profile', default='tiny', help='profile of --notebook')
    a = ap.parse_args(argv)
    if a.notebook: return run_notebook(a.notebook, a.root.resolve(), a.profile)
    same = True
    print(f"{'workload':8} {'plain s':>8} {'tuned s':>8} {'ratio':>6}  same bytes")
    for name in a.only:
        runs = {False: [], True: []}
        for _ in range(a.rounds):
            for tuned in (False, True): runs[tuned].append(run_once(name, tuned))
        t = {k: statistics.median(r['seconds'] for r in v) for k, v in runs.items()}
        ok = len({r['sha256'] for v in runs.values() for r in v}) == 1; same &= ok
        print(f"{name:8} {t[False]:8.2f} {t[True]:8.2f} {t[True] / t[False]:6.2f}  {'yes' if ok else 'NO'}", flush=True)
    return 0 if same else 1

if __name__ == '__main__': sys.exit(main())
