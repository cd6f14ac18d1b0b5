#!/usr/bin/env python
"""Estimated GPU-hours of paper 000's whole ViT-B/32 table (every row, full test sets) on one H100 (issue 11, section 2).

Measured here (no GPU needed):
- per-image preprocessing time: decode a JPEG and run `transformers.CLIPImageProcessor` (openai's CLIP
  settings: resize 224, centre crop, normalise), on this machine's CPU, one core;
- operator count of one adaptation step (layer-wise AdaMerging, 8 tasks x 16 images, forward +
  backward + merge), before (eight forwards in one graph) and after (one batched forward), with a
  `TorchDispatchMode` counter; every operator is one kernel launch plus Python/dispatcher work on a GPU;
- FLOPs of one evaluation image and of one adaptation step with `torch.utils.flop_counter.FlopCounterMode`.
Everything model-sized runs on the `meta` device (shapes only), so the count is exact and free.

Assumed (stated, override on the command line): H100 SXM float32 throughput (the library adapts and
evaluates in float32; TF32 is off by default in torch: 67 TFLOP/s peak, `--efficiency` of it achieved),
per-operator overhead `--op-us` microseconds, `--workers` DataLoader processes decoding images in
parallel with the GPU (today: 0, i.e. on the main thread, serially), test-set sizes of the eight tasks
(`TEST_IMAGES`, the tanganke/* test splits) and paper 000's budgets (`fusion_nb.reproduce.rows.FUSION_SETTINGS`).

    python bench/gpu_cost_model.py
    python bench/gpu_cost_model.py --efficiency 0.3 --op-us 15 --workers 12
"""
import argparse, io, sys, time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from transformers import CLIPImageProcessor, CLIPVisionConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fusion_nb.methods.adamerging import adamerging_backward, adamerging_step_loss
from fusion_nb.reproduce.rows import FUSION_SETTINGS, ROW_LABELS
from tta_memory import SHAPES, TASKS, BATCH, Data, random_models, stacked

TEST_IMAGES = {'sun397': 19850, 'stanford-cars': 8041, 'resisc45': 6300, 'eurosat': 2700, 'svhn': 26032,
               'gtsrb': 12630, 'mnist': 10000, 'dtd': 1880}   # test splits of tanganke/<task>
H100_FP32_FLOPS = 67e12

class OpCounter(TorchDispatchMode):
    "Counts ATen operators (one kernel launch each on a GPU)."
    def __init__(self): super().__init__(); self.ops = Counter()
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

def preprocessing_seconds(n=200, side=256):
    "Seconds per image to decode a `side`² JPEG and run the CLIP image processor (best of 3 rounds of n)."
    from PIL import Image
    proc = CLIPImageProcessor(crop_size={'height': 224, 'width': 224}, size={'shortest_edge': 224},
                              image_mean=[0.4815, 0.4578, 0.4082], image_std=[0.2686, 0.2613, 0.2758])
    rng = np.random.default_rng(0)
    blobs = []
    for _ in range(20):
        buf = io.BytesIO(); Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(buf, 'JPEG', quality=90)
        blobs.append(buf.getvalue())
    best = float('inf')
    for _ in range(3):
        t = time.perf_counter()
        for i in range(n): proc(images=Image.open(io.BytesIO(blobs[i % 20])).convert('RGB'), return_tensors='pt')
        best = min(best, (time.perf_counter() - t) / n)
    return best

def step_counts(cfg, version):
    "(operators, FLOPs) of one layer-wise AdaMerging step on the meta device."
    data = Data(cfg, "meta"); st = stacked(*random_models(cfg, "meta"), "before" if version == "before" else "after")
    batches = {t: torch.zeros(BATCH, 3, cfg.image_size, cfg.image_size, device='meta') for t in TASKS}
    coef = nn.Parameter(torch.full((len(TASKS), len(st.keys)), 0.3, device='meta'))
    with OpCounter() as ops, FlopCounterMode(display=False) as flops:
        if version == 'before': adamerging_step_loss(st, coef, data, batches).backward()
        else: adamerging_backward(st, coef, data, batches, tasks_per_forward=len(TASKS))
    return sum(ops.ops.values()), flops.get_total_flops()

def eval_counts(cfg, images=64):
    "(operators per batch of `images`, FLOPs per image) of an evaluation forward."
    data = Data(cfg, 'meta')
    x = torch.zeros(images, 3, cfg.image_size, cfg.image_size, device='meta')
    with torch.no_grad(), OpCounter() as ops, FlopCounterMode(display=False) as flops: data.logits(TASKS[0], x)
    return sum(ops.ops.values()), flops.get_total_flops() / images

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--efficiency', type=float, default=0.4, help='fraction of the 67 TFLOP/s float32 peak achieved (assumption)')
    ap.add_argument('--op-us', type=float, default=10., help='microseconds of launch + Python overhead per operator (assumption)')
    ap.add_argument('--workers', type=int, default=8, help='DataLoader workers decoding in parallel after the change (assumption)')
    ap.add_argument('--eval-batch', type=int, default=64)
    a = ap.parse_args(argv)
    cfg = CLIPVisionConfig(**SHAPES['B/32'])
    s = FUSION_SETTINGS
    pre = preprocessing_seconds()
    ops_before, step_flops = step_counts(cfg, 'before')
    ops_after, step_flops_after = step_counts(cfg, 'after')
    eval_ops, eval_flops = eval_counts(cfg, a.eval_batch)
    flops_per_s = H100_FP32_FLOPS * a.efficiency
    print(f"measured: preprocessing {pre * 1e3:.2f} ms/image (JPEG 256² decode + CLIPImageProcessor, one CPU core of this machine)")
    print(f"measured: one layer-wise AdaMerging step (8 tasks x {BATCH}): {ops_before} operators before, {ops_after} after; "
          f"{step_flops / 1e12:.2f} TFLOP ({step_flops_after / 1e12:.2f} after)")
    print(f"measured: evaluation {eval_flops / 1e9:.2f} GFLOP/image, {eval_ops} operators per batch of {a.eval_batch}")
    print(f"assumed: H100 float32 {H100_FP32_FLOPS / 1e12:.0f} TFLOP/s x {a.efficiency} = {flops_per_s / 1e12:.1f} TFLOP/s; "
          f"{a.op_us} µs per operator; decoding today on the main thread, after on {a.workers} workers overlapped with the GPU")
    test_images = sum(TEST_IMAGES.values())
    # adaptation steps per row: (steps, forward/backward passes per step)
    tta = {'adamerging_task_wise': (s['adamerging_steps'], 1), 'adamerging_layer_wise': (s['adamerging_steps'], 1),
           'concrete_task_arithmetic': (s['concrete_ta_steps'], 1),
           'concrete_adamerging_layer_wise': (s['concrete_lw_steps'], 2), 'weight_ensembling_moe': (s['wemoe_steps'], 1)}
    extra_passes = {'concrete_adamerging_layer_wise': s['adamerging_steps']}   # the AdaMerging stage after the mask
    rows = list(ROW_LABELS)
    total = {'today': 0., 'after': 0.}
    print(f"\n{'row':34} {'today (s)':>10} {'after (s)':>10}")
    for row in rows:
        t = {}
        for version in ('today', 'after'):
            ops = ops_before if version == 'today' else ops_after
            gpu_eval = test_images * eval_flops / flops_per_s + (test_images / a.eval_batch) * eval_ops * a.op_us * 1e-6
            cpu_eval = test_images * pre / (1 if version == 'today' else a.workers)
            secs = gpu_eval + cpu_eval if version == 'today' else max(gpu_eval, cpu_eval)
            if row in tta:
                steps, passes = tta[row]
                n = steps * passes + extra_passes.get(row, 0)
                if row == 'weight_ensembling_moe': ops_row = ops_before   # per-task forwards either way (routing depends on the batch)
                else: ops_row = ops
                gpu = n * (step_flops / flops_per_s + ops_row * a.op_us * 1e-6)
                cpu = n * len(TASKS) * BATCH * pre / (1 if version == 'today' else a.workers)
                secs += gpu + cpu if version == 'today' else max(gpu, cpu)
            if row in ('fisher_merging', 'regmean'):   # 256 labelled images per task: forward (+ backward for Fisher)
                secs += len(TASKS) * s['fisher_examples'] * (pre + 3 * eval_flops / flops_per_s)
            t[version] = secs; total[version] += secs
        print(f"{ROW_LABELS[row]:34} {t['today']:10.0f} {t['after']:10.0f}")
    for version in ('today', 'after'):
        h = total[version] / 3600
        print(f"B/32 table, {version}: {h:.2f} GPU-hours on one H100" + (f" — {'under' if h < 1 else 'OVER'} the one-GPU-hour target" if version == 'after' else ''))

if __name__ == '__main__': main()
