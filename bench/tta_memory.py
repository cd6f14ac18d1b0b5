#!/usr/bin/env python
"""Peak memory of ONE test-time adaptation step at ViT-B/32 and ViT-L/14 size, before and after issue 11 (section 2).

Models: random weights of `transformers.CLIPVisionConfig` for openai/clip-vit-base-patch32 (hidden 768,
12 layers, 12 heads, intermediate 3072, patch 32, image 224) and openai/clip-vit-large-patch14 (hidden
1024, 24 layers, 16 heads, intermediate 4096, patch 14, image 224); 8 tasks; 16 unlabelled images per
task; float32 (as the library adapts). Methods and the step measured:

- task-wise / layer-wise AdaMerging: one coefficient step;
- Concrete task arithmetic, Concrete layer-wise AdaMerging: one outer (mask) step — the larger of the
  bi-level pair, since its graph also holds the sampled mask;
- WE-MoE: one router step (routers with two hidden layers, batch reduction on, as during adaptation).

"before" runs the former code paths: one autograd graph over the eight tasks' losses, and WE-MoE's
MLP computing every expert's output for every token (`einsum` over experts); "after" runs the library:
`adamerging_backward` (merged weights detached into leaves, tasks in memory-budgeted chunks of one
batched forward each, backward per chunk) and `we_moe_backward` (backward per task, MLP weights
merged once per batch).

Without a GPU (the default here) the step runs on the `meta` device: shapes and dtypes only, no memory
and no arithmetic, so the FULL L/14 model costs nothing. Memory is then counted, not timed:

- resident: every distinct tensor storage held across the step (θ₀, the eight task vectors or MLP task
  vectors, the MergeData encoder module whose weights `functional_call` replaces, routers / mask
  logits with their Adam state and gradients, the leaves' gradients);
- saved: the tensors autograd saves for backward, counted through `torch.autograd.graph.saved_tensors_hooks`
  as they are packed and released when their graph is freed (a live high-water mark), storages shared
  with resident tensors not counted twice;
- peak estimate = resident + peak saved. Not counted: transient forward buffers that are not saved
  (at most a few activations of one layer), the CUDA context (~0.5 GiB), allocator fragmentation
  (typically 5–15 %), the text tower and heads (< 0.5 GiB). The verdict uses a 15 % margin.

With `--device cuda` the same step runs on the GPU with real random weights and reports
`torch.cuda.max_memory_allocated` too.

    python bench/tta_memory.py                 # meta device: B/32 and L/14, before and after
    python bench/tta_memory.py --device cuda   # on a GPU: measured peaks as well
    python bench/tta_memory.py --check         # also verify the meta count against real CPU tensors (tiny config)
"""
import argparse, gc, sys, weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import CLIPVisionConfig, CLIPVisionModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fusion_nb.methods.adamerging import (StackedTaskVectors, adamerging_backward, adamerging_step_loss,
                                          auto_tasks_per_forward, ACTIVATION_BUDGET)
from fusion_nb.methods.concrete import sample_mask
from fusion_nb.methods.data import entropy_loss, encoder_logits
from fusion_nb.methods.we_moe import Router, WeightEnsemblingMLP, WEMoEVisionModel, _layers, we_moe_backward

SHAPES = {
    'B/32': dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, patch_size=32, image_size=224, projection_dim=512),
    'L/14': dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, patch_size=14, image_size=224, projection_dim=768),
}
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, patch_size=8, image_size=32, projection_dim=16)
TASKS, BATCH, CLASSES, GPU_GIB, MARGIN = [f'task{i}' for i in range(8)], 16, 10, 80, 1.15
GiB = 2 ** 30

# ---------------------------------------------------------------- counting

def _sid(t): return t.untyped_storage()._cdata

class SavedBytes:
    "Live bytes of tensors saved for backward (distinct storages, resident ones excluded) and their high-water mark."
    def __init__(self, resident_ids): self.resident, self.live, self.peak, self.refs = resident_ids, 0, 0, {}
    class _Held:
        def __init__(self, t, owner):
            self.t, self.owner, sid = t, owner, _sid(t)
            self.sid = None if sid in owner.resident else sid
            if self.sid is not None:
                n = owner.refs.get(self.sid, 0)
                if n == 0: owner.live += t.untyped_storage().nbytes(); owner.peak = max(owner.peak, owner.live)
                owner.refs[self.sid] = n + 1
        def __del__(self):
            if self.sid is None: return
            self.owner.refs[self.sid] -= 1
            if self.owner.refs[self.sid] == 0: self.owner.live -= self.t.untyped_storage().nbytes()
    def hooks(self): return torch.autograd.graph.saved_tensors_hooks(lambda t: SavedBytes._Held(t, self), lambda h: h.t)

def storage_bytes(tensors):
    "Bytes of the distinct storages among `tensors`, and their ids."
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor): seen.setdefault(_sid(t), t.untyped_storage().nbytes())
    return sum(seen.values()), set(seen)

# ---------------------------------------------------------------- the pieces a step needs, on any device

class Heads(nn.Module):
    "Visual projection + one random zero-shot head per task (the shapes of `TaskHeads`)."
    def __init__(self, cfg, device):
        super().__init__()
        self.proj = nn.Linear(cfg.hidden_size, cfg.projection_dim, bias=False, device=device).requires_grad_(False)
        self.register_buffer('scale', torch.tensor(100., device=device))
        for t in TASKS: self.register_buffer(f'head_{t}', F.normalize(torch.randn(CLASSES, cfg.projection_dim, device=device), dim=-1))
    def forward(self, pooled, task): return self.scale * F.normalize(self.proj(pooled.float()), dim=-1) @ getattr(self, f'head_{task}').T

class Pool:
    def __init__(self, cfg): self.config = cfg

class Data:
    "The parts of `MergeData` a step uses."
    def __init__(self, cfg, device):
        self.device, self.model_pool, self.heads = torch.device(device), Pool(cfg), Heads(cfg, device)
        with torch.device(device): self.encoder = CLIPVisionModel(cfg).requires_grad_(False)
    def logits(self, task, x, params=None, encoder=None):
        return encoder_logits(encoder if encoder is not None else self.encoder, self.heads, task, x, params)

def random_models(cfg, device, n=len(TASKS)):
    "θ₀ and n experts θ₀ + small noise (plain state dicts, float32)."
    with torch.device(device): base = CLIPVisionModel(cfg).state_dict()
    experts = {t: {k: (v + 0.01 * torch.randn_like(v)) if v.is_floating_point() else v for k, v in base.items()} for t in TASKS[:n]}
    return base, experts

class PerTaskMerge(StackedTaskVectors):
    "The former merge: one multiply and one add per task and key (kept here to measure 'before')."
    def merge(self, coefficients, mask=None):
        c = coefficients if coefficients.ndim == 2 else coefficients[:, None].expand(len(self.tasks), len(self.keys))
        out = {}
        for j, k in enumerate(self.keys):
            delta = sum(c[i, j] * self.tv[t][k] for i, t in enumerate(self.tasks))
            out[k] = self.pre[k] + (delta if mask is None else mask[k] * delta)
        return out

def stacked(base, experts, version='after'):
    "StackedTaskVectors without its constructor's value checks (which read values: impossible on meta)."
    st = (PerTaskMerge if version == 'before' else StackedTaskVectors).__new__(PerTaskMerge if version == 'before' else StackedTaskVectors)
    st.tasks, st.keys = list(experts), [k for k, v in base.items() if v.is_floating_point()]
    st.pre = {k: base[k] for k in st.keys}
    st.stack = {k: torch.stack([e[k] for e in experts.values()]) - base[k] for k in st.keys}
    st.tv = {t: {k: st.stack[k][i] for k in st.keys} for i, t in enumerate(st.tasks)}
    return st

class EveryExpertMLP(WeightEnsemblingMLP):
    "The former WE-MoE MLP: every expert's output for every token, then routed (kept here to measure 'before')."
    def _linear(self, x, name, r):
        W, b = getattr(self, f'base_{name}_weight'), getattr(self, f'base_{name}_bias')
        tW, tb = getattr(self, f'tv_{name}_weight'), getattr(self, f'tv_{name}_bias')
        per_expert = torch.einsum('btd,kod->btko', x, tW) + tb
        return F.linear(x, W, b) + torch.einsum('btko,bk->bto', per_expert, r.expand(len(x), -1))

def we_moe_model(cfg, base, experts, device, mlp_class):
    with torch.device(device): model = WEMoEVisionModel(cfg)
    model.load_state_dict(base, strict=False)
    for l, layer in enumerate(_layers(model)):
        sub = lambda sd: {k: sd[f'encoder.layers.{l}.mlp.{k}'] for k in ('fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias')}
        layer.mlp = mlp_class(sub(base), [sub(e) for e in experts.values()], layer.mlp.activation_fn, 0.3, 2, True).to(device)
    model.requires_grad_(False)
    for layer in _layers(model): layer.mlp.router.requires_grad_(True)
    return model.train()

# ---------------------------------------------------------------- one step per method, before and after

def step(method, version, cfg, device):
    "Run one adaptation step; return (resident bytes, peak saved bytes, chunk size or None)."
    data = Data(cfg, device)
    base, experts = random_models(cfg, device)
    batches = {t: torch.randn(BATCH, 3, cfg.image_size, cfg.image_size, device=device) for t in TASKS}
    keep, extra, chunk = [*data.encoder.state_dict().values(), *data.heads.state_dict().values(), *batches.values()], 0, None
    if method == 'WE-MoE':
        mlp = EveryExpertMLP if version == 'before' else WeightEnsemblingMLP
        model = we_moe_model(cfg, base, experts, device, mlp)
        del base, experts
        routers = [p for p in model.parameters() if p.requires_grad]
        keep += [*model.state_dict().values()]
        extra = 3 * sum(p.numel() * p.element_size() for p in routers)   # gradient + Adam's two moments
        resident, ids = storage_bytes(keep)
        saved = SavedBytes(ids)
        with saved.hooks():
            if version == 'before': sum(entropy_loss(data.logits(t, x, encoder=model)) for t, x in batches.items()).backward()
            else: we_moe_backward(model, data, batches)
        return resident + extra, saved.peak, (1 if version == 'after' else None)   # after: one task per forward
    st = stacked(base, experts, version)
    del base, experts
    keep += [*st.pre.values(), *st.stack.values()]
    model_bytes = sum(v.numel() * v.element_size() for v in st.pre.values())
    layer_wise = method in ('layer-wise AdaMerging', 'Concrete layer-wise AdaMerging')
    coef = nn.Parameter(torch.full((len(TASKS), len(st.keys)) if layer_wise else (len(TASKS),), 0.3, device=device))
    mask, logits = None, None
    if method.startswith('Concrete'):
        logits = {k: nn.Parameter(torch.zeros_like(st.pre[k])) for k in st.keys}
        keep += list(logits.values()); extra += 3 * model_bytes        # logits' gradient + Adam's two moments
        if method == 'Concrete task arithmetic': coef.requires_grad_(False)
    if version == 'after': extra += model_bytes                          # the leaves' gradients
    resident, ids = storage_bytes(keep)
    saved = SavedBytes(ids)
    with saved.hooks():
        if logits is not None: mask = sample_mask(logits, 0.5)
        if version == 'before': adamerging_step_loss(st, coef, data, batches, mask).backward()
        else:
            chunk = auto_tasks_per_forward(data, BATCH, len(TASKS))
            adamerging_backward(st, coef, data, batches, mask, chunk)
    return resident + extra, saved.peak, chunk

METHODS = ['task-wise AdaMerging', 'layer-wise AdaMerging', 'Concrete task arithmetic', 'Concrete layer-wise AdaMerging', 'WE-MoE']

def measure(method, version, cfg, device):
    if device.startswith('cuda'):
        gc.collect(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        try: r, s, c = step(method, version, cfg, device); cuda = torch.cuda.max_memory_allocated()
        except torch.cuda.OutOfMemoryError: r, s, c, cuda = float('nan'), float('nan'), None, float('inf')
        gc.collect(); torch.cuda.empty_cache()
        return r, s, c, cuda
    r, s, c = step(method, version, cfg, device)
    return r, s, c, None

def attention_matrix_bytes(cfg, images):
    "Bytes of the softmax attention matrices of `images` images in every layer (float32)."
    tokens = (cfg.image_size // cfg.patch_size) ** 2 + 1
    return cfg.num_hidden_layers * images * cfg.num_attention_heads * tokens ** 2 * 4

def check_meta_against_cpu():
    """Meta counts vs real CPU tensors on a tiny config: resident bytes are equal; the saved bytes on meta
    exceed the CPU's by at most the attention matrices (meta runs SDPA's math path, which saves them; CPU
    and CUDA kernels save only the output and its log-sum-exp), so meta is an upper bound."""
    cfg = CLIPVisionConfig(**TINY)
    for m in METHODS:
        for v in ('before', 'after'):
            torch.manual_seed(0)
            (rm, sm, _), (rc, sc, c) = step(m, v, cfg, 'meta'), step(m, v, cfg, 'cpu')
            images = BATCH * (len(TASKS) if v == 'before' else 1 if m == 'WE-MoE' else (c or len(TASKS)))
            assert rm == rc and 0 <= sm - sc <= attention_matrix_bytes(cfg, images), (m, v, rm, rc, sm, sc)
            print(f"check {m:32} {v:7} resident {rm} = {rc}; saved meta {sm} >= cpu {sc} (attention matrices <= {attention_matrix_bytes(cfg, images)})")

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--device', default='meta', help="'meta' (count, default) or 'cuda' (also measure)")
    ap.add_argument('--shapes', nargs='*', default=list(SHAPES))
    ap.add_argument('--check', action='store_true', help='first check the meta count against real CPU tensors')
    a = ap.parse_args(argv)
    if a.check: check_meta_against_cpu()
    print(f"one adaptation step, {len(TASKS)} tasks x {BATCH} images, float32; ACTIVATION_BUDGET = {ACTIVATION_BUDGET / GiB:.0f} GiB; device {a.device}")
    print(f"{'shape':5} {'method':32} {'version':7} {'resident':>9} {'saved':>9} {'estimate':>9} {'chunk':>5}" + ('  cuda peak' if a.device.startswith('cuda') else '') + f"  fits {GPU_GIB} GB (x{MARGIN})")
    for shape in a.shapes:
        cfg = CLIPVisionConfig(**SHAPES[shape])
        for m in METHODS:
            for v in ('before', 'after'):
                r, s, c, cuda = measure(m, v, cfg, a.device)
                est = r + s
                fits = (cuda if cuda is not None else est * MARGIN) <= GPU_GIB * 1e9
                print(f"{shape:5} {m:32} {v:7} {r / GiB:8.1f}G {s / GiB:8.1f}G {est / GiB:8.1f}G {c if c else 'all':>5}"
                      + (f"  {cuda / GiB:8.1f}G" if cuda is not None else '') + f"  {'yes' if fits else 'NO'}")

if __name__ == '__main__': main()
