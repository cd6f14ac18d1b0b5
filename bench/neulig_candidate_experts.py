"""Build candidate experts for paper 001's seven tasks into a scratch folder (issue 48: the Gap claims) — bench only.

    python bench/neulig_candidate_experts.py OUT --steps-x 4          # the pinned CLIP, the zoo's recipe with 4x the fine-tuning steps
    python bench/diagnose_neulig.py gap --profile tiny --experts OUT/clip-vit-tiny_{task}   # measure them

Everything but the field changed is the tiny zoo's recipe (`zoo_config('tiny')`, seed 0, the zoo's threads); the package,
the pins and data/ are not touched.
"""
import argparse, dataclasses, sys, time
from pathlib import Path
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from fusion_nb.tiny.zoo import deterministic, finetune_expert, zoo_config
from fusion_nb.tiny.tasks import NEULIG_TASKS

ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
ap.add_argument('out'); ap.add_argument('--steps-x', type=float, default=1.0); ap.add_argument('--lr-x', type=float, default=1.0)
ap.add_argument('--threads', type=int, default=2); ap.add_argument('--tasks', nargs='*', default=list(NEULIG_TASKS))
a = ap.parse_args()
base = REPO/'data'/'tiny'
cfg = zoo_config('tiny')
cfg = dataclasses.replace(cfg, finetune_steps=round(cfg.finetune_steps * a.steps_x), finetune_lr=cfg.finetune_lr * a.lr_x)
print(cfg, flush=True)
with deterministic(a.threads):
    for t in a.tasks:
        dest = Path(a.out)/f'clip-vit-tiny_{t}'
        if (dest/'config.json').exists(): print('have', dest, flush=True); continue
        t0 = time.time()
        finetune_expert(base/'models'/'clip-vit-tiny', t, base/'datasets'/t, dest, cfg, seed=0, progress=False)
        print(t, round(time.time() - t0, 1), 's', flush=True)
