"""Time one `fusion-nb reproduce` run: per stage (benchmark build, each zoo, each experiment) and to the first table.

    python bench/reproduce_time.py --profile micro               # a fresh copy of this checkout (no data: builds it)
    python bench/reproduce_time.py --profile tiny --root .       # this project as it is (built data is reused)
    python bench/reproduce_time.py --profile micro --root R --pair 01 04   # --jobs 2 (1 thread each) vs --jobs 1 (2 threads)
    python bench/reproduce_time.py --profile tiny --schedule R/outputs     # a finished run's seconds, replayed in other orders

It reads the run's own records: the build's `manifest.json` timings, the `seconds` every cached build (zoo) records per
item, each experiment's `inputs.json` (`seconds`, `finished`), and the time each log line arrived. Issue 30, item 3.
"""
from __future__ import annotations
import argparse, datetime, json, os, platform, re, shutil, subprocess, sys, tempfile, time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

def fresh_copy(dest:Path)->Path:
    "The checkout's files git knows of (tracked, and untracked ones not ignored), without data built from them."
    files = subprocess.run(['git', 'ls-files', '-z', '-co', '--exclude-standard'], cwd=REPO, check=True,
                           stdout=subprocess.PIPE).stdout.decode().split('\0')
    for f in filter(None, files):
        src = REPO/f
        if src.is_file() and not src.is_symlink(): (dest/f).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(src, dest/f)
    return dest

def cli(root:Path, *args:str, output_root:Path|None=None)->list[str]:
    "The `fusion-nb` command on `root`'s package, and the environment it runs in."
    return [sys.executable, '-c', 'import sys; from fusion_nb.reproduce.cli import main; sys.exit(main())', *args,
            *(['--output-root', str(output_root)] if output_root else [])]

def env_for(root:Path, threads:int|None=None)->dict:
    "The environment a run on `root` computes in: offline, log lines, the runner's `compute_env` (also for notebooks run here by papermill)."
    from fusion_nb.core import compute_env
    env = {**compute_env(), 'FUSION_NB_ROOT': str(root), 'PYTHONPATH': str(root), 'FUSION_NB_PROGRESS': 'lines',
           'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1'}
    if threads: env['OMP_NUM_THREADS'] = str(threads)
    return env

def run_logged(cmd:list[str], env:dict, cwd:Path)->tuple[int, list[tuple[float, str]], float]:
    "Run `cmd`, echoing each output line with the seconds since start; (exit status, stamped lines, wall seconds)."
    t0, stamped = time.time(), []
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        t = time.time() - t0; stamped.append((t, line.rstrip('\n'))); print(f"{t:8.1f}s  {line.rstrip()}", flush=True)
    return p.wait(), stamped, time.time() - t0

def pinned_hashes(root:Path)->set[str]:
    "SHA-256 of every file the checkout's pins hold (`pins/index.json`)."
    index = root/'pins'/'index.json'
    return {h for e in json.loads(index.read_text()).values() for h in e.get('files', {}).values()} if index.exists() else set()

def zoo_times(data:Path, pinned:set[str]=frozenset())->list[tuple[str, float, bool]]:
    """(what, seconds, restored) of every item a cached build recorded under `data` (manifests with per-item `seconds`).
    `restored`: the item, or its whole manifest, came from the pins: its seconds are the copy's, or (a manifest copied whole,
    e.g. the LLaVA zoo's) the training time recorded when it was pinned, not this run's."""
    import hashlib
    out = []
    for m in sorted(data.rglob('manifest.json')):
        try: man = json.loads(m.read_text())
        except ValueError: continue
        copied = hashlib.sha256(m.read_bytes()).hexdigest() in pinned
        for section, items in man.items():
            if isinstance(items, dict):
                out += [(f"{m.parent.relative_to(data)}/{n}", e['seconds'], copied or bool(e.get('pinned'))) for n, e in items.items()
                        if isinstance(e, dict) and isinstance(e.get('seconds'), (int, float))]
    return out

def report(root:Path, profile:str, output_root:Path, stamped:list, wall:float)->None:
    print(f"\n## Time per stage ({profile}, root {root}; load average at the end {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} CPUs)\n")
    ready = [t for t, l in stamped if re.match(r'\[build \w+\] ready after', l)]
    first_run = next((t for t, l in stamped if re.match(r'\[[^\]]+\] (running|up to date)', l)), None)
    print(f"| stage | seconds |\n|---|---:|")
    if ready or first_run is not None: print(f"| benchmark ready (prepare: check + build) | {(ready or [first_run])[0]:.1f} |")
    for build in sorted((root/'data').glob('*/manifest.json')):
        man = json.loads(build.read_text())
        for k, v in man.get('timings', {}).items(): print(f"| build {build.parent.name}: {k.removesuffix('_s')} (rebuilt now) | {v:.1f} |")
    for what, s, restored in zoo_times(root/'data', pinned_hashes(root)):
        if what.count('/') > 1:   # the benchmark's own manifest lists no per-item seconds
            print(f"| zoo {what}{' (restored from the pins, not trained in this run)' if restored else ''} | {s:.1f} |")
    done = {}
    for t, l in stamped:
        if (m := re.match(r'\[([^\]]+)\] done in', l)): done[m[1]] = t
    for inp in sorted((output_root/profile).glob('*/inputs.json')):
        rec = json.loads(inp.read_text())
        print(f"| experiment {inp.parent.name} | {rec.get('seconds', float('nan')):.1f} |")
    if done: print(f"\nfirst table: {min(done.values()):.1f} s after the start ({min(done, key=done.get)})")
    print(f"whole run: {wall:.1f} s ({len(done)} experiment(s) ran)")

def pair(root:Path, profile:str, a:str, b:str, threads:int)->None:
    "A and B one after the other with `threads` torch threads, then side by side with 1 thread each; wall times, ratio."
    env = env_for(root)
    subprocess.run([sys.executable, '-c', f"from fusion_nb.reproduce.profiles import load_profile, prepare; "
                    f"prepare(load_profile({profile!r}), progress=False)"], env=env, cwd=root, check=True)
    scratch = Path(tempfile.mkdtemp(prefix='pair-', dir=root))
    t0 = time.time()
    rc, _, seq = run_logged(cli(root, 'reproduce', '--profile', profile, '--only', a, b, '--force', '--jobs', '1', output_root=scratch/'seq'),
                            env_for(root, threads), root)
    if rc: sys.exit(f"one-by-one run failed (exit {rc})")
    rc, stamped, par = run_logged(cli(root, 'reproduce', '--profile', profile, '--only', a, b, '--force', '--jobs', '2',
                                      output_root=scratch/'par'), env_for(root), root)   # the runner's own side by side
    if rc: sys.exit(f"side-by-side run failed (exit {rc})")
    ends = [t for t, l in stamped if re.match(r'\[[^\]]+\] done in', l)]
    print(f"\n## Side by side ({profile}: {a}, {b}; load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)\n")
    print(f"| how | wall s |\n|---|---:|\n| one by one, {threads} threads each | {seq:.1f} |\n"
          f"| side by side (--jobs 2), 1 thread each | {par:.1f} (ends at {', '.join(f'{e:.1f}' for e in ends)}) |")
    print(f"\nratio one-by-one / side-by-side: {seq / par:.2f} (> 1: side by side is faster)")

def replay(seconds:dict[str, float], order:list[str], slots:int=2, start:float=0.)->tuple[float, float]:
    "(end of the run, first experiment done) when `order` is taken as slots free up, each taking its recorded `seconds`."
    import heapq
    free, ends = [start] * slots, []
    for n in order:
        t = heapq.heappop(free); ends.append(t + seconds[n]); heapq.heappush(free, t + seconds[n])
    return max(ends), min(ends)

def schedule(outputs:Path, profile:str, slots:int, start:float)->None:
    "Replay a finished run's experiment seconds under notebook order and under quickest-first-then-longest-first."
    seconds = {p.parent.name: json.loads(p.read_text())['seconds'] for p in sorted((outputs/profile).glob('*/inputs.json'))}
    by_name = sorted(seconds)
    quick = min(seconds, key=seconds.get)
    longest = [quick, *sorted((n for n in seconds if n != quick), key=seconds.get, reverse=True)]
    print(f"## Replayed schedules ({profile}: {len(seconds)} experiments, {sum(seconds.values()):.0f} s of work, {slots} slots, "
          f"experiments from {start:g} s)\n\n| order | whole run s | first table s |\n|---|---:|---:|")
    for label, order in (('notebook order (the runner)', by_name), (f'{quick} first, then longest first', longest)):
        end, first = replay(seconds, order, slots, start)
        print(f"| {label} | {end:.0f} | {first:.0f} |")
    print(f"| lower bound (work / slots) | {start + sum(seconds.values()) / slots:.0f} | |")

def machine()->str:
    "The CPU a timing was taken on (model, cores this process may use, widest vector ISA): timings compare only on the same one."
    info = Path('/proc/cpuinfo').read_text() if Path('/proc/cpuinfo').exists() else ''
    model = next((l.split(':', 1)[1].strip() for l in info.splitlines() if l.startswith('model name')), platform.processor() or platform.machine())
    flags = set(next((l.split(':', 1)[1].split() for l in info.splitlines() if l.startswith('flags')), []))
    isa = next((f for f in ('avx512f', 'avx2', 'avx', 'sse4_1') if f in flags), 'unknown ISA')
    return f"{model}, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores, {isa}"

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--profile', default='micro')
    ap.add_argument('--root', type=Path, default=None, help='an existing project root (default: a fresh copy of this checkout)')
    ap.add_argument('--only', nargs='+', default=None, help='experiments to run (default: all the profile runs)')
    ap.add_argument('--keep', action='store_true', help='keep the fresh copy (its path is printed)')
    ap.add_argument('--pair', nargs=2, metavar=('A', 'B'), help='measure A and B side by side vs one by one instead')
    ap.add_argument('--threads', type=int, default=2, help='torch threads of the one-by-one run of --pair (default 2)')
    ap.add_argument('--jobs', type=int, default=None, help="experiments at a time (the runner's --jobs; default: its own, the cores)")
    ap.add_argument('--schedule', type=Path, default=None, metavar='OUTPUTS',
                    help="replay the experiment seconds of a finished run's outputs folder in other orders (runs nothing)")
    ap.add_argument('--start', type=float, default=0., help='--schedule: seconds before the first experiment starts (the benchmark check)')
    a = ap.parse_args(argv)
    if a.schedule: schedule(a.schedule, a.profile, a.jobs or 2, a.start); return 0
    root = a.root.resolve() if a.root else fresh_copy(Path(tempfile.mkdtemp(prefix='reproduce-time-')))
    print(f"project root: {root} (started {datetime.datetime.now().isoformat(timespec='seconds')}; machine: {machine()})", flush=True)
    try:
        if a.pair: pair(root, a.profile, *a.pair, a.threads); return 0
        out = Path(tempfile.mkdtemp(prefix='outputs-', dir=root)) if a.root else root/'outputs'
        rc, stamped, wall = run_logged(cli(root, 'reproduce', '--profile', a.profile, *(['--only', *a.only] if a.only else []),
                                           *(['--jobs', str(a.jobs)] if a.jobs else []), output_root=out), env_for(root), root)
        report(root, a.profile, out, stamped, wall)
        return rc
    finally:
        if not a.root and not a.keep: shutil.rmtree(root, ignore_errors=True)

if __name__ == '__main__':
    sys.exit(main())
