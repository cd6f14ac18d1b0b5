"""What the portable kernels cost experiment 10 (paper 001, NeuLig), and that they give the same bytes under another CPU's cap.

    python bench/portable_kernels.py                         # micro: its run-time training, native vs portable, twice each
    python bench/portable_kernels.py --profile tiny --steps 20   # tiny's models and batches, 20 steps of each learned part
    python bench/portable_kernels.py --profile tiny --steps 10 --knobs   # which of the three settings costs the time
    python bench/portable_kernels.py --profile tiny --steps 10 --qemu Skylake-Client   # portable here and under QEMU's Intel: same hashes?

Experiment 10 declares `cpu_kernels = "portable"`: `fusion-nb reproduce` starts its kernel with
`fusion_nb.reproduce.runner.PORTABLE_KERNELS`. This runs the parts of it that train at run time — NeuLig's Portland
(semi-supervised and supervised), layer-wise AdaMerging's coefficients, WE-MoE's routers, RegMean's Gram matrices — each in
a fresh process per setting (the kernels are chosen as a process starts), alternating native and portable so that the
machine's load meets both alike, and prints each part's seconds (the best of the repeats), the ratio portable / native
measured in this run, and the hash of what was trained (the fused weights; NeuLig: the saved Portland): equal hashes under `native+cap` and `portable+cap` would mean the
cap changes nothing; `portable` and `portable+cap` must agree. Issue 47, item 4.
"""
from __future__ import annotations
import argparse, json, os, shutil, subprocess, sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO/'.ci')]
from fusion_nb.reproduce.runner import PORTABLE_KERNELS, kernel_env
from other_cpu import other_cpu_env

SETUP = r"""
import hashlib, json, sys
import torch
from fusion_nb.reproduce.profiles import load_profile
from fusion_nb.pools import ModelPool, TaskPool, PRETRAINED
from fusion_nb.methods.data import MergeData, profile_settings
from fusion_nb.neulig.neulig import neulig
from fusion_nb.tiny.tasks import NEULIG_TASKS
P = load_profile(sys.argv[1], tasks=NEULIG_TASKS)   # experiment 10's experts on the profile named first
models, tasks = ModelPool.from_profile(P), TaskPool.from_profile(P)
data = MergeData(models, tasks, seed=P.seed, num_workers=0)
pre, experts = models.vision_state(PRETRAINED), {t: models.vision_state(t) for t in P.tasks}
D = neulig.defaults()
B = profile_settings(P, {'neulig_steps': D['steps'], 'neulig_lr': D['lr'], 'neulig_batch_size': D['batch_size']})   # as notebook 10
"""   # shared with bench/portable_trace.py

PART = SETUP + r"""
import time, tempfile
from pathlib import Path
from fusion_nb.reproduce.rows import fuse, fusion_settings
steps = int(sys.argv[2])
S = dict(fusion_settings(P))
if steps: B['neulig_steps'] = S['adamerging_steps'] = S['wemoe_steps'] = steps
out, seconds, hashes = Path(tempfile.mkdtemp()), {}, {}
digest = lambda files: hashlib.sha256(b''.join(f.read_bytes() for f in sorted(files))).hexdigest()[:12]
for setting in ('semi-supervised', 'supervised'):
    t0 = time.time()
    neulig(pre, experts, data=data, setting=setting, steps=B['neulig_steps'], lr=B['neulig_lr'], batch_size=B['neulig_batch_size'],
           seed=P.seed, progress=False, save_to=out/f'{setting}.safetensors')
    seconds[f'NeuLig {setting}'], hashes[f'NeuLig {setting}'] = time.time() - t0, digest([out/f'{setting}.safetensors'])
for r in ('regmean', 'layer_wise_adamerging', 'weight_ensembling_moe'):
    t0 = time.time()
    fused, _ = fuse(r, pre, experts, data, S, out/r, seed=P.seed, progress=False, paper='001')
    seconds[r] = time.time() - t0
    state = fused.state_dict() if isinstance(fused, torch.nn.Module) else fused   # RegMean: a state dict; the others: models
    hashes[r] = hashlib.sha256(b''.join(v.detach().contiguous().numpy().tobytes() for k, v in sorted(state.items())
                                        if torch.is_tensor(v) and v.is_floating_point())).hexdigest()[:12]
print(json.dumps({'capability': torch.backends.cpu.get_cpu_capability(), 'seconds': seconds, 'hashes': hashes}))
"""

def run(profile:str, steps:int, env:dict, qemu:str|None=None)->dict:
    cmd = [sys.executable, '-c', PART, profile, str(steps)]
    if qemu and not shutil.which('qemu-x86_64'): sys.exit("--qemu needs QEMU's user-mode emulator, qemu-x86_64 (Debian: apt-get install qemu-user)")
    r = subprocess.run(['qemu-x86_64', '-cpu', qemu, *cmd] if qemu else cmd, env=env, capture_output=True, text=True, cwd=REPO)
    if r.returncode: sys.exit(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])

ALONE = {f'{k}={v} alone': {k: v} for k, v in PORTABLE_KERNELS.items()}   # --knobs: each portable setting by itself (its time only)
VARIANTS = {'portable, ATEN_CPU_CAPABILITY=avx2': {'ATEN_CPU_CAPABILITY': 'avx2'}}   # --knobs: the portable settings with ATen's AVX2 loops

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--profile', default='micro'); ap.add_argument('--steps', type=int, default=0, help="each learned part's steps (0: the profile's)")
    ap.add_argument('--repeats', type=int, default=2)
    ap.add_argument('--knobs', action='store_true', help="also each portable setting alone, and the portable ones with ATen's AVX2 loops: which costs the time")
    ap.add_argument('--qemu', help="a QEMU CPU model (`qemu-x86_64 -cpu help`): the portable kernels here and under its emulation, hashes compared")
    a = ap.parse_args(argv)
    cap_name, cap = other_cpu_env()
    base = {k: v for k, v in os.environ.items() if k not in {*cap, *PORTABLE_KERNELS, 'MKL_ENABLE_INSTRUCTIONS'}}
    base |= {'PYTHONPATH': str(REPO), 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'OMP_NUM_THREADS': os.environ.get('OMP_NUM_THREADS', '1')}
    settings = {'native': base, 'portable': kernel_env('portable', base)}
    if a.qemu: return emulated(a.profile, a.steps, settings['portable'], a.qemu)
    if a.knobs: settings |= {k: {**base, **v} for k, v in ALONE.items()} | {k: {**kernel_env('portable', base), **v} for k, v in VARIANTS.items()}
    print(f"profile {a.profile}, steps: {a.steps or 'the profile'}'s, this CPU's kernels {cap_name}, capped with {cap}, "
          f"{base['OMP_NUM_THREADS']} thread(s), load {os.getloadavg()[0]:.1f}", flush=True)
    runs = {name: [] for name in settings}
    for i in range(a.repeats):   # settings alternate, so the machine's load meets each alike
        for name, env in settings.items():
            runs[name].append(run(a.profile, a.steps, env)); print(f"  {name} #{i + 1}: {runs[name][-1]}", flush=True)
    # under the cap: the setting's own variables win over the cap's (as the runner sets them over any environment)
    capped = {name: run(a.profile, a.steps, {**env, **cap} if name == 'native' else {**env, **{k: v for k, v in cap.items() if k not in env}})
              for name, env in settings.items() if name not in ALONE}
    parts = list(runs['native'][0]['seconds'])
    best = {name: {p: min(r['seconds'][p] for r in rs) for p in parts} for name, rs in runs.items()}
    others = [n for n in settings if n != 'native']
    print("\n| part | native s | " + " | ".join(f"{n} s | / native" for n in others) + " |")
    print("|---|---:|" + "---:|---:|" * len(others))
    for p in parts + ['all']:
        sec = {n: sum(best[n].values()) if p == 'all' else best[n][p] for n in settings}
        print(f"| {p} | {sec['native']:.1f} | " + " | ".join(f"{sec[n]:.1f} | {sec[n] / sec['native']:.2f}" for n in others) + " |")
    print("\n| part | " + " | ".join(f"{n} | {n}, capped" for n in capped) + " |")
    print("|---|" + "---|---|" * len(capped))
    for p in parts: print(f"| {p} | " + " | ".join(f"{runs[n][0]['hashes'][p]} | {capped[n]['hashes'][p]}" for n in capped) + " |")
    same = {n: all(capped[n]['hashes'][p] == runs[n][0]['hashes'][p] for p in parts) for n in capped if n != 'native'}
    print("\n" + "; ".join(f"{n}: {'the same bytes' if ok else 'OTHER BYTES'} under the cap" for n, ok in same.items()) +
          f"; native: {sum(capped['native']['hashes'][p] != runs['native'][0]['hashes'][p] for p in parts)} of {len(parts)} parts differ under the cap")
    return 0 if same['portable'] else 1

def emulated(profile:str, steps:int, env:dict, qemu:str)->int:
    "Train every part on the portable kernels here and under QEMU's emulation of CPU model `qemu`; 0 if every hash agrees."
    here, there = run(profile, steps, env), run(profile, steps, env, qemu)
    print(f"profile {profile}, steps: {steps or 'the profile'}'s, portable kernels, here ({here['capability']}) and under qemu-x86_64 -cpu {qemu}")
    print("\n| part | here | emulated | s here | s emulated |\n|---|---|---|---:|---:|")
    for p in here['hashes']: print(f"| {p} | {here['hashes'][p]} | {there['hashes'][p]} | {here['seconds'][p]:.1f} | {there['seconds'][p]:.1f} |")
    same = sum(here['hashes'][p] == there['hashes'][p] for p in here['hashes'])
    print(f"\n{same} of {len(here['hashes'])} parts the same bytes under the emulated CPU"); return 0 if same == len(here['hashes']) else 1

if __name__ == '__main__':
    sys.exit(main())
