#!/usr/bin/env python
"""Memory and time of streaming merges at ViT-B/32 scale (issue 5).

Builds nine `CLIPVisionModel` checkpoints with the real ViT-B/32 vision config (random weights made
locally, ~88M parameters, ~350 MB each): one "pretrained" and eight "experts". Each measurement runs in
its own subprocess, so its peak memory is its own. Measured, in the same run:

- probe:       read every tensor of every checkpoint once (LazyStateDict) and sum it — the floor;
- baseline:    load all nine models fully into memory, then merge with task arithmetic in memory;
- task_arithmetic, ties_tensor, ties_model: the library's streaming merges (fusion_nb.merge);
- any other declared method named with --methods, run with its `papers['sota']` settings (issue 28's rows); a method
  that merges at most m experts (nuslerp: 2) gets the first m.

Peak *anonymous* memory is RssAnon from /proc/self/status (file-backed pages of memory-mapped
safetensors do not count: the kernel can drop them at will). Linux keeps no high-water mark of RssAnon
(VmHWM counts file-backed pages too), so a thread samples it every 5 ms (and once more at the end); the
figure is that peak minus the process's RssAnon just before the measured work started (Python, torch and
the lazy state dicts' headers). A 350 MB tensor takes far longer than 5 ms to allocate and fill, so the
sampling misses no model-sized peak. Before measuring, the checkpoints are read once (untimed) so that
every measurement finds them in the page cache and none pays for the disk alone.

Goals: every streaming method peaks under 3x one model's size; task arithmetic takes at most 4x the
probe's time.

    python bench/merge_memory.py            # full ViT-B/32 scale (≈3.2 GB of checkpoints in a temp folder)
    python bench/merge_memory.py --small    # a tiny config, for a quick smoke run
    python bench/merge_memory.py --keep /tmp/b32 --repeat 3   # keep the checkpoints; best time of 3 runs each
    python bench/merge_memory.py --methods breadcrumbs sce pcb_merging   # also these declared methods (their sota rows' settings;
                                    # a task-conditional method's peak includes building one task's model, .for_task)
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, threading, time
from pathlib import Path

B32 = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=224, patch_size=32)
SMALL = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
EXPERTS = [f'task{i}' for i in range(8)]
# --methods: hyperparameters the bench changes from the defaults (memory does not depend on them; time does)
BENCH_HP = {'wudi_merging': {'steps': 1}}   # WUDI: 1 Adam step per layer instead of 300 (its memory is one step's)

def rss_anon_bytes():
    for line in open('/proc/self/status'):
        if line.startswith('RssAnon:'): return int(line.split()[1]) * 1024
    raise RuntimeError('RssAnon not in /proc/self/status')

class PeakSampler:
    "Samples RssAnon every `interval` seconds in a thread; `.peak` is the maximum seen."
    def __init__(self, interval=0.005): self.interval, self.peak, self._stop = interval, rss_anon_bytes(), threading.Event()
    def _run(self):
        while not self._stop.is_set(): self.peak = max(self.peak, rss_anon_bytes()); time.sleep(self.interval)
    def __enter__(self): self._t = threading.Thread(target=self._run, daemon=True); self._t.start(); return self
    def __exit__(self, *a): self._stop.set(); self._t.join(); self.peak = max(self.peak, rss_anon_bytes())

def build(folder: Path, cfg: dict):
    import torch
    from transformers import CLIPVisionConfig, CLIPVisionModel
    from fusion_nb.checkpoints import save_vision_model
    config = CLIPVisionConfig(**cfg)
    torch.manual_seed(0)
    base = CLIPVisionModel(config).state_dict()
    save_vision_model(base, folder/'pretrained', config)
    for i, name in enumerate(EXPERTS):
        g = torch.Generator().manual_seed(i + 1)
        save_vision_model({k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in base.items()}, folder/name, config)
        print(f'built {name}', flush=True)

def warm_cache(folder: Path):
    "Read every checkpoint file once, so that the measurements all start from the page cache."
    for f in sorted(folder.glob('*/model.safetensors')):
        with open(f, 'rb') as h:
            while h.read(1 << 26): pass

def measure(folder: Path, what: str):
    "Run one measurement in this process; print a JSON line."
    import torch
    torch.set_num_threads(2)
    from fusion_nb.checkpoints import vision_state_dict
    from fusion_nb.merge import MERGE_METHODS, task_arithmetic, ties_merging
    pre = vision_state_dict(folder/'pretrained')
    experts = {n: vision_state_dict(folder/n) for n in EXPERTS}
    model_bytes = pre.nbytes()
    start = rss_anon_bytes(); t0 = time.perf_counter()
    with PeakSampler() as s:
        if what == 'probe':
            total = 0.0
            for sd in [pre, *experts.values()]:
                for k in sd: total += float(sd[k].sum())  # touches every byte (tensors may be memory-mapped)
        elif what == 'baseline':
            full = [{k: sd[k].clone() for k in sd} for sd in [pre, *experts.values()]]  # own copies, as load_state_dict makes
            merged = {k: full[0][k] + 0.3 * sum(m[k] - full[0][k] for m in full[1:]) for k in full[0]}
        elif what == 'task_arithmetic': merged = task_arithmetic(pre, experts, scaling_factor=0.3, progress=False)
        elif what == 'ties_tensor': merged = ties_merging(pre, experts, trim_scope='tensor', progress=False)
        elif what == 'ties_model': merged = ties_merging(pre, experts, trim_scope='model', progress=False)
        elif what in MERGE_METHODS:   # --methods: a declared method with its sota row's settings, changed by BENCH_HP
            m = MERGE_METHODS[what]
            hp = {**m.papers.get('sota', {}), **BENCH_HP.get(what, {})}
            merged = m(pre, dict(list(experts.items())[:m.max_experts or len(experts)]), progress=False, **hp)
            if hasattr(merged, 'for_task'): one = merged.for_task(EXPERTS[0])  # task-conditional: one task's model too
        else: raise SystemExit(f'unknown measurement {what!r}')
    print(json.dumps({'what': what, 'seconds': time.perf_counter() - t0, 'peak_bytes': s.peak - start, 'model_bytes': model_bytes, 'model_params': pre.numel()}), flush=True)

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--small', action='store_true', help='a tiny config: a smoke run in seconds')
    ap.add_argument('--keep', metavar='DIR', help='build/keep the checkpoints in DIR (reused if present)')
    ap.add_argument('--repeat', type=int, default=1, help='run each measurement N times: best time, worst peak')
    ap.add_argument('--methods', nargs='*', default=[], metavar='NAME', help="also measure these declared methods (their papers['sota'] settings)")
    ap.add_argument('--measure', nargs=2, metavar=('DIR', 'WHAT'), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure: return measure(Path(a.measure[0]), a.measure[1])
    if a.methods:
        from fusion_nb.merge import MERGE_METHODS
        bad = [n for n in a.methods if n not in MERGE_METHODS]
        if bad: raise SystemExit(f"unknown merge method(s) {bad}; see fusion_nb.merge.methods_table()")
    folder = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix='merge_memory_'))
    try:
        cfg = SMALL if a.small else B32
        if (folder/EXPERTS[-1]/'config.json').exists():  # reuse checkpoints kept by an earlier run, if they have this config
            have = json.loads((folder/EXPERTS[-1]/'config.json').read_text())
            if any(have.get(k) != v for k, v in cfg.items()): raise SystemExit(f'{folder} holds checkpoints of another config')
        else: build(folder, cfg)
        warm_cache(folder)
        results = {}
        for rep in range(max(1, a.repeat)):
            for what in ['probe', 'baseline', 'task_arithmetic', 'ties_tensor', 'ties_model', *a.methods]:
                out = subprocess.run([sys.executable, __file__, '--measure', str(folder), what], capture_output=True, text=True)
                if out.returncode: print(out.stderr[-2000:]); raise SystemExit(f'{what} failed')
                r = json.loads(out.stdout.strip().splitlines()[-1])
                if what in results:  # best time, worst peak over the repeats
                    r['seconds'] = min(r['seconds'], results[what]['seconds'])
                    r['peak_bytes'] = max(r['peak_bytes'], results[what]['peak_bytes'])
                results[what] = r
        mb = results['probe']['model_bytes']
        cfg = 'small' if a.small else 'ViT-B/32'
        print(f"\none model: {results['probe']['model_params'] / 1e6:.1f}M parameters, {mb / 1e9:.3f} GB ({cfg} vision config), 1 pretrained + {len(EXPERTS)} experts;"
              f" {max(1, a.repeat)} run(s) each: best time, worst peak\n")
        print(f"{'measurement':18s} {'seconds':>8s} {'x probe':>8s} {'peak RssAnon GB':>16s} {'x one model':>12s}")
        for what, r in results.items():
            print(f"{what:18s} {r['seconds']:8.2f} {r['seconds'] / results['probe']['seconds']:8.2f} {r['peak_bytes'] / 1e9:16.3f} {r['peak_bytes'] / mb:12.2f}")
        print()
        if a.small: print('(--small: fixed overheads dominate at this size; the goals below are judged at ViT-B/32 scale only)')
        for what in a.methods:
            if what in BENCH_HP: print(f"{what} ran with {BENCH_HP[what]}: its peak is the method's, its time is not")
        ok = True
        for what in ['task_arithmetic', 'ties_tensor', 'ties_model', *a.methods]:
            ratio = results[what]['peak_bytes'] / mb; ok &= ratio < 3
            print(f"goal: {what} peak < 3x one model: {ratio:.2f}x  {'PASS' if ratio < 3 else 'FAIL'}")
        tr = results['task_arithmetic']['seconds'] / results['probe']['seconds']; ok &= tr <= 4
        print(f"goal: task_arithmetic time <= 4x probe: {tr:.2f}x  {'PASS' if tr <= 4 else 'FAIL'}")
        return 0 if ok or a.small else 1
    finally:
        if not a.keep: shutil.rmtree(folder, ignore_errors=True)

if __name__ == '__main__':
    raise SystemExit(main())
