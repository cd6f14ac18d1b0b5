"Loaders on saved directories: both key layouts, sharded and legacy checkpoints, lazy reads, offline errors."
import json, os, time
import pytest, torch
from safetensors.torch import save_file
from transformers import CLIPVisionConfig, CLIPVisionModel

from fusion_nb.core import FusionError, IncompatibleModelsError
from fusion_nb.checkpoints import (LazyStateDict, load_vision_model, resolve_model_dir, save_state_dict,
                                   save_vision_model, vision_state_dict)
import fusion_nb.checkpoints as ckpt

CFG = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       image_size=32, patch_size=8)

@pytest.fixture(scope='module')
def model():
    torch.manual_seed(0)
    return CLIPVisionModel(CFG).eval()

def test_sharded_safetensors(tmp_path, model):
    sd = model.state_dict(); keys = sorted(sd)
    half = len(keys) // 2
    shards = {'model-00001-of-00002.safetensors': keys[:half], 'model-00002-of-00002.safetensors': keys[half:]}
    for fname, ks in shards.items(): save_file({k: sd[k].contiguous() for k in ks}, tmp_path/fname)
    (tmp_path/'model.safetensors.index.json').write_text(json.dumps(
        {'metadata': {}, 'weight_map': {k: f for f, ks in shards.items() for k in ks}}))
    CFG.save_pretrained(tmp_path)
    lazy = vision_state_dict(tmp_path)
    assert sorted(lazy) == keys
    for k in keys: assert torch.equal(lazy[k], sd[k])

def test_legacy_bin_is_read_weights_only(tmp_path, model):
    sd = {'vision_model.' + k: v for k, v in model.state_dict().items()}
    torch.save(sd, tmp_path/'pytorch_model.bin')
    CFG.save_pretrained(tmp_path)
    lazy = vision_state_dict(tmp_path)
    assert lazy.kind == 'bin' and sorted(lazy) == sorted(model.state_dict())
    loaded = load_vision_model(tmp_path)
    for k, v in model.state_dict().items(): assert torch.equal(loaded.state_dict()[k], v)

class Evil:  # pickles as a global reference to this module, which weights_only refuses to import
    pass

def test_bin_with_arbitrary_objects_is_refused(tmp_path):
    torch.save({'w': torch.zeros(1), 'obj': Evil()}, tmp_path/'pytorch_model.bin')
    with pytest.raises(Exception, match='(?i)weights_only|unsupported|global'):
        LazyStateDict(tmp_path)

def test_lazy_reads_one_tensor_per_lookup(tmp_path, model, monkeypatch):
    out = save_vision_model(model.state_dict(), tmp_path/'m', CFG)
    reads = []
    real = ckpt.safe_open
    class Counting:
        def __init__(self, *a, **kw): self.h = real(*a, **kw)
        def __enter__(self): self.h.__enter__(); return self
        def __exit__(self, *a): return self.h.__exit__(*a)
        def keys(self): return self.h.keys()
        def get_slice(self, k): return self.h.get_slice(k)
        def get_tensor(self, k): reads.append(k); return self.h.get_tensor(k)
    monkeypatch.setattr(ckpt, 'safe_open', Counting)
    lazy = vision_state_dict(out)
    assert [lazy.shape(k) for k in lazy] and reads == []          # keys/shapes come from the header
    assert lazy.numel() == sum(v.numel() for v in model.state_dict().values()) and reads == []
    lazy['post_layernorm.weight']
    assert reads == ['post_layernorm.weight']

def test_offline_hub_id_fails_at_once(monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    t0 = time.time()
    with pytest.raises(FusionError, match="tanganke/clip-vit-base-patch32_nope.*HF_HUB_OFFLINE"):
        resolve_model_dir('tanganke/clip-vit-base-patch32_nope')
    assert time.time() - t0 < 5

def test_missing_dir_and_empty_dir(tmp_path):
    with pytest.raises(FusionError, match='does not exist'): resolve_model_dir(str(tmp_path/'nope'))
    with pytest.raises(FusionError, match='no weights in'): LazyStateDict(tmp_path)

def test_wrong_architecture_names_the_source(tmp_path, model):
    other = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                             image_size=32, patch_size=8)
    d = save_vision_model(model.state_dict(), tmp_path/'two_layers', CFG)
    with pytest.raises(IncompatibleModelsError, match='two_layers.*missing'):
        load_vision_model(d, config=other)

def test_save_state_dict_atomic(tmp_path):
    p = save_state_dict({'w': torch.ones(3)}, tmp_path/'x.safetensors')
    assert torch.equal(LazyStateDict(p)['w'], torch.ones(3))
    assert [f.name for f in tmp_path.iterdir()] == ['x.safetensors']
