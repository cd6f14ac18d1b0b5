"""`fusion-nb merge` on Hugging Face models of several architectures (tiny, random, built here): mergekit configs and this
project's, checked against the methods' formulas computed here tensor by tensor; bad configs refused, nothing written."""
import json, os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from fusion_nb.core import FusionError, IncompatibleModelsError, NonFiniteError
from fusion_nb.reproduce.merge_config import load_merge_config, run_merge
from fusion_nb.reproduce.cli import main

V, H = 64, 16

def _tokenizer(d:Path, vocab=V):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token='w0'))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token='w0', eos_token='w1').save_pretrained(d)

def _save(model, d:Path, base=None, seed=0, noise=0.02, shard='20KB', tok=True):
    "Save `model` (its weights made base + noise when `base` is given); return its state dict."
    torch.manual_seed(seed)
    if base is not None:
        with torch.no_grad():
            for k, v in model.state_dict().items():
                if v.is_floating_point() and k in base and v.shape == base[k].shape: v.copy_(base[k] + noise * torch.randn_like(v))
    model.save_pretrained(d, max_shard_size=shard)
    if tok: _tokenizer(d, model.config.get_text_config().vocab_size)
    return {k: v.clone() for k, v in model.state_dict().items()}

def _llama(vocab=V, cls='llama'):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    C, M = (LlamaConfig, LlamaForCausalLM) if cls == 'llama' else (Qwen2Config, Qwen2ForCausalLM)
    return M(C(vocab_size=vocab, hidden_size=H, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
               num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False))

def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=H, n_layer=2, n_head=2, n_positions=32))

def _clip():
    from transformers import CLIPConfig, CLIPModel
    return CLIPModel(CLIPConfig(text_config=dict(vocab_size=V, hidden_size=H, intermediate_size=32, num_hidden_layers=2,
                                                 num_attention_heads=2, max_position_embeddings=16),
                                vision_config=dict(hidden_size=H, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                   image_size=8, patch_size=4), projection_dim=8))

def _llava():
    from transformers import LlavaConfig, LlavaForConditionalGeneration, CLIPVisionConfig, LlamaConfig
    return LlavaForConditionalGeneration(LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=H, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=8, patch_size=4),
        text_config=LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=2, max_position_embeddings=32), image_token_index=V - 1))

def _zoo(tmp, make, n=2, **kw):
    "base, then n fine-tune stand-ins (base + noise): (folders, state dicts)."
    dirs = [tmp/'base'] + [tmp/f'e{i}' for i in range(1, n + 1)]
    sds = [_save(make(), dirs[0], **kw)]
    sds += [_save(make(), d, sds[0], seed=i, **kw) for i, d in enumerate(dirs[1:], 1)]
    return dirs, sds

def _close(a, b, atol=1e-5): assert torch.allclose(a.float(), b.float(), atol=atol), (a - b).abs().max()

def _t(keys):   # mergekit's layer position, computed independently: the index after 'layers.'/'h.'/'layer.' over the stack
    import re
    out, n = {}, {}
    for k in keys:
        m = re.search(r'^(.*?)\.(\d+)\.', k)
        if m: n[m.group(1)] = max(n.get(m.group(1), 0), int(m.group(2)) + 1)
    for k in keys:
        m = re.search(r'^(.*?)\.(\d+)\.', k)
        out[k] = 0.0 if not m else int(m.group(2)) / max(1, n[m.group(1)] - 1)
    return out

def test_llama_task_arithmetic_gradient_sharded(tmp_path):
    "Sharded Llamas in, sharded out with an index; θ₀ + λ Σ wᵢ(t) τᵢ; config, generation config and tokenizer copied."
    from transformers import AutoModelForCausalLM, AutoTokenizer
    (b, e1, e2), (B, E1, E2) = _zoo(tmp_path, _llama)
    assert (b/'model.safetensors.index.json').exists()
    cfg = dict(merge_method='task_arithmetic', base_model=str(b), parameters={'lambda': 0.8},
               models=[dict(model=str(e1), parameters=dict(weight=[0.0, 1.0])), dict(model=str(e2), parameters=dict(weight=0.5))],
               output={'max_shard_size': '20KB'})
    out = run_merge(cfg, tmp_path/'out', progress=False)
    merged, t = AutoModelForCausalLM.from_pretrained(out).state_dict(), _t(B)
    for k in B: _close(merged[k], B[k] + 0.8 * (t[k] * (E1[k] - B[k]) + 0.5 * (E2[k] - B[k])))
    idx = json.loads((out/'model.safetensors.index.json').read_text())
    assert set(idx['weight_map']) == set(B) and all((out/f).exists() for f in set(idx['weight_map'].values()))
    assert (out/'generation_config.json').exists() and AutoTokenizer.from_pretrained(out).vocab_size == V
    assert oct((out/sorted(idx['weight_map'].values())[0]).stat().st_mode & 0o777) == oct(0o666 & ~_umask())

def _umask():
    m = os.umask(0o022); os.umask(m); return m

def _naive_ties(pre, taus, w, d, lam=1.0, normalize=True):
    "mergekit's TIES by the textbook steps: keep the ⌊d·n⌋ largest |τ|, weight, elect sign, disjoint weighted mean."
    kept = []
    for tau, di, wi in zip(taus, d, w):
        k = int(di * tau.numel()) if di < 1 else tau.numel()
        thr = tau.abs().flatten().sort(descending=True).values[k - 1]
        kept.append(wi * tau * (tau.abs() >= thr))
    s = torch.stack(kept); sign = torch.where(s.sum(0) >= 0, 1.0, -1.0)
    mask = (s.sign() == sign).float()
    den = (torch.tensor(w).view(-1, *[1] * pre.dim()) * mask).sum(0); den[den == 0] = 1
    mixed = (s * mask).sum(0)
    return pre + lam * (mixed / den if normalize else mixed)

def test_mergekit_example_ties_yml_qwen2(tmp_path):
    "mergekit's examples/ties.yml (gradients, a filter, normalize, int8_mask, dtype float16), model ids pointed at tiny Qwen2s."
    from transformers import AutoModelForCausalLM
    (b, e1, e2, e3), (B, *E) = _zoo(tmp_path, lambda: _llama(cls='qwen2'), n=3)
    text = (Path(__file__).parent/'mergekit_configs'/'examples_ties.yml').read_text()   # as mergekit ships it
    for hub_id, d in [('TheBloke/Llama-2-13B-fp16', b), ('psmathur/orca_mini_v3_13b', e1), ('garage-bAInd/Platypus2-13B', e2),
                      ('WizardLM/WizardMath-13B-V1.0', e3)]: text = text.replace(hub_id, str(d))
    (tmp_path/'ties.yml').write_text(text)
    assert main(['merge', str(tmp_path/'ties.yml'), '-o', str(tmp_path/'out'), '--no-progress']) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path/'out', dtype=torch.float16).state_dict()
    t = _t(B)
    for k in B:
        if B[k].numel() < 2: continue
        d = [np.interp(t[k], np.linspace(0, 1, 3), [1, 0.7, 0.1]), 0.5, 0.33]
        w = [1.0, float(np.interp(t[k], np.linspace(0, 1, 4), [0, 0.3, 0.7, 1])), 0.5 if 'mlp' in k else 0.0]
        assert merged[k].dtype == torch.float16
        _close(merged[k], _naive_ties(B[k], [x[k] - B[k] for x in E], w, d), atol=2e-3)

def test_gpt2_linear_tied_embeddings(tmp_path):
    "GPT-2 stores no lm_head (tied): linear Σ wᵢθᵢ / Σ wᵢ, loads, and its output embedding is the merged input one."
    from transformers import AutoModelForCausalLM
    (b, e1), (B, E1) = _zoo(tmp_path, _gpt2, n=1, shard='5GB')
    assert 'lm_head.weight' not in load_file(b/'model.safetensors')
    out = run_merge(dict(merge_method='linear', models=[dict(model=str(b), parameters=dict(weight=1.0)),
                                                         dict(model=str(e1), parameters=dict(weight=3.0))]), tmp_path/'out', progress=False)
    m = AutoModelForCausalLM.from_pretrained(out)
    sd = m.state_dict()
    for k in load_file(b/'model.safetensors'): _close(sd[k], (B[k] + 3 * E1[k]) / 4)
    assert torch.equal(m.lm_head.weight, m.transformer.wte.weight)

def test_llava_this_projects_schema(tmp_path):
    "LLaVA with this project's schema (method: task_arithmetic, per-model scaling_factor): the whole model merged, loads."
    from transformers import LlavaForConditionalGeneration
    (b, e1, e2), (B, E1, E2) = _zoo(tmp_path, _llava, tok=False)
    cfg = dict(method='task_arithmetic', base_model=str(b), models=[dict(model=str(e1), name='a', parameters=dict(scaling_factor=0.7)),
                                                                    dict(model=str(e2), name='b', parameters=dict(scaling_factor=0.2))])
    out = run_merge(cfg, tmp_path/'out', progress=False)
    sd = LlavaForConditionalGeneration.from_pretrained(out).state_dict()
    for k in B: _close(sd[k], B[k] + 0.7 * (E1[k] - B[k]) + 0.2 * (E2[k] - B[k]))

def test_clip_slerp_and_model_stock_llama(tmp_path):
    "CLIP (whole model, integer buffers carried) by mergekit's slerp; Llamas by model_stock: both against their formulas."
    import math
    from transformers import CLIPModel, AutoModelForCausalLM
    (b, e1), (B, E1) = _zoo(tmp_path/'clip', _clip, n=1, tok=False, shard='5GB')
    out = run_merge(dict(merge_method='slerp', base_model=str(b), models=[dict(model=str(b)), dict(model=str(e1))],
                         parameters=dict(t=0.3)), tmp_path/'clip_out', progress=False)
    sd, st = CLIPModel.from_pretrained(out).state_dict(), load_file(b/'model.safetensors')
    for k in st:
        if not st[k].is_floating_point(): assert torch.equal(sd[k], st[k]); continue
        v0, v1 = B[k].double().flatten(), E1[k].double().flatten()
        c = float(v0 @ v1 / (v0.norm() * v1.norm())) if v0.norm() * v1.norm() > 0 else 1.0
        if abs(c) > 0.9995: want = 0.7 * v0 + 0.3 * v1
        else: om = math.acos(c); want = (math.sin(0.7 * om) * v0 + math.sin(0.3 * om) * v1) / math.sin(om)
        _close(sd[k].flatten(), want.float(), atol=1e-5)
    (b, e1, e2), (B, E1, E2) = _zoo(tmp_path/'llama', _llama)
    out = run_merge(dict(merge_method='model_stock', base_model=str(b), models=[dict(model=str(e1)), dict(model=str(e2))]),
                    tmp_path/'ms_out', progress=False)
    sd = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for k in B:
        t1, t2 = (E1[k] - B[k]).flatten().double(), (E2[k] - B[k]).flatten().double()
        c = float(t1 @ t2 / (t1.norm() * t2.norm())); r = 2 * c / (1 + c)
        _close(sd[k], r * (E1[k] + E2[k]) / 2 + (1 - r) * B[k])

@pytest.mark.parametrize('method, normalize', [('dare_ties', False), ('della', True)])
def test_random_ties_reproducible(tmp_path, method, normalize):
    "dare_ties, della: the same seed gives the same merge, another seed another; density 1 is TIES without trimming (della normalises)."
    (b, e1, e2), (B, E1, E2) = _zoo(tmp_path, _llama, shard='5GB')
    def run(out, seed, density):
        return load_file(run_merge(dict(merge_method=method, base_model=str(b), seed=seed,
                                        models=[dict(model=str(e), parameters=dict(weight=1.0, density=density)) for e in (e1, e2)]),
                                   tmp_path/out, progress=False)/'model.safetensors')
    a, a2, c = run('a', 0, 0.5), run('a2', 0, 0.5), run('c', 1, 0.5)
    k = 'model.layers.0.mlp.up_proj.weight'
    assert torch.equal(a[k], a2[k]) and not torch.equal(a[k], c[k])
    full = run('full', 0, 1.0)
    _close(full[k], _naive_ties(B[k], [E1[k] - B[k], E2[k] - B[k]], [1.0, 1.0], [1, 1], normalize=normalize))

def _nothing_written(out:Path):
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f'.{out.name}.')]

@pytest.mark.parametrize('change, message', [
    (dict(merge_method='frankenmerge'), "unknown method 'frankenmerge'"),
    (dict(merge_method='passthrough'), "passthrough copies layers, so it needs slices: (sources with a layer_range)"),
    (dict(merge_method='nearswap'), "this project lacks it"),
    (dict(slices=[{"sources": []}]), "models and slices: give one of them"),
    (dict(modules={'text': {}}), "modules: mergekit's modules (one set of slices per part of a multi-part model) are not supported"),
    (dict(parameters={'densty': 0.5}), "['densty'] not parameter(s) of mergekit's ties"),
    (dict(tokenizer_source='union'), "'union'"),
])
def test_bad_mergekit_configs(tmp_path, change, message):
    (b, e1), _ = _zoo(tmp_path, _llama, n=1, tok=False)
    cfg = {**dict(merge_method='ties', base_model=str(b), models=[dict(model=str(e1), parameters=dict(weight=1, density=0.5))]), **change}
    with pytest.raises(FusionError, match=None) as e: run_merge(cfg, tmp_path/'out', progress=False)
    assert message in str(e.value), str(e.value)
    _nothing_written(tmp_path/'out')

def test_vocab_mismatch_refused_unless_tokenizer_source_base(tmp_path):
    from transformers import AutoModelForCausalLM
    b, e = tmp_path/'base', tmp_path/'big'
    B = _save(_llama(), b, tok=False); E = _save(_llama(vocab=V + 8), e, seed=3, tok=False)
    cfg = dict(merge_method='task_arithmetic', base_model=str(b), models=[dict(model=str(e), parameters=dict(weight=1.0))])
    with pytest.raises(IncompatibleModelsError, match=r"'model.embed_tokens.weight' has 72 rows, the base's 'model.embed_tokens.weight' has 64"):
        run_merge(cfg, tmp_path/'out', progress=False)
    _nothing_written(tmp_path/'out')
    with pytest.raises(FusionError, match=r"tokenizer_source: .* has a vocabulary of 72 tokens, the merged model's embeddings 64 rows"):
        run_merge({**cfg, 'tokenizer_source': str(e)}, tmp_path/'out', progress=False)
    sd = AutoModelForCausalLM.from_pretrained(run_merge({**cfg, 'tokenizer_source': 'base'}, tmp_path/'out', progress=False)).state_dict()
    _close(sd['model.embed_tokens.weight'], E['model.embed_tokens.weight'][:V])   # θ₀ + (θ₁[:64] − θ₀)
    _close(sd['lm_head.weight'], E['lm_head.weight'][:V])

def test_missing_shard_and_bad_index_refused(tmp_path):
    (b, e1), _ = _zoo(tmp_path, _llama, n=1, tok=False)
    cfg = dict(merge_method='task_arithmetic', base_model=str(b), models=[dict(model=str(e1), parameters=dict(weight=1.0))])
    idx = json.loads((e1/'model.safetensors.index.json').read_text())
    shard = sorted(set(idx['weight_map'].values()))[-1]
    (e1/shard).rename(tmp_path/'away')
    with pytest.raises(FusionError, match=f"lists shard.*{shard}"): run_merge(cfg, tmp_path/'out', progress=False)
    (tmp_path/'away').rename(e1/shard)
    idx['weight_map'][next(iter(idx['weight_map']))] = 'model-00009-of-00009.safetensors'
    (e1/'model.safetensors.index.json').write_text(json.dumps(idx))
    with pytest.raises(FusionError, match="model-00009-of-00009.safetensors"): run_merge(cfg, tmp_path/'out', progress=False)
    _nothing_written(tmp_path/'out')

def test_user_files_kept_overflow_and_interrupt_write_nothing(tmp_path, monkeypatch):
    (b, e1), _ = _zoo(tmp_path, _llama, n=1, tok=False)
    cfg = dict(merge_method='task_arithmetic', base_model=str(b), models=[dict(model=str(e1), parameters=dict(weight=1.0))],
               output={'max_shard_size': '20KB'})
    mine = tmp_path/'mine'; mine.mkdir(); (mine/'notes.txt').write_text('x')
    with pytest.raises(FusionError, match='notes.txt'): run_merge(cfg, mine, progress=False)
    assert (mine/'notes.txt').read_text() == 'x'
    big = {**cfg, 'parameters': {'lambda': 1e6}, 'out_dtype': 'float16'}
    with pytest.raises(NonFiniteError, match=r"tensor '.*' is not finite in torch.float16"): run_merge(big, tmp_path/'out', progress=False)
    _nothing_written(tmp_path/'out')
    with pytest.raises(FusionError, match=r"1e\+39"): run_merge({**cfg, 'parameters': {'lambda': 1e39}}, tmp_path/'out', progress=False)
    import fusion_nb.reproduce.hf_merge as hm
    calls = []
    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2: raise KeyboardInterrupt
        return real(*a, **k)
    import safetensors.torch as st; real = st.save_file
    monkeypatch.setattr(st, 'save_file', interrupted)
    with pytest.raises(KeyboardInterrupt): run_merge(cfg, tmp_path/'out', progress=False)
    _nothing_written(tmp_path/'out')

def test_cli_bad_config_rc2(tmp_path, capsys):
    (tmp_path/'c.yaml').write_text(yaml.safe_dump(dict(merge_method='arcee_fusion', models=['./x'])))
    assert main(['merge', str(tmp_path/'c.yaml'), '-o', str(tmp_path/'out')]) == 2
    assert "'arcee_fusion' is mergekit's, and this project lacks it" in capsys.readouterr().err

# mergekit names newly run from a mergekit config: (global parameters, per-model parameters, t → the registered method's
# hyperparameters at layer position t). Each has a gradient or a per-model value so that per-tensor resolution is exercised.
NEW = {'breadcrumbs': ({'gamma': 0.05, 'lambda': 0.9}, [dict(weight=1.0, density=[0.5, 0.9]), dict(weight=0.5, density=0.7)],
                       lambda t: dict(weight=[1.0, 0.5], density=[0.5 + 0.4 * t, 0.7], gamma=0.05, scaling_factor=0.9)),
       'della_linear': ({'epsilon': 0.1}, [dict(weight=[0.2, 1.0], density=0.6), dict(weight=0.5, density=0.6)],
                        lambda t: dict(weight=[0.2 + 0.8 * t, 0.5], density=0.6, epsilon=0.1, seed=0)),
       'sce': ({'select_topk': [0.5, 1.0]}, [{}, {}], lambda t: dict(select_topk=0.5 + 0.5 * t)),
       'nuslerp': ({}, [dict(weight=[1.0, 0.0]), dict(weight=1.0)], lambda t: dict(weight=[1.0 - t, 1.0])),
       'multislerp': ({}, [dict(weight=1.0), dict(weight=[0.5, 2.0])], lambda t: dict(weight=[1.0, 0.5 + 1.5 * t])),
       'karcher': ({'max_iter': 5}, [{}, {}], lambda t: dict(max_iter=5))}

@pytest.mark.parametrize('name', list(NEW))
def test_new_mergekit_names_run_the_registered_method(tmp_path, name):
    "A mergekit config with `merge_method: name` gives, tensor by tensor, the registered method run on the state dicts with that tensor's values."
    from fusion_nb.merge import MERGE_METHODS
    glob, per, hp = NEW[name]
    (b, e1, e2), (B, E1, E2) = _zoo(tmp_path, _llama, shard='5GB')
    cfg = dict(merge_method=name, models=[dict(model=str(e), parameters=p) for e, p in zip((e1, e2), per)], parameters=glob)
    if name != 'karcher': cfg['base_model'] = str(b)
    got, t = load_file(run_merge(cfg, tmp_path/'out', progress=False)/'model.safetensors'), _t(B)
    floats = [k for k in B if B[k].is_floating_point()]
    for tv in sorted({t[k] for k in floats}):
        want = MERGE_METHODS[name](None if name == 'karcher' else B, {'e1': E1, 'e2': E2}, **hp(tv), progress=False)
        for k in floats:
            if t[k] == tv: _close(got[k], want[k])

def test_merge_command_imports_no_model_classes(tmp_path):
    """`fusion-nb merge` of a language model runs without importing transformers' model classes (seconds on every run:
    the CLI, every registered method and the HF merge path import them only where a CLIP model is built); the WE-MoE
    class they would subclass is still there on first use, for `from … import` and for pickle."""
    import pickle, subprocess, sys
    code = ("import sys, fusion_nb.reproduce.cli, fusion_nb.reproduce.merge_config, fusion_nb.merge\n"
            "print(sorted(m for m in sys.modules if m == 'transformers.modeling_utils' or m.startswith('transformers.models.')))")
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env={**os.environ, 'HF_HUB_OFFLINE': '1'})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == '[]'
    from transformers import CLIPVisionModel
    from fusion_nb.methods.we_moe import WEMoEVisionModel, we_moe_class
    assert WEMoEVisionModel is we_moe_class() and issubclass(WEMoEVisionModel, CLIPVisionModel)
    assert pickle.loads(pickle.dumps(WEMoEVisionModel)) is WEMoEVisionModel
    with pytest.raises(ImportError, match='WEMoEVisionModels'):   # any other name is still an error
        from fusion_nb.methods.we_moe import WEMoEVisionModels   # noqa: F401
