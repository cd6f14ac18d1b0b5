"""Which torch operation makes experiment 10's NeuLig compute other bits on another CPU: every operation's output, hashed.

    python bench/portable_trace.py trace --setting semi-supervised --steps 2 --out T.jsonl        # this CPU, portable kernels
    python bench/portable_trace.py trace --qemu Cascadelake-Server --out T_intel.jsonl         # the same under QEMU's Intel
    python bench/portable_trace.py diff A.jsonl B.jsonl                                       # the first operation that differs
    python bench/portable_trace.py only A.jsonl B.jsonl        # operations (with their shapes) A runs and B never does
    python bench/portable_trace.py probe --set MKL_CBWR=AVX2 --qemu Skylake-Client --out P.json   # some kernels' bytes, other settings
    python bench/portable_trace.py compare P0.json P1.json ...     # which kernels of each probe differ from the first's

Experiment 10 runs on `PORTABLE_KERNELS` (notebook 92), and on two CPUs (an Intel Xeon, an AMD EPYC, both AVX-512) its
supervised NeuLig, RegMean, AdaMerging and WE-MoE give the same bytes while its semi-supervised NeuLig does not (guide 04).
`trace` trains Portland for `--steps` steps on the profile's zoo, in a fresh process started with the portable kernels
(optionally under `qemu-x86_64 -cpu MODEL`, which reports another vendor's CPUID, cache sizes included), and writes one
line per aten operation — its index, name, input shapes and a hash of its outputs' bytes — under a
`TorchDispatchMode` (forward, backward and Adam alike). `diff` walks two traces in step: the first operation whose
inputs agree (its predecessors' outputs do) and whose output does not is the one that rounds by CPU. Issue 48 / 47.
"""
from __future__ import annotations
import argparse, collections, json, os, shutil, subprocess, sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO/'bench')]
from portable_kernels import SETUP   # experiment 10's experts and NeuLig's budget, as the hashes of bench/portable_kernels.py see them

CHILD = SETUP + r"""
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
setting, steps, out = sys.argv[2], int(sys.argv[3]), sys.argv[4]

def digest(x):
    if not torch.is_tensor(x): return None
    t = x.detach()
    if t.layout != torch.strided: return None
    return hashlib.blake2b(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b'', digest_size=8).hexdigest()

class Trace(TorchDispatchMode):
    def __init__(self, f): super().__init__(); self.f, self.i = f, 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [tuple(a.shape) for a in tree_flatten((args, kwargs))[0] if torch.is_tensor(a)]
        fresh = func._overloadpacket.__name__ in ('empty', 'empty_strided', 'new_empty', 'new_empty_strided', 'empty_like')
        outs = [None if fresh else digest(o) for o in tree_flatten(out)[0] if torch.is_tensor(o)]   # empty: uninitialised bytes
        self.f.write(json.dumps([self.i, str(func), ins, outs]) + '\n'); self.i += 1
        return out

with open(out, 'w') as f, Trace(f) as mode:
    neulig(pre, experts, data=data, setting=setting, steps=steps, lr=B['neulig_lr'], batch_size=B['neulig_batch_size'],
           seed=P.seed, progress=False)
print(json.dumps({'capability': torch.backends.cpu.get_cpu_capability(), 'operations': mode.i}))
"""

def run_child(code:str, args:list[str], settings:list[str]=(), qemu:str|None=None)->dict:
    "Run `code` in a fresh process on the portable kernels, `settings` (K=V; K= unsets K) over them, under `qemu-x86_64 -cpu qemu` if given; its last line, as JSON."
    from fusion_nb.reproduce.runner import kernel_env
    env = {**kernel_env('portable', {**os.environ, 'PYTHONPATH': str(REPO), 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1',
                                     'OMP_NUM_THREADS': '1', 'TQDM_DISABLE': '1'}), **dict(s.split('=', 1) for s in settings)}
    env = {k: v for k, v in env.items() if v != ''}
    cmd = [sys.executable, '-c', code, *args]
    if qemu and not shutil.which('qemu-x86_64'): sys.exit("--qemu needs QEMU's user-mode emulator, qemu-x86_64 (Debian: apt-get install qemu-user)")
    if qemu: cmd = ['qemu-x86_64', '-cpu', qemu, *cmd]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    if r.returncode: sys.exit(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])

def trace(profile:str, setting:str, steps:int, out:Path, qemu:str|None=None)->dict:
    "Run the traced training in a fresh process on the portable kernels (under `qemu-x86_64 -cpu qemu` if given)."
    return run_child(CHILD, [profile, setting, str(steps), str(Path(out).resolve())], qemu=qemu)

PROBE = r"""
import hashlib, json, os, torch
torch.set_num_threads(1); g = torch.Generator().manual_seed(0)
h = lambda t: hashlib.blake2b(t.contiguous().view(torch.uint8).numpy().tobytes(), digest_size=6).hexdigest()
out = {}
for m, k, n in [(400, 128, 384), (400, 128, 128), (400, 128, 512), (400, 512, 128), (7, 128, 128), (64, 768, 128), (1000, 128, 10)]:
    a, b, c = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g), torch.randn(n, generator=g)
    out[f'mm {m}x{k}x{n}'] = h(a @ b); out[f'addmm {m}x{k}x{n}'] = h(torch.addmm(c, a, b)); out[f'mm aT {m}x{k}x{n}'] = h(a.t() @ torch.randn(m, n, generator=g))
out['bmm'] = h(torch.randn(8, 4, 50, 32, generator=g) @ torch.randn(8, 4, 32, 50, generator=g))
x = torch.randn(200_000, generator=g)
for f in ('exp', 'log', 'tanh', 'erf', 'sigmoid', 'rsqrt', 'sqrt', 'log1p', 'expm1'): out[f] = h(getattr(torch, f)(x.abs() + 0.1 if f in ('log', 'rsqrt', 'sqrt') else x))
out['softmax'] = h(torch.softmax(torch.randn(400, 512, generator=g), -1)); out['gelu'] = h(torch.nn.functional.gelu(x))
out['layer_norm'] = h(torch.nn.functional.layer_norm(torch.randn(400, 128, generator=g), (128,)))
print(json.dumps(out))
"""

def probe(settings:list[str], qemu:str|None=None)->dict:
    "Hashes of some kernels' outputs (matmuls at tiny's shapes, unary functions) in a fresh process: the portable kernels with `settings` (K=V) over them."
    return run_child('import fusion_nb.core\n' + PROBE, [], settings, qemu)   # fusion_nb.core: the portable sqrt, where FUSION_NB_PORTABLE_SQRT=1

def read(path:Path)->list[list]: return [json.loads(l) for l in Path(path).read_text().splitlines()]

def diff(a:Path, b:Path, context:int=3)->int:
    "Print the first operation whose output differs, with the operations before it, and how many differ in all."
    A, B = read(a), read(b)
    n = min(len(A), len(B))
    if len(A) != len(B): print(f"lengths differ: {len(A)} against {len(B)} operations")
    for i in range(n):
        if A[i][1] != B[i][1]: print(f"the sequences part at operation {i}: {A[i][1]} against {B[i][1]}"); return 1
        if A[i][3] != B[i][3]:
            print(f"first differing output at operation {i} of {n}:")
            for j in range(max(0, i - context), i + 1): print(f"  {'>' if j == i else ' '} {A[j][0]} {A[j][1]} in {A[j][2]}: {A[j][3]} / {B[j][3]}")
            bad = collections.Counter(A[j][1] for j in range(i, n) if A[j][3] != B[j][3])
            print(f"operations differing from there on: {sum(bad.values())} of {n - i}; by name: {dict(bad.most_common(8))}")
            return 1
    print(f"all {n} operations give the same bytes"); return 0

def only(a:Path, b:Path)->int:
    "Print the (operation, input shapes) that trace `a` runs and `b` never does."
    seen = {(r[1], json.dumps(r[2])) for r in read(b)}
    extra = collections.Counter((r[1], json.dumps(r[2])) for r in read(a) if (r[1], json.dumps(r[2])) not in seen)
    for (op, shapes), k in sorted(extra.items()): print(f"{k:6d} × {op} {shapes}")
    print(f"{len(extra)} operation/shape pairs of {a} are not in {b}"); return 0

def compare(paths:list[Path])->int:
    "Print, for each probe after the first, the kernels whose bytes differ from the first's."
    runs = [json.loads(Path(p).read_text()) for p in paths]
    name = lambda r: f"{r['qemu'] or 'this CPU'} {' '.join(r['set']) or '(portable)'}"
    print(f"against {name(runs[0])}:")
    for r in runs[1:]:
        bad = [k for k, v in r['hashes'].items() if runs[0]['hashes'].get(k) != v]
        print(f"  {name(r):55s} {len(bad):2d} of {len(r['hashes'])} differ" + (f": {', '.join(bad)}" if bad else ''))
    return 0

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest='cmd', required=True)
    t = sub.add_parser('trace'); t.add_argument('--profile', default='tiny'); t.add_argument('--setting', default='semi-supervised')
    t.add_argument('--steps', type=int, default=2); t.add_argument('--out', type=Path, required=True)
    t.add_argument('--qemu', help="a QEMU CPU model (`qemu-x86_64 -cpu help`): run the trace under its emulation")
    for name in ('diff', 'only'): s = sub.add_parser(name); s.add_argument('a', type=Path); s.add_argument('b', type=Path)
    p = sub.add_parser('probe'); p.add_argument('--set', nargs='*', default=[], help="K=V over the portable kernels (K= unsets K)")
    p.add_argument('--qemu'); p.add_argument('--out', type=Path, help='also write the hashes here (JSON)')
    c = sub.add_parser('compare'); c.add_argument('probes', type=Path, nargs='+')
    a = ap.parse_args(argv)
    if a.cmd == 'trace': print(trace(a.profile, a.setting, a.steps, a.out, a.qemu)); return 0
    if a.cmd == 'compare': return compare(a.probes)
    if a.cmd == 'probe':
        if bad := [s for s in a.set if '=' not in s]: ap.error(f"--set {' '.join(bad)}: expected K=V (or K= to unset K)")
        r = probe(a.set, a.qemu); print(json.dumps(r, indent=1))
        if a.out: a.out.write_text(json.dumps({'set': a.set, 'qemu': a.qemu, 'hashes': r}, indent=1))
        return 0
    return diff(a.a, a.b) if a.cmd == 'diff' else only(a.a, a.b)

if __name__ == '__main__':
    sys.exit(main())
