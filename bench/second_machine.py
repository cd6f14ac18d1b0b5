"""The same numbers on another machine: hashes of each stage of the tiny build, and experiments run without a kernel.

Run on both machines from the same commit, then compare the files byte for byte (`compare`):

    python bench/second_machine.py stages --out stages.json        # build from pins/; hash images, pixels, features, weights
    python bench/second_machine.py run 00 03 04 --out tables/       # the notebooks' code, each in its own one-thread process
    python bench/second_machine.py compare stages.json other/stages.json
    python bench/second_machine.py compare tables/ other/tables/

`run` executes an experiment notebook's code cells in a plain Python process with the runner's parameters
(`experiment_parameters`) injected after the `parameters` cell, as papermill does: a GPU machine's image has torch and
transformers but no papermill or Jupyter kernel, and nothing can be installed there but carried wheels (datasets, dill,
multiprocess, fastcore: 1 MB). The GPU machine of 2026-11-28 (Python 3.12, torch 2.11.0+cu130, transformers 5.17) ran
`stages` and experiment 03 byte-identical to this machine once the code digests were made the same on every Python.
"""
import argparse, hashlib, json, os, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H = lambda b: hashlib.sha256(b).hexdigest()[:16]

def stages(out:Path, n:int=64):
    "Hash every stage a table depends on: the rendered images, the processor's pixels, the CLIP's features, its weights."
    import numpy as np, torch, transformers, datasets
    from fusion_nb.pools import ModelPool, Task
    from fusion_nb.reproduce.profiles import load_profile, prepare
    t0 = time.time(); P = prepare(load_profile('tiny'))
    r = {'build_s': round(time.time() - t0, 1), 'python': sys.version.split()[0], 'torch': torch.__version__,
         'transformers': transformers.__version__, 'datasets': datasets.__version__, 'numpy': np.__version__,
         'cpu_capability': torch.backends.cpu.get_cpu_capability()}
    pool = ModelPool(P.pretrained, {}, 'cpu', P.dtype); r['processor'] = type(pool.processor).__name__
    for t in P.tasks:
        ds = Task(t, P.datasets[t], split=P.test_split).load(split=P.test_split)
        images = [ds[i]['image'].convert('RGB') for i in range(min(n, len(ds)))]
        px = pool.processor(images=images, return_tensors='pt')['pixel_values']
        with torch.no_grad(): f = pool.clip.get_image_features(pixel_values=px)
        f = f if isinstance(f, torch.Tensor) else f.pooler_output
        r |= {f'{t}/images': H(b''.join(np.asarray(im).tobytes() for im in images)), f'{t}/pixels': H(px.numpy().tobytes()),
              f'{t}/features': H(f.numpy().tobytes())}
    sd = pool.clip.state_dict(); r['clip_weights'] = H(b''.join(sd[k].numpy().tobytes() for k in sorted(sd)))
    out.write_text(json.dumps(r, indent=1) + '\n'); print(json.dumps(r, indent=1))

def run_notebook(name:str, out:Path):
    "One experiment's code cells in this process, parameters injected as papermill would (the runner's for the tiny profile)."
    from fusion_nb.reproduce.profiles import load_profile
    from fusion_nb.reproduce.runner import experiment_paths
    from fusion_nb.reproduce.fingerprints import experiment_parameters
    P = load_profile('tiny'); nb_path = experiment_paths(name, P)[0]
    params = {**experiment_parameters(nb_path, P, None), 'output_dir': str(out/nb_path.stem)}
    ns = {'__name__': '__main__', 'display': lambda *a, **k: None}
    for c in json.loads(nb_path.read_text())['cells']:
        if c['cell_type'] != 'code': continue
        exec(compile(''.join(c['source']), str(nb_path), 'exec'), ns)
        if 'parameters' in c['metadata'].get('tags', []): exec('\n'.join(f'{k} = {v!r}' for k, v in params.items()), ns)

def run(names, out:Path, limit:int):
    "Each experiment in its own one-thread process (at most the cores at once), each stopped after `limit` seconds."
    from fusion_nb.core import compute_env
    env = compute_env({**os.environ, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1', 'HF_HUB_OFFLINE': '1'})
    procs, t0 = {}, time.time()
    for n in names:
        log = open(out/f'{n}.log', 'w')
        procs[n] = subprocess.Popen([sys.executable, __file__, '_one', n, '--out', str(out)], env=env, stdout=log, stderr=subprocess.STDOUT)
    for n, p in procs.items():
        try: rc = p.wait(timeout=max(1, limit - (time.time() - t0)))
        except subprocess.TimeoutExpired: p.kill(); rc = 'stopped'
        print(f'{n}: {rc} at {time.time() - t0:.0f} s', flush=True)

def compare(a:Path, b:Path):
    "Which stages or table files differ between two machines' results."
    if a.is_file():
        x, y = json.loads(a.read_text()), json.loads(b.read_text())
        diff = {k: (x.get(k), y.get(k)) for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)}
    else:
        files = sorted({p.relative_to(a) for p in a.rglob('*') if p.suffix in ('.csv', '.md')} | {p.relative_to(b) for p in b.rglob('*') if p.suffix in ('.csv', '.md')})
        diff = {str(f): 'differs' if (a/f).exists() and (b/f).exists() else 'only in one' for f in files
                if not ((a/f).exists() and (b/f).exists() and (a/f).read_bytes() == (b/f).read_bytes())}
        print(f'{len(files) - len(diff)} of {len(files)} table files byte-identical')
    for k, v in diff.items(): print(k, v)

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('what', choices=['stages', 'run', 'compare', '_one']); ap.add_argument('args', nargs='*')
    ap.add_argument('--out', type=Path); ap.add_argument('--limit', type=int, default=3600, help='seconds for all runs')
    a = ap.parse_args(); os.chdir(ROOT)
    if a.what == 'stages': stages(a.out)
    elif a.what == 'compare': compare(Path(a.args[0]), Path(a.args[1]))
    elif a.what == '_one': run_notebook(a.args[0], a.out)
    else: a.out.mkdir(parents=True, exist_ok=True); run(a.args, a.out, a.limit)
