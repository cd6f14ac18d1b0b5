"""A candidate tiny CLIP pre-trained as open_clip does it (issue 48, paper 001's Gap claims) — bench only.

Since 2026-12-06 this is the zoo's own recipe (issue 48 adopted it: `fusion_nb.tiny.zoo.clip_optimizer` and
`clamp_temperature`, which this script now calls; seed 0 builds the pinned CLIP byte for byte). The script stays for the
records it made (the three builds the adoption was decided on, /work/scratch-48) and for `--init-scale`, which the zoo lacks.
The text below is the case as it was made before the adoption.

The tiny zoo's `pretrain_clip` applies AdamW's weight decay to every parameter, the learned temperature (`logit_scale`)
included, and never clamps it: after 8,000 steps the tiny CLIP's scale is 15.7, barely above its initial 14.3. The
reference training code (open_clip: its `main.py` gives parameters with ndim < 2 or named 'bn', 'ln', 'bias', 'logit_scale'
no weight decay — in transformers' CLIP every such parameter has ndim < 2, so the rule below is the same set; its `train.py` clamps `logit_scale` to ln 100 after every step) leaves the temperature free, and the pre-trained CLIP the
paper fuses has scale 100 (openai/clip-vit-base-patch32, `logit_scale` = 4.6052). This script runs the zoo's
recipe (`zoo_config('tiny')`, seed 0 unless `--seed`, two threads, the same corpus, sizes, steps, batch, learning rate and decay) with only
those two differences, then fine-tunes paper 001's seven experts from it with the zoo's expert recipe.

    python bench/neulig_candidate_clip.py OUT               # OUT/clip-vit-tiny, OUT/clip-vit-tiny_{task}; the package, pins and data/ untouched
    python bench/neulig_candidate_clip.py OUT --seed 1             # another build of the same recipe
    python bench/neulig_candidate_clip.py OUT --init-scale 100   # the temperature starts where CLIP's ends (100); the clamp only caps it (tiny: 44.6 at the end)
    python bench/diagnose_neulig.py gap --profile tiny --clip OUT/clip-vit-tiny --experts 'OUT/clip-vit-tiny_{task}'
"""
import argparse, json, math, shutil, sys, tempfile, time
from pathlib import Path
import torch
from transformers import AutoTokenizer, CLIPModel
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from fusion_nb.core import seed_everything, atomic_dir
from fusion_nb.pools import load_image_processor
from fusion_nb.tiny.clip_factory import make_clip_dir
from fusion_nb.tiny.finetune import pixel_values
from fusion_nb.tiny.tasks import NEULIG_TASKS, pretraining_corpus, vocabulary
from fusion_nb.tiny.zoo import clamp_temperature, clip_loss, clip_optimizer, deterministic, finetune_expert, zoo_config

ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
ap.add_argument('out'); ap.add_argument('--threads', type=int, default=2); ap.add_argument('--steps', type=int, default=0)
ap.add_argument('--seed', type=int, default=0, help='the training seed (corpus, initialisation, batches, experts), as FUSION_NB_BUILD_SEED sets it for a build')
ap.add_argument('--init-scale', type=float, default=0, help="the temperature's starting value (default: the zoo's, CLIP's 1/0.07); 100: start where CLIP ends")
a = ap.parse_args()
out, cfg, seed = Path(a.out), zoo_config('tiny'), a.seed
steps = a.steps or cfg.pretrain_steps
clip_dir = out/'clip-vit-tiny'
log = {'steps': steps, 'scale': [], 'loss': []}
with deterministic(a.threads):
    if not (clip_dir/'config.json').exists():
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            init = make_clip_dir(Path(tmp)/'init', vocabulary(), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                                 num_layers=cfg.num_layers, num_heads=cfg.num_heads, text_hidden_size=cfg.text_hidden_size,
                                 text_intermediate_size=2 * cfg.text_hidden_size, text_layers=cfg.text_layers,
                                 projection_dim=cfg.projection_dim, seed=seed)
            clip = CLIPModel.from_pretrained(init)
            if a.init_scale:
                with torch.no_grad(): clip.logit_scale.fill_(math.log(a.init_scale))
            tok, proc = AutoTokenizer.from_pretrained(init), load_image_processor(init)
            pairs = list(pretraining_corpus(cfg.pretrain_pairs, seed=seed))
            x = pixel_values(proc, [p[0] for p in pairs])
            t = tok([p[1] for p in pairs], padding='max_length', truncation=True, max_length=tok.model_max_length, return_tensors='pt')
            print('corpus rendered', round(time.time() - t0), 's', flush=True)
            g = seed_everything(seed)
            opt = clip_optimizer(clip, cfg.pretrain_lr, cfg.pretrain_weight_decay)   # open_clip's exclusion rule, the zoo's since the adoption
            clip.train()
            for step in range(steps):
                i = torch.randint(0, len(pairs), (cfg.pretrain_batch,), generator=g)
                loss = clip_loss(clip(input_ids=t['input_ids'][i], attention_mask=t['attention_mask'][i], pixel_values=x[i]))
                opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
                clamp_temperature(clip)   # CLIP's clamp at 100
                if step % 100 == 0 or step == steps - 1:
                    log['scale'].append(round(clip.logit_scale.exp().item(), 2)); log['loss'].append(round(loss.item(), 4))
                    print(step, log['loss'][-1], log['scale'][-1], round(time.time() - t0), 's', flush=True)
            clip.eval()
            with atomic_dir(clip_dir) as d:
                clip.save_pretrained(d)
                for f in sorted(init.iterdir()):
                    if f.name not in ('config.json', 'model.safetensors'): shutil.copy(f, d/f.name)
        log['pretrain_seconds'] = round(time.time() - t0)
        (out/'pretrain_log.json').write_text(json.dumps(log))
    for task in NEULIG_TASKS:
        dest = out/f'clip-vit-tiny_{task}'
        if (dest/'config.json').exists(): continue
        t0 = time.time()
        finetune_expert(clip_dir, task, REPO/'data'/'tiny'/'datasets'/task, dest, cfg, seed=seed, progress=False)
        print(task, round(time.time() - t0, 1), 's', flush=True)
