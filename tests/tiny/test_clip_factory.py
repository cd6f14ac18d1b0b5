"CLIP directories made offline: tokenizer files, a random-init CLIPModel, image processor, noisy experts."
import json, os
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')

import numpy as np
import pytest, torch
from PIL import Image
from safetensors.torch import load_file
from transformers import (AutoImageProcessor, AutoTokenizer, CLIPModel, CLIPTokenizer, CLIPTokenizerFast,
                          CLIPVisionModel)

from fusion_nb.checkpoints import vision_state_dict
from fusion_nb.tiny.clip_factory import BOS, CLIP_MEAN, CLIP_STD, EOS, build_tokenizer_files, make_clip_dir, make_expert_dirs

WORDS = ['a photo of a red sedan.', 'a satellite photo of herbaceous vegetation land.', 'a "no entry" traffic sign.',
         'a photo of the number 7.', 'checkered texture']
SMALL = dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, text_hidden_size=32,
             text_intermediate_size=64, text_layers=1, text_heads=2, projection_dim=16)

@pytest.fixture(scope='module')
def clip_dir(tmp_path_factory):
    return make_clip_dir(tmp_path_factory.mktemp('clip')/'clip', WORDS, seed=3, **SMALL)

@pytest.mark.parametrize('cls', [CLIPTokenizer, CLIPTokenizerFast, AutoTokenizer])
def test_tokenizer_files_load_and_keep_words_whole(tmp_path, cls):
    d = build_tokenizer_files(WORDS, tmp_path/'tok')
    assert {p.name for p in d.iterdir()} >= {'vocab.json', 'merges.txt', 'tokenizer_config.json', 'special_tokens_map.json'}
    tok = cls.from_pretrained(d)
    words = {w for text in WORDS for w in text.replace('"', ' " ').replace('.', ' . ').split()}
    for w in words: assert tok.tokenize(w) == [w.lower() + '</w>'], w
    ids = tok('a red sedan')['input_ids']
    assert tok.convert_ids_to_tokens(ids) == [BOS, 'a</w>', 'red</w>', 'sedan</w>', EOS]
    assert ''.join(tok.tokenize('zebra')).replace('</w>', '') == 'zebra'        # unknown words: character fallback
    assert len(tok.tokenize('zebra')) == 5
    assert json.loads((d/'special_tokens_map.json').read_text())['eos_token'] == EOS

def test_slow_files_agree_with_tokenizer_json(tmp_path):
    d = build_tokenizer_files(WORDS, tmp_path/'tok')
    vocab = json.loads((d/'vocab.json').read_text())
    lines = (d/'merges.txt').read_text().splitlines()
    assert lines[0].startswith('#version')
    merges = [tuple(l.split(' ')) for l in lines[1:]]
    for a, b in merges: assert a + b in vocab          # every merge result is a token
    text = 'a satellite photo of a checkered zebra 7'
    assert CLIPTokenizer(vocab=vocab, merges=merges)(text)['input_ids'] == AutoTokenizer.from_pretrained(d)(text)['input_ids']

def test_tokenizer_files_are_deterministic(tmp_path):
    a, b = build_tokenizer_files(WORDS, tmp_path/'a'), build_tokenizer_files(list(reversed(WORDS)), tmp_path/'b')
    for f in ['vocab.json', 'merges.txt']: assert (a/f).read_bytes() == (b/f).read_bytes()

def test_clip_dir_loads_offline(clip_dir):
    model = CLIPModel.from_pretrained(clip_dir)
    tok, proc = AutoTokenizer.from_pretrained(clip_dir), AutoImageProcessor.from_pretrained(clip_dir)
    vc, tc = model.config.vision_config, model.config.text_config
    assert (vc.hidden_size, vc.num_hidden_layers, vc.image_size, vc.patch_size) == (32, 1, 32, 8)
    assert (tc.hidden_size, tc.vocab_size, model.config.projection_dim) == (32, len(tok), 16)
    assert tc.eos_token_id == tok.convert_tokens_to_ids(EOS)
    img = Image.new('RGB', (48, 40), (255, 128, 0))
    px = proc(images=img, return_tensors='pt')['pixel_values']
    assert px.shape == (1, 3, 32, 32)
    expected = (torch.tensor([255, 128, 0]) / 255 - torch.tensor(CLIP_MEAN)) / torch.tensor(CLIP_STD)
    torch.testing.assert_close(px[0, :, 16, 16], expected.float(), atol=1e-2, rtol=0)
    with torch.no_grad():
        out = model(**tok(WORDS, padding=True, return_tensors='pt'), pixel_values=px)
    assert out.logits_per_image.shape == (1, len(WORDS)) and torch.isfinite(out.logits_per_image).all()

def test_clip_dir_is_seeded(clip_dir, tmp_path):
    same = load_file(make_clip_dir(tmp_path/'same', WORDS, seed=3, **SMALL)/'model.safetensors')
    other = load_file(make_clip_dir(tmp_path/'other', WORDS, seed=4, **SMALL)/'model.safetensors')
    ref = load_file(clip_dir/'model.safetensors')
    assert all(torch.equal(ref[k], same[k]) for k in ref)
    assert any(not torch.equal(ref[k], other[k]) for k in ref if ref[k].is_floating_point())

def test_clip_dir_is_atomic(tmp_path, monkeypatch):
    import fusion_nb.tiny.clip_factory as cf
    good = make_clip_dir(tmp_path/'m', WORDS, seed=0, **SMALL)
    before = (good/'model.safetensors').read_bytes()
    def broken(*args, **kwargs): raise OSError('disk full')
    monkeypatch.setattr(cf, 'build_tokenizer_files', broken)   # fails after the new weights were written
    with pytest.raises(OSError): make_clip_dir(good, WORDS, seed=1, **SMALL)
    assert (good/'model.safetensors').read_bytes() == before                  # the old directory is untouched
    assert [p.name for p in tmp_path.iterdir()] == ['m']                      # no temporary left behind

def test_expert_dirs(clip_dir, tmp_path):
    ex = make_expert_dirs(clip_dir, str(tmp_path/'e_{task}'), ['a', 'b'], seed=1, noise=0.1)
    again = make_expert_dirs(clip_dir, str(tmp_path/'f_{task}'), ['a', 'b'], seed=1, noise=0.1)
    pre = vision_state_dict(clip_dir)
    model = CLIPVisionModel.from_pretrained(ex['a'])
    sd = model.state_dict()
    assert set(pre) <= set(sd)
    k = 'encoder.layers.0.mlp.fc1.weight'
    diff = sd[k] - pre[k]
    assert 0.08 < float(diff.std()) < 0.12 and abs(float(diff.mean())) < 0.02
    assert torch.equal(vision_state_dict(ex['a'])[k], vision_state_dict(again['a'])[k])       # seeded
    assert not torch.equal(vision_state_dict(ex['a'])[k], vision_state_dict(ex['b'])[k])      # one stream per task
