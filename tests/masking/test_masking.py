"""Paper 003's masking library (fusion_nb.masking): integration on the micro project and bad input, beyond the notebooks' own tests."""
import copy, itertools

import pytest
import torch
import torch.nn.functional as F
from datasets import load_from_disk
from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel, CLIPVisionModel

from fusion_nb.core import FusionError, HyperparameterError, UnknownNameError
from fusion_nb.evaluation import ZeroShotClassifier, zeroshot_head
from fusion_nb.masking.cam import ZeroShotLogits, capture_attentions, class_cam
from fusion_nb.masking.masks import (MASKINGS, REFILLS, context_mask, counterfactual_features, counterfactuals, encode_kept,
                                     masking_metrics, object_mask, random_mask, single_fill)
from fusion_nb.masking.counterfactual_ft import (CounterfactualFT, counterfactual_loss, finetune_counterfactual, kd_loss,
                                                 subset_accuracy)
from fusion_nb.methods.interpolation import wise_ft
from fusion_nb.tiny.finetune import pixel_values

from conftest import PAPERMILL, MICRO_TEMPLATES

@pytest.fixture(scope='module')
def micro(micro_project):
    "The micro project's CLIP (random weights), tokenizer, processor and its 'colors' dataset (4 classes, 32×32 RGB)."
    d = micro_project/'models'/'clip'
    ds = load_from_disk(str(micro_project/'datasets'/'colors'))
    return CLIPModel.from_pretrained(d).eval(), AutoTokenizer.from_pretrained(d), AutoImageProcessor.from_pretrained(d), ds

def _zs(clip, tok, ds):
    return ZeroShotLogits(clip.visual_projection, clip.logit_scale, zeroshot_head(clip, tok, ds['train'].features['label'].names, MICRO_TEMPLATES))

def test_cam_is_the_same_whatever_the_attention_implementation(micro):
    "CAM switches to eager attention only inside the call: an SDPA encoder gives the eager encoder's map and stays SDPA."
    clip, tok, proc, ds = micro
    zs, x = _zs(clip, tok, ds), pixel_values(proc, ds['test']['image'][:6])
    y = torch.tensor(ds['test']['label'][:6])
    enc = clip.vision_model
    maps = {}
    for impl in ('sdpa', 'eager'):
        enc.config._attn_implementation = impl
        maps[impl] = class_cam(enc, zs, x, y)
        assert enc.config._attn_implementation == impl
    torch.testing.assert_close(maps['sdpa'], maps['eager'])
    assert maps['eager'].shape == (6, 16) and float(maps['eager'].max()) == 1.0 and float(maps['eager'].min()) >= 0
    with pytest.raises(ValueError, match="doesn.t match model"):   # the hooks are removed and the implementation restored even when the forward fails
        with capture_attentions(enc) as store: enc(pixel_values=torch.zeros(1, 3, 16, 16))
    assert enc.config._attn_implementation == 'eager' and not any(m._forward_hooks for m in enc.modules())

def test_identity_counterfactual_is_plain_feature_distillation(micro):
    "A mask that leaves the image unchanged (object-mask at t = 1, random-mask at rate 0) gives MSE(f̂(x), f(x))."
    clip, tok, proc, ds = micro
    zs, x = _zs(clip, tok, ds), pixel_values(proc, ds['test']['image'][:5])
    y = torch.tensor(ds['test']['label'][:5])
    teacher, student = clip.vision_model, copy.deepcopy(clip.vision_model)
    with torch.no_grad():
        for p in student.parameters(): p.add_(0.05 * torch.randn_like(p))
        plain = F.mse_loss(zs.features(student(pixel_values=x).pooler_output), zs.features(teacher(pixel_values=x).pooler_output))
    for cf in [counterfactuals(x, 8, 'object', refill, class_cam(student, zs, x, y), threshold=1.0) for refill in REFILLS] + \
              [counterfactuals(x, 8, 'random', refill, rate=0.) for refill in REFILLS]:
        with torch.no_grad():
            _, parts = counterfactual_loss(zs(student(pixel_values=x).pooler_output), y,
                                           counterfactual_features(student, zs, cf), counterfactual_features(teacher, zs, cf))
        assert float(plain) > 0
        torch.testing.assert_close(parts['mse'], plain, rtol=1e-5, atol=1e-7)

def test_no_fill_trains_through_dropped_tokens(micro):
    "Gradients flow through `encode_kept`, and only the kept patches' pixels receive any."
    clip, *_ = micro
    enc = copy.deepcopy(clip.vision_model).train()
    x = torch.randn(3, 3, 32, 32, requires_grad=True)
    keep = torch.zeros(3, 16, dtype=torch.bool); keep[:, :5] = True
    out = encode_kept(enc, x, keep)
    # a random projection, not .sum(): the sum of a LayerNorm output with unit weight is constant, so its gradient is 0 up to rounding
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))).sum().backward()
    assert all(p.grad is not None for p in enc.encoder.parameters())
    g = F.unfold(x.grad, 8, stride=8).transpose(1, 2).abs().sum(-1)   # gradient per patch
    assert (g[:, :5] > 0).all() and (g[:, 5:] == 0).all()

@pytest.mark.parametrize('masking,refill', list(itertools.product(MASKINGS, REFILLS)))
def test_every_strategy_fine_tunes(micro, masking, refill):
    "Every masking × refilling combination runs two steps to a finite loss and returns a usable CLIPVisionModel."
    clip, tok, proc, ds = micro
    cfg = CounterfactualFT(masking=masking, refill=refill, threshold=0.4, rate=0.5, batch_size=3, epochs=1, warmup_steps=0,
                           val_size=6, lr=1e-3)
    res = finetune_counterfactual(clip, tok, proc, ds['train'], ds['train'].features['label'].names, MICRO_TEMPLATES, cfg, progress=False)
    assert isinstance(res.encoder, CLIPVisionModel) and len(res.history) == 2
    assert res.history[['loss', 'ce', 'mse']].notna().all().all()
    assert res.history.mse[0] == 0.   # the first step's student is the teacher
    clf = ZeroShotClassifier(res.encoder, clip.visual_projection, clip.logit_scale, _zs(clip, tok, ds).head)
    assert clf(pixel_values(proc, ds['test']['image'][:2])).shape == (2, 4)

def test_wise_kd_with_a_wise_ft_teacher(micro):
    "Eq. 3: a WiSE-FT (α = 0.5) teacher made by fusion_nb.methods.interpolation.wise_ft adds a non-zero KD term."
    clip, tok, proc, ds = micro
    names = ds['train'].features['label'].names
    ft = finetune_counterfactual(clip, tok, proc, ds['train'], names, MICRO_TEMPLATES,
                                 CounterfactualFT(masking='none', beta=0., batch_size=3, epochs=1, warmup_steps=0, val_size=6, lr=1e-2),
                                 progress=False)
    ft_last = ft.encoder   # may be the zero-shot model if validation preferred it: perturb to make the teacher differ
    sd = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v for k, v in ft_last.state_dict().items()}
    merged = wise_ft(clip.vision_model.state_dict(), {'ft': sd}, alpha=0.5, progress=False)
    teacher = CLIPVisionModel(clip.config.vision_config); teacher.load_state_dict(dict(merged)); teacher.eval()
    res = finetune_counterfactual(clip, tok, proc, ds['train'], names, MICRO_TEMPLATES,
                                  CounterfactualFT(masking='random', refill='single', batch_size=3, epochs=1, val_size=6, kd_gamma=1.),
                                  kd_teacher=teacher, progress=False)
    assert (res.history.kd > 0).all()
    torch.testing.assert_close(torch.tensor(res.history.loss.values), torch.tensor((res.history.ce + 30 * res.history.mse + res.history.kd).values),
                               rtol=1e-4, atol=1e-5)

def test_bad_input_is_named():
    x = torch.randn(2, 3, 32, 32); rel = torch.rand(2, 16)
    for bad in (-0.01, 1.01, float('nan')):
        with pytest.raises(HyperparameterError, match='threshold'): object_mask(rel, bad)
        with pytest.raises(HyperparameterError, match='threshold'): context_mask(rel, bad)
        with pytest.raises(HyperparameterError, match='threshold'): counterfactuals(x, 8, 'context', 'multi', rel, threshold=bad)
        with pytest.raises(HyperparameterError, match='threshold'): CounterfactualFT(threshold=bad)
    with pytest.raises(HyperparameterError, match='rate=1.5'): random_mask(2, 16, 1.5)
    with pytest.raises(UnknownNameError, match="masking strategy 'salient'.*object"): counterfactuals(x, 8, 'salient', 'single', rel)
    with pytest.raises(UnknownNameError, match="refilling strategy 'zero'.*multi"): counterfactuals(x, 8, 'object', 'zero', rel)
    with pytest.raises(UnknownNameError, match="masking strategy"): CounterfactualFT(masking='context-mask')
    with pytest.raises(FusionError, match='33×32 pixels cannot be divided into 8×8 patches'): counterfactuals(torch.zeros(2, 3, 33, 32), 8, 'random', 'single')
    with pytest.raises(FusionError, match='cannot be divided'): masking_metrics(torch.zeros(1, 16, dtype=torch.bool), torch.zeros(1, 30, 30, dtype=torch.bool), 8)
    with pytest.raises(FusionError, match='batch has 1 image'): single_fill(x[:1], torch.ones(1, 16, dtype=torch.bool), 8)
    with pytest.raises(FusionError, match='relevance of shape'): counterfactuals(x, 8, 'object', 'single', rel[:, :8])
    with pytest.raises(FusionError, match='not in the class subset'): subset_accuracy(torch.randn(2, 5), torch.tensor([0, 4]), [0, 1, 2])
    with pytest.raises(FusionError, match='teacher'): counterfactual_loss(torch.randn(2, 3), torch.tensor([0, 1]), torch.randn(2, 4), torch.randn(2, 5))
    with pytest.raises(HyperparameterError, match='temperature'): kd_loss(torch.randn(2, 3), torch.randn(2, 3), temperature=-1.)

def _papermill(notebook, tmp_path, yaml):
    "Run nbs/experiments/<notebook> on the micro benchmark into tmp_path/'out'; return that folder."
    import subprocess, sys
    from conftest import REPO
    out = tmp_path/'out'
    args = [*PAPERMILL, str(REPO/'nbs'/'experiments'/notebook), str(tmp_path/'run.ipynb'), '-k', 'python3',
            '-p', 'profile', 'micro', '-p', 'output_dir', str(out), '-y', yaml]
    r = subprocess.run(args, cwd=REPO/'nbs'/'experiments', capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return out

def test_masking_strategies_notebook_on_micro(tmp_path):
    "Experiment 30 runs on micro (two seeds); table 1's rows are the validation-chosen runs, averaged over seeds, recomputed here from the run records."
    import pandas as pd
    out = _papermill('30_masked_images.ipynb', tmp_path, 'thresholds: [0.4, 0.6]\nrates: [0.5]\nfinetune_seeds: [0, 1]\nfinetune_epochs: 1')
    t1 = pd.read_csv(out/'table1.csv', index_col=[0, 1, 2])
    assert len(t1) == 3 + 9 and list(t1.columns) == ['IN', 'IN-V2', 'IN-R', 'IN-Sketch', 'ObjectNet', 'IN-A', 'OOD avg.']
    assert t1['OOD avg.'].values == pytest.approx(t1.iloc[:, 1:6].mean(axis=1).values)
    runs, res = pd.read_csv(out/'runs.csv'), pd.read_csv(out/'results.csv').pivot_table(index='model', columns='task', values='value')
    assert len(runs) == 2 * (2 + 3 + 2 * 3 * 2)   # per seed: vanilla, no masking, random × 3 refills × 1 rate, context/object × 3 × 2 thresholds
    assert t1.loc[('Zero-shot', '–', '–'), 'IN'] == pytest.approx(res.loc['zero_shot', 'imagenet'])
    # object-mask / single-fill: per seed, the run with the best validation accuracy (the first in run order on ties), then the seed mean
    best = runs[runs.method == 'ours:object:single'].groupby('seed', sort=False).apply(lambda g: g.loc[g.val_accuracy.idxmax(), 'model'])
    assert t1.loc[('Ours', 'object-mask', 'single-fill'), 'IN'] == pytest.approx(res.loc[list(best), 'imagenet'].mean())
    findings = pd.read_csv(out/'findings.csv', index_col=0)
    vanilla_ood = res.loc[[f'vanilla_ft/s{s}' for s in (0, 1)], ['imagenet_v2', 'imagenet_r', 'imagenet_sketch', 'objectnet', 'imagenet_a']].mean(axis=1).mean()
    zero_ood = res.loc['zero_shot', ['imagenet_v2', 'imagenet_r', 'imagenet_sketch', 'objectnet', 'imagenet_a']].mean()
    assert findings.loc['vanilla FT loses OOD against zero-shot', 'difference (points)'] == pytest.approx(vanilla_ood - zero_ood)
    assert (out/'figure6.png').exists() and (out/'figure6.pdf').exists() and (out/'table1_paper.csv').exists()
    _check_feature_drift(out, runs, t1)

def _check_feature_drift(out, runs, t1):
    "The feature-drift table has table 1's fine-tuned rows; one drift and one counterfactual distance recomputed here independently."
    import math
    import pandas as pd
    from fusion_nb.masking.counterfactual_ft import counterfactual_distance, finetune_budget
    from fusion_nb.masking.imagenet_data import id_text
    from fusion_nb.pools import ModelPool, Task, TaskPool
    from fusion_nb.reproduce.profiles import load_profile
    why = pd.read_csv(out/'feature_drift.csv', index_col=[0, 1, 2])
    assert list(why.index) == list(t1.index[1:])   # every row of table 1 but zero-shot
    rec = pd.read_csv(out/'feature_drift_records.csv').set_index(['model', 'task', 'metric'])['value']
    # vanilla fine-tuning of seed 0 again (deterministic), and its drift on the ID test set image by image
    P = load_profile('micro', tasks=['imagenet'])
    models, task = ModelPool(P.pretrained, {}, P.device, P.dtype), Task('imagenet', P.datasets['imagenet'], split=P.test_split)
    clip, tok, proc = models.clip, models.tokenizer, models.processor
    train, test = task.load('train'), task.load(P.test_split, max_samples=P.max_test_samples, seed=P.seed)
    ID = id_text(P, 'imagenet', train.features['label'].names)
    B = finetune_budget(P, finetune_epochs=1)
    vanilla = finetune_counterfactual(clip, tok, proc, train, ID.class_names, ID.templates,
                                      CounterfactualFT(**{**B, 'masking': 'none', 'refill': 'none', 'beta': 0.}), seed=0, progress=False).encoder
    x = pixel_values(proc, test['image'])
    dist = []
    with torch.no_grad():
        for i in range(len(x)):
            f = clip.visual_projection(vanilla(pixel_values=x[i:i + 1]).pooler_output)[0].double()
            fh = clip.visual_projection(clip.vision_model(pixel_values=x[i:i + 1]).pooler_output)[0].double()
            dist.append(1 - float((f * fh).sum()) / math.sqrt(float((f * f).sum()) * float((fh * fh).sum())))
    assert rec['vanilla_ft/s0', 'imagenet', 'cosine_distance'] == pytest.approx(100 * sum(dist) / len(dist), rel=1e-3, abs=1e-4)
    assert why.loc[('Vanilla fine-tuning', '–', '–'), 'drift ID (cos. ×100)'] == pytest.approx(
        sum(rec[f'vanilla_ft/s{s}', 'imagenet', 'cosine_distance'] for s in (0, 1)) / 2)
    # random-mask / multi-fill at its one rate (0.5): the counterfactuals of the training images, from the pre-trained encoder, seed by seed
    zs = ZeroShotLogits(clip.visual_projection, clip.logit_scale, zeroshot_head(clip, tok, ID.class_names, ID.templates))
    xt, yt = pixel_values(proc, train['image']), torch.tensor(train['label'])
    cfg = CounterfactualFT(**{**B, 'masking': 'random', 'refill': 'multi', 'rate': 0.5})
    cd = [counterfactual_distance(clip.vision_model, zs, xt, yt, cfg, seed=s)['cosine_distance'] for s in (0, 1)]
    assert why.loc[('Ours', 'random-mask', 'multi-fill'), 'counterfactual distance (cos. ×100)'] == pytest.approx(100 * sum(cd) / 2, rel=1e-6)
    assert why.loc[('Ours', 'no masking', '–'), 'counterfactual distance (cos. ×100)'] == pytest.approx(0, abs=1e-4)   # x_cf = x
    findings = pd.read_csv(out/'findings.csv', index_col=0)
    claim = 'multi-fill drifts further than no-fill on OOD (object-mask, cos. ×100)'
    assert findings.loc[claim, 'difference (points)'] == pytest.approx(why.loc[('Ours', 'object-mask', 'multi-fill'), 'drift OOD (cos. ×100)']
                                                                        - why.loc[('Ours', 'object-mask', 'no-fill'), 'drift OOD (cos. ×100)'])

def test_comparison_notebook_on_micro(tmp_path):
    """Experiment 31 runs on micro; its WiSE-FT curve ends at the zero-shot and the vanilla models, and table 2's rates grow as the
    threshold falls. Run after experiment 30 with the same runs, it reads 30's kept runs (not the first seed's single-fill ones, whose
    CAMs Table 2 needs), and what it reads scores as 30's own."""
    import pandas as pd
    (tmp_path/'30').mkdir()
    out30 = _papermill('30_masked_images.ipynb', tmp_path/'30', 'maskings: object\nrefills: single multi\nthresholds: [0.5]')
    out = _papermill('31_masked_images_comparison.ipynb', tmp_path,
                     'thresholds: [0.5]\nwise_alphas: [0.0, 0.5, 1.0]\nsoup_lr_factors: [1.0, 2.0]\ntable2_images: 40')
    runs = pd.read_csv(out/'runs.csv')
    read = dict(zip(runs.method + '/' + runs.hparam.fillna('-').astype(str), runs.read))
    # read whatever ran before: 30 has just kept these; never kept: LP-FT and WiSE-KD (the seed's single-fill run and the soup's
    # other ingredient were kept by 31 when it ran before, with the same inputs)
    assert (read['vanilla_ft/-'], read['ours:object:multi/0.5'], read['lp_ft/-'], read['wise_kd:ours/0.5'], read['wise_kd:vanilla/-']) == \
           (True, True, False, False, False), read
    rec = pd.read_csv(out/'results.csv').pivot_table(index='model', columns='task', values='value')
    rec30 = pd.read_csv(out30/'results.csv').pivot_table(index='model', columns='task', values='value')
    for m, m30 in [('vanilla_ft/s0',) * 2, ('ours:object:multi/s0', 'ours:object:multi/0.5/s0'), ('ours:object:single/s0', 'ours:object:single/0.5/s0')]:
        assert rec.loc[m].values == pytest.approx(rec30.loc[m30].values, abs=0), m   # read, read, trained again: the same scores
    # WiSE-FT at α = 0 is the zero-shot model and at α = 1 the vanilla fine-tuned one (fusion_nb.methods.interpolation.wise_ft)
    assert rec.loc['wise_ft/0.0/s0'].values == pytest.approx(rec.loc['zero_shot'].values)
    assert rec.loc['wise_ft/1.0/s0'].values == pytest.approx(rec.loc['vanilla_ft/s0'].values)
    assert rec.loc['wise_ours/1.0/s0'].values == pytest.approx(rec.loc['ours:object:single/s0'].values)
    t2 = pd.read_csv(out/'table2.csv', index_col=0)
    assert ((t2.values >= 0) & (t2.values <= 1)).all()
    # a lower threshold masks a superset of patches: both masking rates can only grow (thresholds are in decreasing order)
    assert (t2.loc['Image MR'].diff().dropna() >= 0).all() and (t2.loc['Object MR'].diff().dropna() >= 0).all()
    t3 = pd.read_csv(out/'table3.csv', index_col=0)
    assert list(t3.index) == ['Zero-shot', 'Vanilla fine-tuning', 'LP-FT', 'WiSE-FT (α=0.5)', 'Uniform soup', 'Ours (multi-fill)',
                              'Ours (single-fill)', 'WiSE-KD (vanilla FT)', 'WiSE-KD (ours)']
    assert t3.loc['WiSE-FT (α=0.5)', 'IN'] == pytest.approx(rec.loc['wise_ft/0.5/s0', 'imagenet'])
    assert t3['OOD avg.'].values == pytest.approx(t3.iloc[:, 1:6].mean(axis=1).values)
    assert (out/'figure7.png').exists() and (out/'table3_paper.csv').exists()

@pytest.mark.parametrize('name,model', [('clip-vit-b32-imagenet', 'openai/clip-vit-base-patch32'),
                                        ('clip-vit-b16-imagenet', 'openai/clip-vit-base-patch16')])
def test_paper_003_profiles_parse_and_fail_at_once_offline(tmp_path, name, model):
    "Paper 003's profiles name the ID task and five shifts with splits the experiments accept; offline, the runner stops within seconds saying what to do."
    import os, subprocess, sys
    from pathlib import Path
    from fusion_nb.masking.counterfactual_ft import evaluation_splits
    from fusion_nb.reproduce.profiles import load_profile
    p = load_profile(name)
    assert p.tasks == ['imagenet', 'imagenet_v2', 'imagenet_r', 'imagenet_sketch', 'objectnet', 'imagenet_a'] and p.hub and p.pretrained == model
    assert p.datasets['imagenet'] == 'ILSVRC/imagenet-1k' and p.class_names == 'catalog' and p.extra['soup_ingredients'] == ''
    assert evaluation_splits(p.tasks, p.test_split, p.extra['test_splits'])['imagenet'] == 'validation'
    before = sorted((Path(__file__).parents[2]/'outputs'/name).rglob('*'))   # a checkout may hold earlier runs
    r = subprocess.run([sys.executable, '-c', 'import sys; from fusion_nb.reproduce.cli import main; raise SystemExit(main(sys.argv[1:]))',
                        'reproduce', '--profile', name, '--only', '30', '31'],
                       env={**{k: v for k, v in os.environ.items() if k != 'FUSION_NB_ROOT'}, 'HF_HUB_OFFLINE': '1', 'HF_HOME': str(tmp_path)},
                       capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert r.returncode == 2, r.stderr
    import torch
    if not torch.cuda.is_available():   # the device is checked first (issue 27): a machine without a GPU is told that
        assert f"profile {name!r}: device 'cuda' requested but CUDA is not available" in r.stderr, r.stderr
        return   # the sources' message is checked for every paper profile by test_profiles' offline test (device='cpu')
    assert f"profile {name!r} needs the Hugging Face Hub" in r.stderr and model in r.stderr and 'ILSVRC/imagenet-1k' in r.stderr
    if not Path(p.datasets['objectnet']).exists():
        # the folders no hub gives: the message says how to write them (as the notebooks' check_sources does)
        assert 'dataset.objectnet = ' in r.stderr and 'fusion_nb.pools.save_image_folders' in r.stderr, r.stderr
    # at once: no experiment started, nothing written (a time limit would be a timed test, and flaky under load)
    assert 'running' not in r.stdout and sorted((Path(__file__).parents[2]/'outputs'/name).rglob('*')) == before

def random_openai_clip(w=32, p=4, grid=2, e=16):
    "A random OpenAI-layout CLIP state dict (one block per tower), its generator and sizes: the converter tests' input."
    import math
    g = torch.Generator().manual_seed(0); r = lambda *s: 0.2 * torch.randn(*s, generator=g)
    sd = {'visual.conv1.weight': r(w, 3, p, p), 'visual.class_embedding': r(w), 'visual.positional_embedding': r(grid * grid + 1, w), 'visual.proj': r(w, e),
          'token_embedding.weight': r(20, w), 'positional_embedding': r(5, w), 'text_projection': r(w, e), 'logit_scale': torch.tensor(math.log(50.))}
    for n in ('visual.ln_pre', 'visual.ln_post', 'ln_final'): sd[f'{n}.weight'], sd[f'{n}.bias'] = 1 + r(w), r(w)
    for root in ('visual.transformer.resblocks.0.', 'transformer.resblocks.0.'):
        sd.update({root + 'attn.in_proj_weight': r(3 * w, w), root + 'attn.in_proj_bias': r(3 * w), root + 'attn.out_proj.weight': r(w, w),
                   root + 'attn.out_proj.bias': r(w), root + 'ln_1.weight': 1 + r(w), root + 'ln_1.bias': r(w), root + 'ln_2.weight': 1 + r(w),
                   root + 'ln_2.bias': r(w), root + 'mlp.c_fc.weight': r(4 * w, w), root + 'mlp.c_fc.bias': r(4 * w),
                   root + 'mlp.c_proj.weight': r(w, 4 * w), root + 'mlp.c_proj.bias': r(w)})
    return sd, g, r, (w, p, grid, e)

def test_openai_clip_converter_as_exported():
    "The exported converter (not the notebook's namespace): a random OpenAI-layout ViT, its image embedding through nn.MultiheadAttention blocks."
    import math
    from fusion_nb.masking.openai_clip import openai_clip_model
    sd, g, r, (w, p, grid, e) = random_openai_clip()
    model = openai_clip_model(sd, vision_heads=4, text_heads=4)
    x = torch.randn(2, 3, grid * p, grid * p, generator=g)
    mha = torch.nn.MultiheadAttention(w, 4, batch_first=True)
    mha.load_state_dict({'in_proj_weight': sd['visual.transformer.resblocks.0.attn.in_proj_weight'], 'in_proj_bias': sd['visual.transformer.resblocks.0.attn.in_proj_bias'],
                         'out_proj.weight': sd['visual.transformer.resblocks.0.attn.out_proj.weight'], 'out_proj.bias': sd['visual.transformer.resblocks.0.attn.out_proj.bias']})
    ln = lambda t, n: F.layer_norm(t, (w,), sd[n + '.weight'], sd[n + '.bias'], 1e-5)
    with torch.no_grad():
        tok = F.conv2d(x, sd['visual.conv1.weight'], stride=p).flatten(2).transpose(1, 2)
        h = ln(torch.cat([sd['visual.class_embedding'].expand(2, 1, w), tok], 1) + sd['visual.positional_embedding'], 'visual.ln_pre')
        b = 'visual.transformer.resblocks.0.'
        a = ln(h, b + 'ln_1'); h = h + mha(a, a, a, need_weights=False)[0]
        m = F.linear(ln(h, b + 'ln_2'), sd[b + 'mlp.c_fc.weight'], sd[b + 'mlp.c_fc.bias'])
        h = h + F.linear(m * torch.sigmoid(1.702 * m), sd[b + 'mlp.c_proj.weight'], sd[b + 'mlp.c_proj.bias'])
        ref = ln(h[:, 0], 'visual.ln_post') @ sd['visual.proj']
        got = model.visual_projection(model.vision_model(pixel_values=x).pooler_output)
    assert torch.allclose(got, ref, atol=1e-5), float((got - ref).abs().max())

@pytest.mark.parametrize('refill', ['single', 'multi'])
def test_one_image_last_batch_fine_tunes(micro, refill):
    "Issue 24.8 / 26.10: n_train % batch_size == 1 left a one-image batch with no refill donor; its step is CE only."
    clip, tok, proc, ds = micro
    n_train = len(ds['train']) - 6
    assert n_train >= 3
    cfg = CounterfactualFT(masking='random', refill=refill, rate=0.5, batch_size=n_train - 1, epochs=1, warmup_steps=0, val_size=6, lr=1e-3)
    res = finetune_counterfactual(clip, tok, proc, ds['train'], ds['train'].features['label'].names, MICRO_TEMPLATES, cfg, progress=False)
    assert len(res.history) == 2 and res.history.loss.notna().all()
    assert res.history.mse[1] == 0. and res.history.loss[1] == res.history.ce[1]   # the one-image step: no counterfactual term

def test_validation_split_does_not_move_with_the_seed(micro, monkeypatch):
    "Issue 24.9: the validation images are the same whatever the run's seed (the authors fix their split)."
    import fusion_nb.masking.counterfactual_ft as C
    clip, tok, proc, ds = micro
    seen = []
    real = C.dataset_logits
    monkeypatch.setattr(C, 'dataset_logits', lambda enc, zs, p, d, idx, **kw: (seen.append(sorted(int(i) for i in idx)), real(enc, zs, p, d, idx, **kw))[1])
    cfg = CounterfactualFT(masking='none', beta=0., batch_size=len(ds['train']), epochs=1, warmup_steps=0, val_size=6, lr=1e-3)
    for seed in (0, 1, 2):
        finetune_counterfactual(clip, tok, proc, ds['train'], ds['train'].features['label'].names, MICRO_TEMPLATES, cfg, seed=seed, progress=False)
    assert len(seen) == 3 and seen[0] == seen[1] == seen[2]

def test_table2_masks_are_the_ones_built_in_training(micro):
    "Issue 24.9: keep_cams records each step's CAM, the masks object-masking built; step 1's student is the pre-trained model."
    clip, tok, proc, ds = micro
    cfg = CounterfactualFT(masking='object', refill='single', threshold=0.4, batch_size=3, epochs=1, warmup_steps=0, val_size=6, lr=1e-2)
    res = finetune_counterfactual(clip, tok, proc, ds['train'], ds['train'].features['label'].names, MICRO_TEMPLATES, cfg,
                                  progress=False, keep_cams=True)
    assert len(res.cams) == len(res.history) == 2
    rows, rel = res.cams[0]
    zs = _zs(clip, tok, ds)
    x, y = pixel_values(proc, ds['train'].select(rows.tolist())['image']), torch.tensor(ds['train']['label'])[rows]
    assert torch.allclose(rel, class_cam(clip.vision_model, zs, x, y), atol=1e-5)   # independent: the pre-trained model's CAM
    assert not torch.allclose(res.cams[1][1], class_cam(clip.vision_model, zs, *(lambda r: (pixel_values(proc, ds['train'].select(r.tolist())['image']),
                              torch.tensor(ds['train']['label'])[r]))(res.cams[1][0])), atol=1e-6)   # step 2: the student has moved

def test_official_model_soups_layout(tmp_path):
    "Issue 24.7: the official checkpoints (model. prefix, text transformer deleted, classification_head.*) are read and score with their own head."
    import math
    from fusion_nb.masking.openai_clip import official_soup_classifier, official_uniform_soup, openai_clip_model
    sd, g, r, (w, p, grid, e) = random_openai_clip()
    head_w, head_b = r(7, e), r(7)
    official = {**{'model.' + k: v for k, v in sd.items() if not k.startswith('transformer.')},
                'classification_head.weight': head_w, 'classification_head.bias': head_b}
    torch.save(official, tmp_path/'soup0.pt'); torch.save(official, tmp_path/'soup1.pt')
    clf = official_soup_classifier(tmp_path/'soup0.pt', vision_heads=4)
    full = openai_clip_model(sd, vision_heads=4, text_heads=4)   # the same weights through the whole-CLIP converter
    x = torch.randn(3, 3, grid * p, grid * p, generator=g)
    with torch.no_grad():
        f = full.visual_projection(full.vision_model(pixel_values=x).pooler_output)
        assert torch.allclose(clf(x), F.normalize(f, dim=-1) @ head_w.T + head_b, atol=1e-5)
        assert torch.allclose(official_uniform_soup([tmp_path/'soup0.pt', tmp_path/'soup1.pt'], vision_heads=4)(x), clf(x), atol=1e-5)
