"Loaders on saved directories: both key layouts and CLIPModel dirs, sharded and legacy checkpoints, lazy reads, offline errors, atomic saves."
import json, os, time
from collections.abc import Mapping

import pytest
import torch
from safetensors.torch import save_file
from transformers import CLIPConfig, CLIPModel, CLIPTextConfig, CLIPVisionConfig, CLIPVisionModel

import fusion_nb.checkpoints as ckpt
from fusion_nb.algebra import TaskVector, check_compatible, materialize
from fusion_nb.checkpoints import (LazyStateDict, check_vision_state_dict, load_vision_model, resolve_model_dir,
                                   save_state_dict, save_vision_model, vision_config, vision_state_dict)
from fusion_nb.core import FusionError, IncompatibleModelsError

CFG = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       image_size=32, patch_size=8)
N_POS = (32 // 8) ** 2 + 1
TEXT = CLIPTextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=60,
                      max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)

@pytest.fixture(scope='module')
def model():
    torch.manual_seed(0)
    return CLIPVisionModel(CFG).eval()

@pytest.fixture(scope='module')
def layouts(model, tmp_path_factory):
    "The same vision weights saved as a transformers-5 CLIPVisionModel, in transformers 4's layout, and inside a CLIPModel."
    root = tmp_path_factory.mktemp('layouts')
    model.save_pretrained(root/'new')                       # written by transformers itself
    old = root/'old'; old.mkdir()
    CFG.save_pretrained(old)
    sd = {'vision_model.' + k: v.contiguous() for k, v in model.state_dict().items()}
    sd['vision_model.embeddings.position_ids'] = torch.arange(N_POS)[None]
    save_file(sd, old/'model.safetensors', metadata={'format': 'pt'})
    clip = CLIPModel(CLIPConfig(text_config=TEXT.to_dict(), vision_config=CFG.to_dict(), projection_dim=16))
    clip.vision_model.load_state_dict(model.state_dict())
    clip.save_pretrained(root/'clip')
    return {'new': root/'new', 'old': root/'old', 'clip': root/'clip'}

def pixels(): return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))

# ---------------------------------------------------------------- layouts

def test_every_layout_reads_to_the_same_canonical_tensors(model, layouts):
    ref = model.state_dict()
    for kind, d in layouts.items():
        lazy = vision_state_dict(d)
        assert sorted(lazy) == sorted(ref), kind                     # no prefix, no position_ids, no text keys
        for k, v in ref.items():
            assert lazy.shape(k) == tuple(v.shape) and lazy.dtype(k) == v.dtype
            assert torch.equal(lazy[k], v), (kind, k)
    raw_old = LazyStateDict(layouts['old'])
    assert 'vision_model.embeddings.position_ids' in raw_old and raw_old.dtype('vision_model.embeddings.position_ids') == torch.int64
    assert any(k.startswith('text_model.') for k in LazyStateDict(layouts['clip']))

def test_every_layout_loads_the_same_model(model, layouts):
    x = pixels()
    with torch.no_grad():
        ref = model(pixel_values=x).pooler_output
        for kind, d in layouts.items():
            m = load_vision_model(d)
            assert isinstance(m, CLIPVisionModel) and not m.training
            assert torch.allclose(m(pixel_values=x).pooler_output, ref, atol=1e-6), kind
        # a CLIPModel directory also provides the config of a plain state dict
        m = load_vision_model(dict(model.state_dict()), config=layouts['clip'])
        assert torch.allclose(m(pixel_values=x).pooler_output, ref, atol=1e-6)
        m = load_vision_model(model.state_dict(), config=CFG, dtype='float64')
        assert next(m.parameters()).dtype == torch.float64

def test_vision_config_from_every_kind(layouts):
    for d in layouts.values():
        cfg = vision_config(d)
        assert isinstance(cfg, CLIPVisionConfig) and cfg.hidden_size == 32 and cfg.num_hidden_layers == 2
    clip_cfg = CLIPConfig(text_config=TEXT.to_dict(), vision_config=CFG.to_dict())
    assert vision_config(clip_cfg).patch_size == 8

def test_non_clip_config_is_refused(tmp_path):
    (tmp_path/'config.json').write_text(json.dumps({'model_type': 'bert'}))
    with pytest.raises(FusionError, match="is a 'bert' model, not CLIP"): vision_config(tmp_path)
    with pytest.raises(FusionError, match='no config.json'): vision_config(tmp_path/'..')

def test_not_a_vision_checkpoint(tmp_path):
    save_file({'text_model.embeddings.token_embedding.weight': torch.zeros(3, 2)}, tmp_path/'model.safetensors')
    with pytest.raises(FusionError, match=f"'{tmp_path}' holds no CLIP vision encoder"):
        vision_state_dict(tmp_path)

def test_mixed_layout_is_refused(tmp_path, model):
    sd = {k if i % 2 else 'vision_model.' + k: v for i, (k, v) in enumerate(model.state_dict().items())}
    save_file(sd, tmp_path/'model.safetensors')
    with pytest.raises(FusionError, match="'half-old' mixes vision keys with and without the 'vision_model.' prefix"):
        vision_state_dict(tmp_path, name='half-old')

# ---------------------------------------------------------------- file kinds

def test_sharded_safetensors(tmp_path, model):
    sd = model.state_dict(); keys = sorted(sd)
    half = len(keys) // 2
    shards = {'model-00001-of-00002.safetensors': keys[:half], 'model-00002-of-00002.safetensors': keys[half:]}
    for fname, ks in shards.items(): save_file({k: sd[k].contiguous() for k in ks}, tmp_path/fname)
    (tmp_path/'model.safetensors.index.json').write_text(json.dumps(
        {'metadata': {}, 'weight_map': {k: f for f, ks in shards.items() for k in ks}}))
    CFG.save_pretrained(tmp_path)
    lazy = vision_state_dict(tmp_path)
    assert lazy.kind == 'safetensors' and len(lazy.files) == 2
    assert sorted(lazy) == keys
    for k in keys: assert torch.equal(lazy[k], sd[k])
    os.remove(tmp_path/'model-00002-of-00002.safetensors')
    with pytest.raises(FusionError, match="lists shard\\(s\\) that are not there: \\['model-00002-of-00002.safetensors'\\]"):
        LazyStateDict(tmp_path)

def test_sharded_checkpoint_saved_by_transformers(tmp_path, model):
    model.save_pretrained(tmp_path, max_shard_size='20KB')
    assert (tmp_path/'model.safetensors.index.json').exists()
    lazy = vision_state_dict(tmp_path)
    assert len(lazy.files) > 1
    for k, v in model.state_dict().items(): assert torch.equal(lazy[k], v)

@pytest.mark.parametrize('zipfile', [True, False])
def test_legacy_bin_is_read_weights_only(tmp_path, model, zipfile):
    sd = {'vision_model.' + k: v for k, v in model.state_dict().items()}
    sd['vision_model.embeddings.position_ids'] = torch.arange(N_POS)[None]
    torch.save(sd, tmp_path/'pytorch_model.bin', _use_new_zipfile_serialization=zipfile)
    CFG.save_pretrained(tmp_path)
    lazy = vision_state_dict(tmp_path)
    assert lazy.kind == 'bin' and sorted(lazy) == sorted(model.state_dict())
    t = lazy['post_layernorm.weight']
    t += 1                                                   # a copy: the checkpoint is not modified
    assert torch.equal(lazy['post_layernorm.weight'], model.state_dict()['post_layernorm.weight'])
    loaded = load_vision_model(tmp_path)
    for k, v in model.state_dict().items(): assert torch.equal(loaded.state_dict()[k], v)

def test_safetensors_preferred_over_bin(tmp_path, model):
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path/'model.safetensors')
    torch.save({'junk': torch.zeros(1)}, tmp_path/'pytorch_model.bin')
    assert LazyStateDict(tmp_path).kind == 'safetensors'

class Evil:  # pickles as a global reference to this module, which weights_only refuses to import
    pass

def test_bin_with_arbitrary_objects_is_refused(tmp_path):
    "Refused, naming the file and the model, and never advising weights_only=False (that would run the pickle's code)."
    torch.save({'w': torch.zeros(1), 'obj': Evil()}, tmp_path/'pytorch_model.bin')
    with pytest.raises(FusionError) as e:
        LazyStateDict(tmp_path, name='gtsrb expert')
    msg = str(e.value)
    assert f"model 'gtsrb expert': {str(tmp_path/'pytorch_model.bin')!r} is a pickle that holds more than tensors" in msg
    assert 'Evil' in msg and 'weights_only' not in msg and 'safetensors copy' in msg

@pytest.mark.parametrize('cut', [0, 5, 200, -7])
def test_empty_or_truncated_safetensors_name_file_and_model(tmp_path, model, cut):
    d = save_vision_model(model.state_dict(), tmp_path/'expert', CFG)
    f = d/'model.safetensors'; data = f.read_bytes()
    f.write_bytes(data[:cut])
    with pytest.raises(FusionError) as e:
        sd = vision_state_dict(d, name='svhn'); [sd[k] for k in sd]   # the header, or a tensor past the end
    assert f"model 'svhn': {str(f)!r} is not a valid safetensors file" in str(e.value) and 'truncated or corrupt' in str(e.value)
    assert ('(empty;' in str(e.value)) == (cut == 0)

def test_corrupt_bin_names_the_file(tmp_path):
    (tmp_path/'pytorch_model.bin').write_bytes(b'PK\x03\x04 not really a zip')
    with pytest.raises(FusionError, match=r"'.*pytorch_model.bin' is not a readable PyTorch checkpoint \(truncated or corrupt\?\)"):
        LazyStateDict(tmp_path)

def test_save_vision_model_never_deletes_files_it_did_not_write(tmp_path, model):
    "Saving replaces the folder whole: a folder with other files in it is refused, and keeps them."
    d = tmp_path/'merged'; d.mkdir()
    (d/'README.md').write_text('my notes'); (d/'tokenizer.json').write_text('{}')
    with pytest.raises(FusionError, match=r"holds files save_vision_model did not write \(README.md, tokenizer.json\), which saving would delete"):
        save_vision_model(model.state_dict(), d, CFG)
    assert (d/'README.md').read_text() == 'my notes' and sorted(p.name for p in d.iterdir()) == ['README.md', 'tokenizer.json']
    (tmp_path/'afile').write_text('x')
    with pytest.raises(FusionError, match="it is a file, not a folder"):
        save_vision_model(model.state_dict(), tmp_path/'afile', CFG)
    e = tmp_path/'empty'; e.mkdir()
    save_vision_model(model.state_dict(), e, CFG); save_vision_model(model.state_dict(), e, CFG)   # empty, then its own: replaced
    assert sorted(p.name for p in e.iterdir()) == ['config.json', 'model.safetensors']

def test_single_files(tmp_path):
    p = save_state_dict({'w': torch.ones(3), 'i': torch.arange(2)}, tmp_path/'x.safetensors')
    lazy = LazyStateDict(p, name='x')
    assert lazy.kind == 'safetensors' and torch.equal(lazy['w'], torch.ones(3)) and lazy.dtype('i') == torch.int64
    torch.save({'w': torch.ones(2)}, tmp_path/'y.bin')
    assert torch.equal(LazyStateDict(tmp_path/'y.bin')['w'], torch.ones(2))

# ---------------------------------------------------------------- laziness

class Counting:
    "Wraps safetensors' safe_open and records every tensor read."
    reads = []
    def __init__(self, *a, **kw): self.h = REAL_SAFE_OPEN(*a, **kw)
    def __enter__(self): self.h.__enter__(); return self
    def __exit__(self, *a): return self.h.__exit__(*a)
    def keys(self): return self.h.keys()
    def get_slice(self, k): return self.h.get_slice(k)
    def get_tensor(self, k): Counting.reads.append(k); return self.h.get_tensor(k)

REAL_SAFE_OPEN = ckpt.safe_open

@pytest.fixture
def counting(monkeypatch):
    Counting.reads = []
    monkeypatch.setattr(ckpt, 'safe_open', Counting)
    return Counting.reads

def test_lazy_reads_one_tensor_per_lookup(layouts, model, counting):
    lazy = vision_state_dict(layouts['old'])
    assert [lazy.shape(k) for k in lazy] and [lazy.dtype(k) for k in lazy] and counting == []   # header only
    assert lazy.numel() == sum(v.numel() for v in model.state_dict().values()) and counting == []
    assert lazy.nbytes() == 4 * lazy.numel()
    lazy['post_layernorm.weight']
    assert counting == ['vision_model.post_layernorm.weight']
    with pytest.raises(KeyError, match="'nope' is not a tensor of"): lazy['nope']

def test_algebra_on_lazy_checkpoints_reads_headers_then_key_by_key(layouts, tmp_path, model, counting):
    torch.manual_seed(1)
    ft = {k: v + 0.01 * torch.randn_like(v) for k, v in model.state_dict().items()}
    save_vision_model(ft, tmp_path/'ft', CFG)
    pre, exp = vision_state_dict(layouts['old'], name='pre'), vision_state_dict(tmp_path/'ft', name='ft')
    counting.clear()
    check_compatible({'pre': pre, 'ft': exp})
    tv = TaskVector.from_models(pre, exp)
    merged = (0.5 * tv).apply_to(pre)
    assert counting == []                              # compatibility and expression building read no weights
    k = 'encoder.layers.1.mlp.fc2.weight'
    out = merged[k]
    assert sorted(set(counting)) == ['encoder.layers.1.mlp.fc2.weight', 'vision_model.encoder.layers.1.mlp.fc2.weight']
    assert torch.allclose(out, model.state_dict()[k] + 0.5 * (ft[k] - model.state_dict()[k]), atol=1e-6)

def test_lazy_checkpoints_incompatible_named(layouts, tmp_path, model):
    other = CLIPVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                             image_size=32, patch_size=8)
    save_vision_model(CLIPVisionModel(other).state_dict(), tmp_path/'narrow', other)
    with pytest.raises(IncompatibleModelsError, match=r"tensor 'encoder.layers.0.mlp.fc1.bias': shape \[48\] in model 'narrow' but \[64\] in 'pre'"):
        check_compatible({'pre': vision_state_dict(layouts['new']), 'narrow': vision_state_dict(tmp_path/'narrow')})

# ---------------------------------------------------------------- resolving sources

def test_offline_hub_id_fails_at_once(monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    t0 = time.time()
    with pytest.raises(FusionError, match=r"'tanganke/clip-vit-base-patch32_nope' is not in the local Hugging Face cache.*HF_HUB_OFFLINE=1.*"
                                          r"Run on a machine with hub access, pre-download it.*or point the profile at a local directory"):
        resolve_model_dir('tanganke/clip-vit-base-patch32_nope')
    with pytest.raises(FusionError, match="'tanganke/clip-vit-base-patch32_nope2' is not in the local"):
        vision_state_dict('tanganke/clip-vit-base-patch32_nope2')
    assert time.time() - t0 < 5

def fake_cache(root, repo_id, files):
    "A Hugging Face cache entry laid out as huggingface_hub stores one: refs/main → snapshots/<commit>/."
    commit = 'a' * 40
    repo = root/('models--' + repo_id.replace('/', '--'))
    snap = repo/'snapshots'/commit
    snap.mkdir(parents=True)
    (repo/'refs').mkdir(); (repo/'refs'/'main').write_text(commit)
    for name, write in files.items(): write(snap/name)
    return snap

def test_offline_resolves_a_cached_model(tmp_path, monkeypatch, model):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    snap = fake_cache(tmp_path, 'someone/clip-micro', {
        'config.json': lambda p: CFG.to_json_file(p),
        'model.safetensors': lambda p: save_file({'vision_model.' + k: v.contiguous() for k, v in model.state_dict().items()}, p)})
    assert resolve_model_dir('someone/clip-micro', cache_dir=tmp_path) == snap
    monkeypatch.setattr('huggingface_hub.constants.HF_HUB_CACHE', str(tmp_path))
    lazy = vision_state_dict('someone/clip-micro')
    assert lazy.name == 'someone/clip-micro' and sorted(lazy) == sorted(model.state_dict())

def test_offline_partial_cache_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    fake_cache(tmp_path, 'someone/only-config', {'config.json': lambda p: CFG.to_json_file(p)})
    with pytest.raises(FusionError, match="'someone/only-config' is only partly in the local Hugging Face cache"):
        resolve_model_dir('someone/only-config', cache_dir=tmp_path)

def test_missing_dir_and_empty_dir(tmp_path):
    with pytest.raises(FusionError, match=f"model directory '{tmp_path/'nope'}' does not exist"):
        resolve_model_dir(str(tmp_path/'nope'))
    with pytest.raises(FusionError, match="model directory './no/such/expert' does not exist"):
        load_vision_model('./no/such/expert')
    with pytest.raises(FusionError, match=f"no weights in '{tmp_path}'"): LazyStateDict(tmp_path)

def test_not_a_path_nor_a_hub_id(monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    with pytest.raises(FusionError, match="'data/tiny/models/typo' is neither an existing directory nor a hub id"):
        resolve_model_dir('data/tiny/models/typo')

# ---------------------------------------------------------------- loading and saving errors

def test_wrong_architecture_names_the_source(tmp_path, model):
    other = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                             image_size=32, patch_size=8)
    d = save_vision_model(model.state_dict(), tmp_path/'two_layers', CFG)
    with pytest.raises(IncompatibleModelsError, match=r"'.*two_layers' does not fit CLIPVisionModel\(hidden_size=32, num_hidden_layers=3\): "
                                                      r"missing 16 tensor\(s\) \['encoder.layers.2"):
        load_vision_model(d, config=other)
    with pytest.raises(IncompatibleModelsError, match="'expert-x' does not fit.*unexpected 1 \\['extra.weight'\\]"):
        load_vision_model({**model.state_dict(), 'extra.weight': torch.zeros(1)}, config=CFG, name='expert-x')
    with pytest.raises(FusionError, match="a state dict \\('unnamed'\\) needs `config`"):
        load_vision_model(dict(model.state_dict()))

def test_wrong_shape_names_tensor_and_source(model):
    sd = dict(model.state_dict()); sd['encoder.layers.0.self_attn.q_proj.weight'] = torch.zeros(32, 31)
    with pytest.raises(IncompatibleModelsError, match=r"'gtsrb': tensor 'encoder.layers.0.self_attn.q_proj.weight' has shape \[32, 31\] "
                                                      r"but the config's CLIPVisionModel expects \[32, 32\]"):
        check_vision_state_dict(sd, CFG, name='gtsrb')

def test_old_layout_state_dict_gets_a_hint(model):
    sd = {'vision_model.' + k: v for k, v in model.state_dict().items()}
    with pytest.raises(IncompatibleModelsError, match='transformers 4 layout\\? read it with vision_state_dict'):
        save_vision_model(sd, '/nonexistent/never-written', CFG)

def test_save_vision_model_roundtrip(tmp_path, model, layouts):
    half = {k: v.half() for k, v in model.state_dict().items()}
    d = save_vision_model(vision_state_dict(layouts['old']), tmp_path/'merged', layouts['clip'])  # lazy in, CLIPModel config
    assert sorted(p.name for p in d.iterdir()) == ['config.json', 'model.safetensors']
    cfg = json.loads((d/'config.json').read_text())
    assert cfg['model_type'] == 'clip_vision_model' and cfg['architectures'] == ['CLIPVisionModel'] and cfg['dtype'] == 'float32'
    x = pixels()
    with torch.no_grad():
        m = CLIPVisionModel.from_pretrained(d).eval()
        assert torch.allclose(m(pixel_values=x).pooler_output, model(pixel_values=x).pooler_output, atol=1e-6)
    d16 = save_vision_model(half, tmp_path/'half', CFG)
    assert json.loads((d16/'config.json').read_text())['dtype'] == 'float16'
    assert CFG.to_dict().get('dtype') in (None, 'float32')           # the caller's config is not modified
    assert CLIPVisionModel.from_pretrained(d16).dtype == torch.float16
    assert all(torch.equal(vision_state_dict(d16)[k], v) for k, v in half.items())

def test_tensors_sharing_memory_are_saved(tmp_path, model):
    sd = dict(model.state_dict())
    flat = torch.zeros(64)
    sd['post_layernorm.weight'], sd['post_layernorm.bias'] = flat[:32], flat[32:]   # two views of one buffer
    d = save_vision_model(sd, tmp_path/'views', CFG)
    assert torch.equal(vision_state_dict(d)['post_layernorm.bias'], torch.zeros(32))

class Failing(Mapping):
    "A lazy state dict whose last tensor cannot be computed."
    def __init__(self, sd): self.sd = sd
    def __getitem__(self, k):
        if k == list(self.sd)[-1]: raise RuntimeError('boom')
        return self.sd[k]
    def __iter__(self): return iter(self.sd)
    def __len__(self): return len(self.sd)

def test_save_is_atomic(tmp_path, model):
    d = save_vision_model(model.state_dict(), tmp_path/'expert', CFG)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    with pytest.raises(RuntimeError, match='boom'):
        save_vision_model(Failing({k: v + 1 for k, v in model.state_dict().items()}), d, CFG)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before          # the old directory is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ['expert']         # no temporary left behind
    with pytest.raises(RuntimeError, match='boom'):
        save_state_dict(Failing({'a': torch.ones(1), 'b': torch.ones(1)}), tmp_path/'x.safetensors')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['expert']

def test_save_state_dict_atomic(tmp_path):
    p = save_state_dict({'w': torch.ones(3)}, tmp_path/'x.safetensors', metadata={'task': 'gtsrb'})
    assert torch.equal(LazyStateDict(p)['w'], torch.ones(3))
    assert [f.name for f in tmp_path.iterdir()] == ['x.safetensors']
    p = save_state_dict({'w': torch.zeros(2)}, p)                              # replaced whole
    assert torch.equal(LazyStateDict(p)['w'], torch.zeros(2))
