"Paper 000's fine-tuning recipe: only the vision encoder moves, through the frozen zero-shot head, with Adam."
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1')

import numpy as np
import pytest, torch
import torch.nn.functional as F
import datasets
from datasets import ClassLabel, Dataset
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

from fusion_nb.tiny.clip_factory import make_clip_dir
from fusion_nb.core import FusionError, HyperparameterError
from fusion_nb.tiny.finetune import finetune_vision, zeroshot_head

CLASSES = ['red square', 'green circle', 'blue cross']
TEMPLATES = ['a photo of a {}.', 'a drawing of a {}.']

@pytest.fixture(scope='module')
def micro(tmp_path_factory):
    d = tmp_path_factory.mktemp('ft')/'clip'
    make_clip_dir(d, [t.format(c) for c in CLASSES for t in TEMPLATES], hidden_size=32, intermediate_size=64, num_layers=1,
                  num_heads=2, text_hidden_size=32, text_intermediate_size=64, text_layers=1, text_heads=2, projection_dim=16, seed=0)
    rng = np.random.default_rng(0)
    colours = [(200, 40, 40), (40, 200, 40), (40, 40, 200)]
    labels = [i % 3 for i in range(24)]
    imgs = [Image.fromarray(np.clip(rng.normal(colours[y], 30, (32, 32, 3)), 0, 255).astype(np.uint8)) for y in labels]
    feats = datasets.Features({'image': datasets.Image(), 'label': ClassLabel(names=CLASSES)})
    ds = Dataset.from_dict({'image': imgs, 'label': labels}, features=feats)
    return CLIPModel.from_pretrained(d), AutoTokenizer.from_pretrained(d), AutoImageProcessor.from_pretrained(d), ds

def run(micro, **kw):
    clip, tok, proc, ds = micro
    args = dict(steps=30, lr=1e-3, batch_size=8, seed=0, progress=False)
    return finetune_vision(clip, tok, proc, ds, CLASSES, TEMPLATES, **{**args, **kw})

def test_head_matches_prompt_by_prompt(micro):
    clip, tok, _, _ = micro
    rows = []
    with torch.no_grad():
        for c in CLASSES:
            es = [clip.get_text_features(**tok([t.format(c)], return_tensors='pt')) for t in TEMPLATES]
            es = [(e if isinstance(e, torch.Tensor) else e.pooler_output)[0] for e in es]
            m = torch.stack([e / e.norm() for e in es]).mean(0)
            rows.append(m / m.norm())
    torch.testing.assert_close(zeroshot_head(clip, tok, CLASSES, TEMPLATES, batch_size=1), torch.stack(rows), atol=1e-5, rtol=1e-5)

def test_text_tower_bit_identical_and_encoder_moves(micro):
    clip = micro[0]
    before = {k: v.clone() for k, v in clip.state_dict().items()}
    ft = run(micro)
    after = clip.state_dict()
    frozen = [k for k in before if not k.startswith('vision_model.')]
    assert any(k.startswith('text_model.') for k in frozen) and 'logit_scale' in frozen and 'visual_projection.weight' in frozen
    for k in before: assert torch.equal(before[k], after[k]), k     # the CLIP passed in (text tower included) is untouched
    sd = ft.state_dict()
    assert set(sd) == {k.removeprefix('vision_model.') for k in before if k.startswith('vision_model.')}
    assert any(not torch.equal(sd[k], before['vision_model.' + k]) for k in sd)

def test_loss_decreases(micro):
    hist = []
    run(micro, steps=60, history=hist)
    assert len(hist) == 60 and np.mean(hist[-10:]) < 0.7 * np.mean(hist[:10])

def test_seeded(micro):
    a, b, c = run(micro, steps=5), run(micro, steps=5), run(micro, steps=5, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)

def test_one_step_is_adam_through_the_zeroshot_head(micro):
    "One step by hand: cross-entropy of scaled cosine logits vs the head, Adam's first update lr·g/(|g|+eps)."
    clip, tok, proc, ds = micro
    lr, bs, seed = 1e-3, 6, 3
    idx = torch.randint(0, len(ds), (bs,), generator=torch.Generator().manual_seed(seed))
    px = proc(images=[ds[int(i)]['image'].convert('RGB') for i in idx], return_tensors='pt')['pixel_values']
    y = torch.tensor([ds[int(i)]['label'] for i in idx])
    head = zeroshot_head(clip, tok, CLASSES, TEMPLATES)
    params = dict(clip.vision_model.named_parameters())
    feats = clip.visual_projection(clip.vision_model(pixel_values=px).pooler_output)
    feats = feats / feats.norm(dim=-1, keepdim=True)
    loss = F.cross_entropy(clip.logit_scale.exp() * feats @ head.T, y)
    grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
    ft = run(micro, steps=1, lr=lr, batch_size=bs, seed=seed).state_dict()
    for k, p in params.items():
        expected = p.detach() - lr * grads[k] / (grads[k].abs() + 1e-8)
        torch.testing.assert_close(ft[k], expected, atol=2e-6, rtol=1e-5, msg=k)

def test_bad_inputs(micro):
    clip, tok, proc, ds = micro
    with pytest.raises(HyperparameterError, match='lr'): run(micro, lr=0)
    with pytest.raises(HyperparameterError, match='steps'): run(micro, steps=0)
    with pytest.raises(FusionError, match='2 class names'):
        finetune_vision(clip, tok, proc, ds, CLASSES[:2], TEMPLATES, steps=1, progress=False)
    with pytest.raises(FusionError, match='templates'): zeroshot_head(clip, tok, CLASSES, [])
