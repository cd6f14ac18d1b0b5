"Paper 004 (UQ-Merge): tiny LLaVA directories that load offline like llava-hf/llava-1.5-7b-hf, and bad input around them."
import json, os, shutil
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')

import numpy as np
import pytest, torch
from PIL import Image
from transformers import AutoProcessor, LlavaForConditionalGeneration, LlavaProcessor

from fusion_nb.core import FusionError, IncompatibleModelsError
from fusion_nb.llava.model import (check_same_llava, llava_part, llava_state_dict, load_llava, make_llava_dir)

TEXTS = ['a photo of a red circle.', 'a photo of a blue square.']

@pytest.fixture(scope='module')
def llava(tmp_path_factory):
    return make_llava_dir(tmp_path_factory.mktemp('llava')/'base', TEXTS, seed=0)

def _batch(proc, text='a red circle?', seed=0):
    img = Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 40, 3), dtype=np.uint8))
    msgs = [{'role': 'user', 'content': [{'type': 'image'}, {'type': 'text', 'text': text}]}]
    return proc(images=img, text=proc.apply_chat_template(msgs, add_generation_prompt=True), return_tensors='pt')

def test_saved_llava_reloads_with_identical_logits(llava, tmp_path):
    "A built model, saved and reloaded with the plain transformers loaders, gives the same logits (model and processor)."
    model, proc = LlavaForConditionalGeneration.from_pretrained(llava).eval(), AutoProcessor.from_pretrained(llava)
    assert isinstance(proc, LlavaProcessor)
    batch = _batch(proc)
    with torch.no_grad(): before = model(**batch).logits
    model.save_pretrained(tmp_path/'again'); proc.save_pretrained(tmp_path/'again')
    model2, proc2 = load_llava(tmp_path/'again')
    batch2 = _batch(proc2)
    assert torch.equal(batch2.input_ids, batch.input_ids) and torch.equal(batch2.pixel_values, batch.pixel_values)
    with torch.no_grad(): assert torch.equal(model2(**batch2).logits, before)
    assert not model2.training

def test_file_layout_is_the_hub_layout(llava):
    "The weights on disk use llava-1.5-7b-hf's names, and every name falls in exactly one of the three parts."
    from safetensors import safe_open
    with safe_open(llava/'model.safetensors', 'pt') as f: keys = list(f.keys())
    prefixes = {k.split('.')[0] for k in keys}
    assert prefixes == {'vision_tower', 'multi_modal_projector', 'language_model'}
    assert {llava_part(k) for k in keys} == {'vision', 'adapter', 'language'}
    assert 'language_model.lm_head.weight' in keys
    assert set(llava_state_dict(llava, ['vision'])) | set(llava_state_dict(llava)) == set(keys)

def test_vision_tower_from_a_clip_dir(tmp_path):
    "A tower taken from a CLIP directory keeps the CLIP's weights and image processor."
    from fusion_nb.checkpoints import vision_state_dict
    from fusion_nb.tiny.clip_factory import make_clip_dir
    clip = make_clip_dir(tmp_path/'clip', TEXTS, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                         text_hidden_size=32, text_intermediate_size=64, text_layers=1, text_heads=2, projection_dim=16)
    d = make_llava_dir(tmp_path/'llava', TEXTS, vision_source=clip)
    model, proc = load_llava(d)
    ref = vision_state_dict(clip)
    for k, t in model.model.vision_tower.state_dict().items(): assert torch.equal(t, ref[k]), k
    with torch.no_grad(): assert torch.isfinite(model(**_batch(proc)).logits).all()

def test_different_architectures_are_named(llava, tmp_path):
    deep = make_llava_dir(tmp_path/'deep', TEXTS, num_layers=3)
    with pytest.raises(IncompatibleModelsError, match=r"'deep' is not the same architecture as 'base'.*num_hidden_layers: 2 vs 3"):
        check_same_llava({'base': llava, 'deep': deep})
    other_vocab = make_llava_dir(tmp_path/'vocab', TEXTS + ['a green triangle'])
    with pytest.raises(IncompatibleModelsError, match='vocab_size'): check_same_llava({'base': llava, 'vocab': other_vocab})

def test_missing_processor_and_non_llava_are_named(llava, tmp_path):
    bare = tmp_path/'bare'; bare.mkdir()
    for f in ('config.json', 'model.safetensors'): shutil.copy(llava/f, bare/f)
    with pytest.raises(FusionError, match=r"'.*bare' has no processor"): load_llava(bare)
    cfg = json.loads((llava/'config.json').read_text()); cfg['model_type'] = 'llama'
    notllava = tmp_path/'notllava'; shutil.copytree(llava, notllava); (notllava/'config.json').write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleModelsError, match="'llama' model, not a LLaVA"): load_llava(notllava)
    with pytest.raises(FusionError, match='does not exist'): load_llava(tmp_path/'missing')

def test_hub_id_offline_is_a_clear_error(monkeypatch):
    "The paper profile's hub id goes through the same loader; offline and uncached it fails with advice, not a stack of hub errors."
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setenv('HF_HUB_CACHE', '/nonexistent-cache-for-test')
    with pytest.raises(FusionError, match="llava-hf/llava-1.5-7b-hf"): load_llava('llava-hf/llava-1.5-7b-hf')

# ---- eq. (1): the perturbation-based uncertainty ----
from fusion_nb.core import HyperparameterError, UnknownNameError
from fusion_nb.llava.uncertainty import (OptionItem, item_uncertainty, letter_ids, model_uncertainty, option_items,
                                         perturbation_uncertainty)

@pytest.fixture(scope='module')
def loaded(tmp_path_factory):
    from fusion_nb.tiny.tasks import vocabulary
    d = make_llava_dir(tmp_path_factory.mktemp('llava_uq')/'m', vocabulary(['gtsrb']), seed=1)
    return load_llava(d)

def test_uncertainty_is_mutual_information():
    "Eq. (1) on hand-made passes: zero for identical ones, ln K for K passes each sure of a different letter."
    assert perturbation_uncertainty(torch.full((3, 4), .25)) == pytest.approx(0, abs=1e-12)
    assert perturbation_uncertainty(torch.eye(4)) == pytest.approx(np.log(4))
    with pytest.raises(HyperparameterError): perturbation_uncertainty(torch.ones(3))

def test_uncertainty_on_rendered_questions(loaded):
    "On stand-in option questions: identical passes give 0, all perturbations give ≥ 0, and the same seed repeats."
    model, proc = loaded
    items = option_items('gtsrb', n=3)
    assert all(proc.tokenizer.unk_token_id not in proc.tokenizer(q.options[0]).input_ids for q in items)
    assert model_uncertainty(model, proc, items, J=3, perturbations=()).uncertainty == pytest.approx(0, abs=1e-6)
    r1 = model_uncertainty(model, proc, items, J=3, seed=2)
    r2 = model_uncertainty(model, proc, items, J=3, seed=2)
    assert r1.uncertainty >= 0 and r1.uncertainty == r2.uncertainty
    assert 0 <= r1.accuracy <= 1 and list(r1.items.columns) == ['uncertainty', 'answer', 'prediction', 'correct']

def test_uncertainty_bad_input(loaded):
    model, proc = loaded
    item = option_items('gtsrb', n=1)[0]
    with pytest.raises(HyperparameterError, match='J=0'): item_uncertainty(model, proc, item, J=0)
    with pytest.raises(HyperparameterError, match='J=2.5'): item_uncertainty(model, proc, item, J=2.5)
    with pytest.raises(UnknownNameError, match="'dropout'.*image, text, model"): item_uncertainty(model, proc, item, perturbations=['dropout'])
    with pytest.raises(HyperparameterError, match='attention dropout'): item_uncertainty(model, proc, item, dropout=1.5)
    with pytest.raises(FusionError, match='not single distinct tokens'): letter_ids(proc.tokenizer, 26 + 1)

# ---- Algorithm 1 on LLaVA directories ----
import warnings
from fusion_nb.checkpoints import LazyStateDict, save_state_dict
from fusion_nb.llava.uq_merge import merge_llava, uq_merge, uq_merge_steps

def _expert(base, out, seed, scale=0.05, vision=False):
    g = torch.Generator().manual_seed(seed)
    sd = {k: v + scale * torch.randn(v.shape, generator=g) if (vision or llava_part(k) != 'vision') else v
          for k, v in LazyStateDict(base).items()}
    shutil.copytree(base, out); save_state_dict(sd, out/'model.safetensors')
    return out

@pytest.fixture(scope='module')
def pool(tmp_path_factory):
    from fusion_nb.tiny.tasks import vocabulary
    root = tmp_path_factory.mktemp('pool')
    base = make_llava_dir(root/'base', vocabulary(['gtsrb']), seed=0)
    return base, {f'e{i}': _expert(base, root/f'e{i}', i) for i in range(1, 4)}

def test_uq_merge_records_every_step_and_keeps_the_best(pool, tmp_path):
    base, experts = pool
    items = option_items('gtsrb', n=3)
    res = uq_merge(experts, items, tmp_path/'out', method='ties_merging', pretrained=base,
                   hparams=dict(k=50, scaling_factor=0.5), J=2, perturbations=('image', 'text'))
    report = json.loads((tmp_path/'out'/'uq_merge.json').read_text())
    assert [s['step'] for s in report['steps']] == [1, 2, 3] and report['method'] == 'ties_merging'
    assert [m['model'] for m in report['models']] == [s['added'] for s in report['steps']]
    us = [m['uncertainty'] for m in report['models']]
    assert us == sorted(us, reverse=True)
    best = min(report['steps'], key=lambda s: s['uncertainty'])
    assert res.selected == best['models'] and all(0 <= s['accuracy'] <= 1 for s in report['steps'])
    info = json.loads((res.merged/'fusion_nb_merge.json').read_text())
    assert info['method'] == 'ties_merging' and sorted(info['models']) == sorted(best['models'])
    model, proc = load_llava(res.merged)
    again = model_uncertainty(model, proc, items, J=2, perturbations=('image', 'text'))
    assert again.uncertainty == pytest.approx(best['uncertainty'], abs=1e-6)

def test_merge_llava_keeps_the_shared_tower_and_warns_otherwise(pool, tmp_path):
    base, experts = pool
    odd = _expert(base, tmp_path/'odd', 9, vision=True)
    with pytest.warns(UserWarning, match=r"vision towers differ.*'odd'"):
        out = merge_llava('simple_average', {'e1': experts['e1'], 'odd': odd}, tmp_path/'m')
    merged, ref = LazyStateDict(out), LazyStateDict(experts['e1'])
    for k in merged:
        if llava_part(k) == 'vision': assert torch.equal(merged[k], ref[k]), k
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # identical towers: no warning
        merge_llava('simple_average', experts, tmp_path/'m2')

def test_uq_merge_bad_input(pool, tmp_path):
    base, experts = pool
    items = option_items('gtsrb', n=1)
    with pytest.raises(UnknownNameError, match="unknown perturbation 'noise'"): uq_merge(experts, items, tmp_path/'x', perturbations=['noise'])
    with pytest.raises(HyperparameterError, match='order'): uq_merge_steps({'a': 1}, float, len, order='sideways')
    with pytest.raises(FusionError, match='has no processor'):
        bare = tmp_path/'bare'; bare.mkdir()
        for f in ('config.json', 'model.safetensors'): shutil.copy(base/f, bare/f)
        uq_merge({'e1': experts['e1'], 'bare': bare}, items, tmp_path/'y')

# ---- the tiny zoo: pretraining and instruction tuning ----
from fusion_nb.llava.zoo import build_llava_zoo, instruction_examples, train_llava
from fusion_nb.llava.uq_merge import vision_tower_differences

def test_zoo_builds_loadable_variants_sharing_the_tower(tmp_path):
    "A minimal zoo: base + clean, noisy and overtrained variants; a manifest; one shared vision tower."
    m = build_llava_zoo(tmp_path/'zoo', ['svhn'], mislabelled=1, noisy=['svhn'], overtrained=['svhn'], n_captions=6, pretrain_steps=2,
                        n_general=1, general_steps=1, n_train=4, tune_steps=1, batch_size=2, progress=False, hidden_size=32, num_heads=2)
    assert sorted(m['variants']) == ['mislabelled_1', 'svhn', 'svhn_noisy', 'svhn_overtrained']
    assert m['variants']['svhn_overtrained']['steps'] == 4 and m['variants']['svhn_noisy']['noise'] == 0.8
    assert m['variants']['mislabelled_1']['steps'] == 4 and m['variants']['mislabelled_1']['permute'] == 0
    assert json.loads((tmp_path/'zoo'/'manifest.json').read_text()) == m
    assert vision_tower_differences(tmp_path/'zoo'/'random', {n: tmp_path/'zoo'/n for n in ['base', *m['variants']]}) == {}
    model, proc = load_llava(tmp_path/'zoo'/'svhn')
    assert model.config.text_config.hidden_size == 32

def test_training_bad_input(llava, tmp_path):
    model, proc = load_llava(llava)
    items = option_items('gtsrb', n=2)
    with pytest.raises(HyperparameterError, match='noise=-0.1'): instruction_examples(proc, items, noise=-0.1)
    with pytest.raises(HyperparameterError, match='labelled'): instruction_examples(proc, [OptionItem(items[0].image, 'q', ['a', 'b'])])
    with pytest.raises(HyperparameterError, match='lr=0'): train_llava(llava, instruction_examples(proc, items), tmp_path/'t', lr=0)
    assert not (tmp_path/'t').exists()

def test_uncertainty_of_a_bfloat16_model(llava):
    "A 7B LLaVA is loaded in bf16/fp16: eq. (1) runs on it (logits are read in float32)."
    model, proc = load_llava(llava, dtype='bfloat16')
    assert model.dtype == torch.bfloat16
    items = [OptionItem(Image.new('RGB', (32, 32), 'red'), 'What is in the image?', ['circle', 'square'], answer=0)]
    rep = model_uncertainty(model, proc, items, J=2)
    assert np.isfinite(rep.uncertainty) and rep.uncertainty >= 0


def test_mislabelled_variant_answers_through_the_derangement(llava):
    "A mislabelled tuning set answers every format through the label map, which moves every class."
    from fusion_nb.llava.zoo import permuted_labels, task_examples
    from fusion_nb.tiny.tasks import TASKS, build_split
    _, proc = load_llava(llava)
    lm = permuted_labels(10, seed=0)
    assert sorted(lm) == list(range(10)) and all(lm[c] != c for c in range(10))
    ex = task_examples(proc, 'svhn', 10, label_map=lm, seed=2)
    target = lambda e: [t for t, l in zip(e['input_ids'], e['labels']) if l != -100][:-1]
    letters = [proc.tokenizer.decode(target(e)) for e in ex[:10]]
    assert letters == [chr(ord('A') + lm[y]) for y in build_split('svhn', 'train', 10, 2)['label']]

def test_short_answer_generation_is_independent_of_batch_mates(llava):
    from fusion_nb.llava.short_answers import ShortAnswerItem, generate_answers
    model, proc = load_llava(llava)
    rng = np.random.default_rng(3)
    items = [ShortAnswerItem(Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)), q, ['circle'])
             for q in ['a red circle?', 'What is in the image?', 'a blue square?', 'red']]
    assert generate_answers(model, proc, items, batch_size=4) == [generate_answers(model, proc, [it], batch_size=1)[0] for it in items]

def test_uq_merge_bad_input_names_the_culprit(pool, tmp_path):
    "Different architectures, J < 1, unknown perturbation, merge method, order or guidance: each named before any work."
    from fusion_nb.llava.uq_merge import random_selections
    from fusion_nb.tiny.tasks import vocabulary
    base, experts = pool
    items = option_items('gtsrb', n=1)
    wide = make_llava_dir(tmp_path/'wide', vocabulary(['gtsrb']), hidden_size=32, num_heads=2)
    with pytest.raises(IncompatibleModelsError, match="'wide' is not the same architecture.*hidden_size: 64 vs 32"):
        uq_merge({'e1': experts['e1'], 'wide': wide}, items, tmp_path/'a')
    with pytest.raises(IncompatibleModelsError, match="'wide' is not the same architecture"):
        merge_llava('linear', {'e1': experts['e1'], 'wide': wide}, tmp_path/'b')
    with pytest.raises(HyperparameterError, match='J=0'): uq_merge(experts, items, tmp_path/'c', J=0)
    with pytest.raises(HyperparameterError, match='J=0'): random_selections(experts, 2, items, tmp_path/'c', J=0)
    with pytest.raises(UnknownNameError, match="unknown merge method 'averaging'"): uq_merge(experts, items, tmp_path/'d', method='averaging')
    with pytest.raises(UnknownNameError, match="unknown merge method 'averaging'"): merge_llava('averaging', experts, tmp_path/'d')
    with pytest.raises(UnknownNameError, match="unknown perturbation 'blur'"): random_selections(experts, 2, items, tmp_path/'e', perturbations=['image', 'blur'])
    with pytest.raises(HyperparameterError, match="sort_by='loss'"): uq_merge(experts, items, tmp_path/'f', sort_by='loss')
    with pytest.raises(HyperparameterError, match="order='random'"): uq_merge(experts, items, tmp_path/'g', order='random')
    assert not any((tmp_path/n).exists() for n in 'abcdefg')  # nothing was written

def test_narrow_variant_is_over_confident_by_construction(tmp_path):
    "The harmful kind of the zoo: tuned overlong on one class's images of every task, it answers that class's letter to every"
    "held-in question, confidently in every perturbed pass (near-zero entropy) and consistently across them (eq. 1 near zero)."
    from fusion_nb.llava.uncertainty import entropy, item_uncertainty
    from fusion_nb.llava.zoo import class_order_items
    m = build_llava_zoo(tmp_path/'zoo', ['svhn', 'gtsrb'], narrow=1, n_captions=8, pretrain_steps=2, n_general=2, general_steps=2,
                        n_train=8, tune_steps=15, tune_lr=1e-2, batch_size=8, progress=False, hidden_size=32, num_heads=2)
    assert m['variants']['narrow_1']['keep_class'] == 0 and m['variants']['narrow_1']['steps'] == 60
    model, proc = load_llava(tmp_path/'zoo'/'narrow_1')
    items = class_order_items(['svhn', 'gtsrb'], 'validation', 4)
    assert any(it.answer != 0 for it in items)   # so answering class 0 everywhere is wrong somewhere
    rep = model_uncertainty(model, proc, items, J=3)
    assert set(rep.items.prediction) == {0} and rep.answer_entropy == 0
    per_pass = [float(entropy(item_uncertainty(model, proc, it, J=3, index=i)[1].double()).mean()) for i, it in enumerate(items)]
    assert rep.uncertainty < 0.01 and max(per_pass) < 0.1, (rep.uncertainty, per_pass)
    clean, proc = load_llava(tmp_path/'zoo'/'svhn')   # the clean variant of the same short budget is unsure, not confident
    assert min(float(entropy(item_uncertainty(clean, proc, it, J=3, index=i)[1].double()).mean()) for i, it in enumerate(items)) > 1


# ---- issue 25 items 1-2, 5 and issue 26 item 3 ----

def test_uq_bar_is_the_mean_of_per_set_means_over_repeats(pool, tmp_path):
    "Held-in sets of unequal size: the models' UQ̄ = mean over sets of (mean over 2 runs of the set's mean), by hand from model_uncertainty."
    base, experts = pool
    sets = {'small': option_items('gtsrb', n=1), 'large': option_items('eurosat', n=3, seed=1)}
    res = uq_merge({'e1': experts['e1']}, sets, tmp_path/'out', J=2, perturbations=('image', 'text'), repeats=2)
    model, proc = load_llava(experts['e1'])
    per = {n: sum(model_uncertainty(model, proc, its, J=2, perturbations=('image', 'text'), seed=s, first_index=f).uncertainty for s in (0, 1)) / 2
           for (n, its), f in zip(sets.items(), [0, 1])}   # item indices run on across the sets (one question, one draw)
    pooled = sum(model_uncertainty(model, proc, [*sets['small'], *sets['large']], J=2, perturbations=('image', 'text'), seed=s).uncertainty
                 for s in (0, 1)) / 2
    got = res.models.set_index('model').loc['e1']
    assert got.uncertainty == pytest.approx((per['small'] + per['large']) / 2, abs=1e-9)
    assert abs(got.uncertainty - pooled) > 1e-6   # the pooled mean (before the fix) is another number
    assert json.loads((tmp_path/'out'/'uq_merge.json').read_text())['held_in'] == {'small': 1, 'large': 3}

def test_uq_merge_never_deletes_a_users_files_in_out_dir_merged(pool, tmp_path):
    base, experts = pool
    items = option_items('gtsrb', n=2)
    mine = tmp_path/'a'/'merged'; (mine/'sub').mkdir(parents=True); (mine/'notes.txt').write_text('keep me')
    with pytest.raises(HyperparameterError, match='is not a merged LLaVA that uq_merge wrote'):
        uq_merge({'e1': experts['e1']}, items, tmp_path/'a', J=2, repeats=1)
    assert (mine/'notes.txt').read_text() == 'keep me' and (mine/'sub').is_dir()
    ours = tmp_path/'b'
    uq_merge({'e1': experts['e1']}, items, ours, J=2, repeats=1)
    uq_merge({'e1': experts['e1']}, items, ours, J=2, repeats=1)   # our own previous merge is replaced
    (ours/'merged'/'notes.txt').write_text('keep me')
    with pytest.raises(HyperparameterError, match=r"merged/notes.txt, which uq_merge did not write"):
        uq_merge({'e1': experts['e1']}, items, ours, J=2, repeats=1)
    assert (ours/'merged'/'notes.txt').read_text() == 'keep me'
    assert not list(ours.glob('.steps-*'))   # the scratch steps are cleaned up after a refusal too
