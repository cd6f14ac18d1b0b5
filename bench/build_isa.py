"""Does a build depend on the CPU's kernels? Build one benchmark (default micro) under several instruction-set caps on
this one machine and compare the files' hashes: a difference is what two machines with those CPUs would see.

    python bench/build_isa.py                 # micro, four settings, in a scratch folder
    python bench/build_isa.py --scale tiny    # the same for the tiny benchmark (half an hour each)

Settings: `native` (what this CPU offers), `avx2` (ATen, MKL and oneDNN capped at AVX2, as on a CPU without AVX-512), `avx`
(MKL and oneDNN capped at AVX: matmuls and convolutions without FMA, ATen's kernels as they are),
`portable` (ATen's scalar kernels, MKL's conditional numerical reproducibility `MKL_CBWR=COMPATIBLE`, oneDNN capped at
SSE4.1) and `portable+avx2`. Issue 30, item 1.
"""
from __future__ import annotations
import argparse, hashlib, json, os, subprocess, sys, tempfile, time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AVX2 = {'ATEN_CPU_CAPABILITY': 'avx2', 'MKL_ENABLE_INSTRUCTIONS': 'AVX2', 'ONEDNN_MAX_CPU_ISA': 'AVX2'}
sys.path.insert(0, str(REPO))
from fusion_nb.reproduce.runner import PORTABLE_KERNELS as PORTABLE   # what `fusion-nb reproduce` starts an experiment declaring `cpu_kernels = "portable"` on
AVX = {'MKL_ENABLE_INSTRUCTIONS': 'AVX', 'ONEDNN_MAX_CPU_ISA': 'AVX'}   # an AVX2 CPU's matmuls and convolutions without FMA (ATen's own kernels unchanged)
SETTINGS = {'native': {}, 'avx2': AVX2, 'avx': AVX, 'portable': PORTABLE, 'portable+avx2': {**AVX2, **PORTABLE, 'MKL_ENABLE_INSTRUCTIONS': 'AVX2'}}

def build(scale:str, root:Path, env:dict)->tuple[float, dict]:
    "Build `scale` into `root` in a fresh process with `env`; (seconds, file → sha256 from its manifest)."
    code = f"from fusion_nb.tiny.build import build_benchmark; build_benchmark({scale!r}, root={str(root)!r}, progress=False)"
    t0 = time.time()
    subprocess.run([sys.executable, '-c', code], check=True, cwd=REPO,
                   env={**os.environ, 'PYTHONPATH': str(REPO), 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', **env})
    return time.time() - t0, json.loads((root/'data'/scale/'manifest.json').read_text())['files']

def digest(files:dict, prefix:str)->str:
    return hashlib.sha256(json.dumps({f: h for f, h in files.items() if f.startswith(prefix)}, sort_keys=True).encode()).hexdigest()[:12]

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--scale', default='micro'); ap.add_argument('--settings', nargs='+', default=list(SETTINGS))
    a = ap.parse_args(argv)
    import torch
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, load {os.getloadavg()[0]:.1f}")
    rows = {}
    with tempfile.TemporaryDirectory(prefix='build-isa-') as tmp:
        for name in a.settings:
            s, files = build(a.scale, Path(tmp)/name, SETTINGS[name])
            rows[name] = (s, digest(files, 'models/'), digest(files, 'datasets/'))
            print(f"{name}: {s:.1f} s, models {rows[name][1]}, datasets {rows[name][2]}", flush=True)
    print(f"\n| setting | seconds | models | datasets |\n|---|---:|---|---|")
    for name, (s, m, d) in rows.items(): print(f"| {name} | {s:.1f} | {m} | {d} |")
    return 0

if __name__ == '__main__':
    sys.exit(main())
