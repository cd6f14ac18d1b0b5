#!/usr/bin/env python
"""`evaluate`'s images/s against a bare forward loop over pre-processed tensors, in the same run (issue 16).

Both sides evaluate the same classifier (one vision encoder, the pretrained projection and a task's zero-shot
head) on the same test images of the profile's tasks, in batches of `--batch`:

- bare:     the images are decoded and preprocessed *before* the clock starts, the tensors put on the device;
            timed: the forward passes alone (the floor: a pipeline cannot beat it);
- evaluate: `fusion_nb.evaluation.evaluate` as experiments call it: encoder loaded, images decoded and
            preprocessed by its DataLoader (`--workers` processes, pinned memory on CUDA), forward passes,
            accuracy and loss; the zero-shot heads are cached from the warm-up, as in an experiment's later calls.

Printed: images/s of each and their ratio (goal ≥ 0.90: evaluation does not wait on Python preprocessing),
as medians over `--repeat` interleaved pairs (a shared machine's load moves both alike).

`--model profile` evaluates the profile's pretrained encoder; `--model vit-b32` a random-weight encoder of
CLIP ViT-B/32's shape (224 px, 12 layers of width 768) with the same images, which is where the paper
profiles spend their time: with the micro profile's one-layer 32-px encoder the forward pass is nearly free
and any preprocessing shows.

    python bench/eval_throughput.py --profile micro                      # the micro encoder, the profile's workers
    python bench/eval_throughput.py --profile micro --model vit-b32 --workers 0 2
    python bench/eval_throughput.py --profile clip-vit-b32 --images 2048 --workers 8   # on a GPU machine with the hub
"""
import argparse, statistics, tempfile, time
from pathlib import Path

import torch

from fusion_nb.evaluation import ZeroShotClassifier, evaluate, image_loader, task_head, _autocast
from fusion_nb.pools import PRETRAINED, ModelPool, TaskPool
from fusion_nb.reproduce.profiles import load_profile, prepare

def vit_b32_pool(task_pool, device, dtype, root:Path)->ModelPool:
    "A pool whose pretrained CLIP has ViT-B/32's vision tower (random weights) and a small text tower for the tasks' prompts."
    from fusion_nb.tiny.clip_factory import make_clip_dir
    words = [t.format(c) for name in task_pool.names for c in task_pool[name].class_names for t in task_pool[name].templates]
    d = make_clip_dir(root/'vit-b32', words, image_size=224, patch_size=32, hidden_size=768, intermediate_size=3072,
                      num_layers=12, num_heads=12, projection_dim=512, max_position_embeddings=77, seed=0)
    return ModelPool(d, {}, device, dtype)

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--profile', default='micro'); p.add_argument('--settings', default=None, help='settings.ini (default: the project\'s)')
    p.add_argument('--tasks', nargs='+', default=None, help="tasks (default: the profile's)")
    p.add_argument('--images', type=int, default=0, help='test images per task (0: the whole split)')
    p.add_argument('--batch', type=int, default=None, help="images per batch (default: the profile's batch_size)")
    p.add_argument('--workers', type=int, nargs='+', default=None, help="DataLoader workers, one measurement each (default: the profile's)")
    p.add_argument('--model', choices=('profile', 'vit-b32'), default='profile')
    p.add_argument('--autocast', default=None, help="'none', 'bfloat16' or 'float16' (default: the profile's)")
    p.add_argument('--repeat', type=int, default=3); p.add_argument('--threads', type=int, default=1, help='torch threads (CPU)')
    a = p.parse_args(argv)
    threads = torch.get_num_threads(); torch.set_num_threads(a.threads)
    try: return _run(a)
    finally: torch.set_num_threads(threads)   # leave a caller's (e.g. pytest's) thread count as it was

def _run(a):
    prof = prepare(load_profile(a.profile, settings=a.settings), build=False, progress=False, log=lambda *_: None)
    batch, autocast = a.batch or prof.batch_size, a.autocast or prof.autocast
    workers = a.workers if a.workers is not None else [prof.num_workers]
    tp = TaskPool.from_profile(prof, a.tasks)
    tmp = tempfile.TemporaryDirectory()
    mp = ModelPool.from_profile(prof, []) if a.model == 'profile' else vit_b32_pool(tp, prof.device, prof.dtype, Path(tmp.name))
    device, clip = mp.device, mp.clip
    encoder = mp.vision_model(PRETRAINED)
    data = {t: tp[t].load(max_samples=a.images, seed=prof.seed) for t in tp.names}
    n_images = sum(len(ds) for ds in data.values())
    # bare: every image preprocessed beforehand, on the device; only the forward passes are timed
    clfs = {t: ZeroShotClassifier(encoder, clip.visual_projection, clip.logit_scale, task_head(mp, tp[t])).to(device) for t in data}
    ready = {t: [b['pixel_values'].to(device) for b in image_loader(ds, mp.processor, batch)] for t, ds in data.items()}

    @torch.no_grad()
    def bare():
        for t, batches in ready.items():
            for x in batches:
                with _autocast(device, autocast): clfs[t](x).argmax(-1)
        if device.type == 'cuda': torch.cuda.synchronize()
    def run_evaluate(w):
        evaluate({'m': PRETRAINED}, mp, tp, batch_size=batch, max_samples=a.images, num_workers=w, seed=prof.seed,
                 progress=False, autocast=autocast)
        if device.type == 'cuda': torch.cuda.synchronize()
    def timed(fn):
        t0 = time.perf_counter(); fn(); return time.perf_counter() - t0

    bare(); run_evaluate(workers[0])   # warm-up: heads cached, files in the page cache, kernels compiled
    rows = [{'bare': timed(bare), **{w: timed(lambda: run_evaluate(w)) for w in workers}} for _ in range(a.repeat)]
    t_bare = statistics.median(r['bare'] for r in rows)
    cfg = encoder.config
    print(f"profile {prof.name}, model {a.model} (vision: {cfg.num_hidden_layers} layers, width {cfg.hidden_size}, "
          f"{cfg.image_size} px), device {device}, autocast {autocast}, {torch.get_num_threads()} torch thread(s)")
    print(f"{n_images} test images of {len(data)} task(s), batches of {batch}; medians of {a.repeat} interleaved repeat(s)")
    print(f"bare forward loop (pre-processed tensors) : {n_images / t_bare:10.1f} images/s")
    out = {'bare': n_images / t_bare}
    for w in workers:
        ratio = statistics.median(r['bare'] / r[w] for r in rows)
        print(f"evaluate, {w} DataLoader worker(s)        : {n_images / statistics.median(r[w] for r in rows):10.1f} images/s "
              f"= {ratio:.2f} of bare (goal ≥ 0.90)")
        out[f'evaluate_w{w}'], out[f'ratio_w{w}'] = n_images / statistics.median(r[w] for r in rows), ratio
    tmp.cleanup()
    return out

if __name__ == '__main__': main()
