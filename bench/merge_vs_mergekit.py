#!/usr/bin/env python
"""`fusion-nb merge` against mergekit's `mergekit-yaml` on the same mergekit configs and the same models (issue 29).

Builds a random Llama-architecture base model in bfloat16 and three fine-tune stand-ins (base + Gaussian noise, the
stand-in task vectors), all with `save_pretrained` (sharded safetensors, a tokenizer beside them), then runs each config
(linear, task_arithmetic, ties, dare_ties, slerp, model_stock; linear with `dtype: float16`, a gradient slerp over
`slices:`, a passthrough stack) once with each tool, each run a fresh subprocess:

- wall time of the whole command (start-up, reading, merging, writing);
- peak RSS of that subprocess (ru_maxrss of a wrapper's children: memory-mapped safetensors pages count, for both);
- the largest absolute difference between the two outputs over every tensor (float32).

The first six compute in float32 (`dtype: float32`) and write bfloat16 (`out_dtype: bfloat16`), on the CPU; the last three
take the dtype as mergekit's examples do. DARE draws random
masks: each tool its own (mergekit from torch's global generator, fusion_nb from a seeded per-tensor one), so its
difference is the size of the dropped entries, not an error. mergekit is run from a scratch environment outside this
repository (`/tmp/mk-venv/bin/mergekit-yaml`, or --mergekit); without it, only fusion_nb runs.

    /work/heavy python bench/merge_vs_mergekit.py                 # ~0.16B parameters (hidden 1024, 8 layers)
    /work/heavy python bench/merge_vs_mergekit.py --size 1b       # ~1.1B parameters (hidden 2048, 16 layers), the issue's target
    python bench/merge_vs_mergekit.py --size tiny --only linear   # a smoke run
"""
import argparse, json, os, resource, shutil, subprocess, sys, tempfile, time
from pathlib import Path

SIZES = {'tiny': dict(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000),
         'small': dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, vocab_size=32000),
         '1b': dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32, vocab_size=32000)}
NOISE = 0.002   # the fine-tunes' offset from the base, relative to a weight scale of ~0.02 (Llama's init std)

def configs(d: Path, layers: int = 8) -> dict:
    "The mergekit configs, run unchanged by both tools (`layers`: the models' layer count, for the `slices:` ones)."
    b, (e1, e2, e3) = str(d/'base'), [str(d/f'ft{i}') for i in (1, 2, 3)]
    half = layers // 2
    common = dict(dtype='float32', out_dtype='bfloat16')
    w = lambda *ws, **p: [dict(model=m, parameters=dict(weight=x, **p)) for m, x in zip((e1, e2, e3), ws)]
    return {
        'linear': dict(merge_method='linear', models=w(0.5, 0.3, 0.2), **common),
        'task_arithmetic': dict(merge_method='task_arithmetic', base_model=b, models=w(0.5, 0.3, 0.2), **common),
        'ties': dict(merge_method='ties', base_model=b, models=w(1.0, 0.5, 0.3, density=0.5), parameters=dict(normalize=True), **common),
        'dare_ties': dict(merge_method='dare_ties', base_model=b, models=w(1.0, 0.5, 0.3, density=0.5), **common),
        'slerp': dict(merge_method='slerp', base_model=b, models=[dict(model=b), dict(model=e1)], parameters=dict(t=0.3), **common),
        'model_stock': dict(merge_method='model_stock', base_model=b, models=[dict(model=m) for m in (e1, e2, e3)], **common),
        # examples/linear.yml's habit: bfloat16 models merged with `dtype: float16` (one rounding, to float16)
        'linear_float16': dict(merge_method='linear', models=w(0.5, 0.3, 0.2), dtype='float16'),
        # examples/gradient-slerp.yml: one slice over every layer, t by filter as a gradient
        'gradient_slerp': dict(merge_method='slerp', base_model=b, dtype='bfloat16',
                               slices=[dict(sources=[dict(model=b, layer_range=[0, layers]), dict(model=e1, layer_range=[0, layers])])],
                               parameters=dict(t=[dict(filter='self_attn', value=[0, 0.5, 0.3, 0.7, 1]),
                                                  dict(filter='mlp', value=[1, 0.5, 0.7, 0.3, 0]), dict(value=0.5)])),
        # a passthrough stack (depth up-scaling's form): 1.5 × the layers
        'passthrough': dict(merge_method='passthrough', dtype='bfloat16',
                            slices=[dict(sources=[dict(model=b, layer_range=[0, layers])]),
                                    dict(sources=[dict(model=e1, layer_range=[half, layers])])])}

def build(d: Path, size: str):
    "The base and three fine-tune stand-ins, bfloat16, sharded as save_pretrained shards them, with a tokenizer."
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers
    cfg = LlamaConfig(**SIZES[size], num_key_value_heads=SIZES[size]['num_attention_heads'], max_position_embeddings=2048,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device('cpu'): base = LlamaForCausalLM(cfg).to(torch.bfloat16)
    n = sum(p.numel() for p in base.parameters())
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(cfg.vocab_size)}, unk_token='w0'))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token='w0', eos_token='w1')
    ref = {k: v.clone() for k, v in base.state_dict().items()}
    for i, name in enumerate(['base', 'ft1', 'ft2', 'ft3']):
        if i:
            g = torch.Generator().manual_seed(i)
            with torch.no_grad():
                for k, v in base.state_dict().items(): v.copy_(ref[k].float() + NOISE * torch.randn(v.shape, generator=g))
        base.save_pretrained(d/name, max_shard_size='1GB'); tok.save_pretrained(d/name)
    print(f"built a Llama of {n / 1e9:.2f}B parameters (bfloat16, {n * 2 / 2**30:.2f} GiB per model) and 3 fine-tune stand-ins", flush=True)
    return n

def timed(cmd: list, env: dict) -> tuple[float, float, int]:
    "(seconds, peak RSS in GiB, return code) of `cmd`, run under a fresh wrapper so that its ru_maxrss is this command's alone."
    wrap = ('import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]).returncode; '
            'print("MAXRSS", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r)')
    t = time.perf_counter()
    p = subprocess.run([sys.executable, '-c', wrap, *cmd], env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    line = [l for l in p.stdout.splitlines() if l.startswith('MAXRSS')]
    if p.returncode or not line: print(p.stdout[-2000:], p.stderr[-3000:], file=sys.stderr)
    kb, rc = (int(x) for x in line[-1].split()[1:]) if line else (0, 1)
    if rc: print(p.stderr[-3000:], file=sys.stderr)
    return dt, kb / 2**20, rc

def max_diff(a: Path, b: Path) -> float:
    "(largest |a − b| over every tensor of two merged folders (float32), the tensor where it is, the fraction of entries that differ)."
    from safetensors import safe_open
    def index(d):
        out = {}
        for f in sorted(d.glob('*.safetensors')):
            with safe_open(f, 'pt') as h: out.update({k: f for k in h.keys()})
        return out
    ia, ib = index(a), index(b)
    if set(ia) != set(ib): print(f"  tensors differ: {sorted(set(ia) ^ set(ib))[:5]}", file=sys.stderr); return float('inf'), None, 1.0
    m, where, n, differ = 0.0, None, 0, 0
    for k in ia:
        with safe_open(ia[k], 'pt') as h: x = h.get_tensor(k).float()
        with safe_open(ib[k], 'pt') as h: y = h.get_tensor(k).float()
        if x.shape != y.shape: return float('inf'), k, 1.0
        d = (x - y).abs(); n += d.numel(); differ += int((d > 0).sum())
        if float(d.max()) > m: m, where = float(d.max()), k
    return m, where, differ / max(n, 1)

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--size', choices=list(SIZES), default='small')
    ap.add_argument('--only', nargs='*', default=None, help='configs to run (default: all)')
    ap.add_argument('--mergekit', default='/tmp/mk-venv/bin/mergekit-yaml', help='the mergekit-yaml executable (skipped if absent)')
    ap.add_argument('--keep', default=None, help='build the models here and keep them (default: a temporary folder)')
    ap.add_argument('--threads', type=int, default=int(os.environ.get('OMP_NUM_THREADS', 2)), help='CPU threads for both tools')
    a = ap.parse_args(argv)
    d = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix='merge_vs_mergekit.'))
    env = {**os.environ, 'OMP_NUM_THREADS': str(a.threads), 'MKL_NUM_THREADS': str(a.threads), 'HF_HUB_OFFLINE': '1',
           'PYTHONPATH': str(Path(__file__).resolve().parents[1])}
    try:
        if not (d/'ft3'/'config.json').exists(): build(d, a.size)
        mk = a.mergekit if Path(a.mergekit).exists() else None
        if mk is None: print(f"mergekit not found at {a.mergekit}: only fusion_nb runs", flush=True)
        fnb = [sys.executable, '-c', 'import sys; from fusion_nb.reproduce.cli import main; sys.exit(main(sys.argv[1:]))']  # `fusion-nb`
        rows = []
        for name, cfg in configs(d, SIZES[a.size]['num_hidden_layers']).items():
            if a.only and name not in a.only: continue
            import yaml
            (d/f'{name}.yml').write_text(yaml.safe_dump(cfg, sort_keys=False))
            row = {'config': name}
            for tool, cmd in (('fusion_nb', fnb + ['merge', str(d/f'{name}.yml'), '-o', str(d/f'out_fnb_{name}'), '--no-progress']),
                              ('mergekit', None if mk is None else [mk, str(d/f'{name}.yml'), str(d/f'out_mk_{name}'), '--copy-tokenizer'])):
                if cmd is None: continue
                shutil.rmtree(d/f"out_{'fnb' if tool == 'fusion_nb' else 'mk'}_{name}", ignore_errors=True)
                t, rss, rc = timed(cmd, env)
                row.update({f'{tool} s': round(t, 1), f'{tool} peak RSS GiB': round(rss, 2), f'{tool} rc': rc})
                print(f"{name:>16} {tool:>9}: {t:7.1f} s, peak RSS {rss:5.2f} GiB, rc {rc}", flush=True)
            if mk is not None and row.get('fusion_nb rc') == 0 and row.get('mergekit rc') == 0:
                row['max |Δ|'], where, frac = max_diff(d/f'out_fnb_{name}', d/f'out_mk_{name}')
                row['entries that differ'] = f"{100 * frac:.3g}%"
                print(f"{name:>16} max |fusion_nb − mergekit| = {row['max |Δ|']:.3g} (in {where}); {100 * frac:.3g}% of entries differ", flush=True)
            for tool in ('fnb', 'mk'): shutil.rmtree(d/f'out_{tool}_{name}', ignore_errors=True)
            rows.append(row)
        import pandas as pd
        print(pd.DataFrame(rows).to_markdown(index=False))
    finally:
        if not a.keep: shutil.rmtree(d, ignore_errors=True)

if __name__ == '__main__':
    main()
